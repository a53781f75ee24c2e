#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// A cell of the grid to mark: the action at `index` of `rank`'s list.
struct GridMark {
  RankId rank;
  std::size_t index = 0;
  int label = 0;  // shown at the end of the row as [label]; 0 for none
};

// The schedule as a terminal grid: a row per rank, a column per position in
// the rank's list (PyTorch's validator grid, transposed). Marked cells are
// shown as *2F3* and their rows end with "<-- ERROR HERE" and the labels.
//
//   step     0    1    2    3
//   rank 0   0F0  0F1  0B0  0B1
//   rank 1   1F0 *1B1* 1F1  1B0   <-- ERROR HERE [1]
//
// Past kMaxGridCells cells (ranks x steps; about 8 MB of text) no terminal
// shows the grid, so it is replaced by one line saying so.
inline constexpr std::size_t kMaxGridCells = 1'000'000;
std::string render_grid(const Schedule& schedule, const std::vector<GridMark>& marks = {});

// The cells render_grid would draw: ranks x the longest rank's actions.
std::size_t grid_cells(const Schedule& schedule);

}  // namespace pipeflow
