#include "pipeflow/schedule/grid.h"

#include <gtest/gtest.h>

#include "pipeflow/schedule/generators.h"

namespace pipeflow {
namespace {

TEST(Grid, ASmallScheduleIsDrawnCellByCell) {
  const Schedule schedule = make_gpipe(2, 2);
  EXPECT_EQ(grid_cells(schedule), 8u);
  EXPECT_EQ(render_grid(schedule),
            "step     0      1      2      3\n"
            "rank 0   0F0    0F1    0B0    0B1\n"
            "rank 1   1F0    1F1    1B0    1B1\n");
}

// A grid of 1024 x 2048 cells would be about 16 MB of text.
TEST(Grid, PastTheLimitTheGridIsSummarised) {
  const Schedule schedule = make_gpipe(1024, 1024);
  EXPECT_EQ(grid_cells(schedule), 1024u * 2048u);
  EXPECT_EQ(render_grid(schedule), "(the rank x step grid is not drawn: 2097152 cells, more than the limit of 1000000)\n");
}

}  // namespace
}  // namespace pipeflow
