#include "pipeflow/schedule/grid.h"

#include <algorithm>
#include <set>

namespace pipeflow {

std::size_t grid_cells(const Schedule& schedule) {
  std::size_t steps = 0;
  for (int r = 0; r < schedule.num_ranks(); ++r) steps = std::max(steps, schedule.actions(RankId(r)).size());
  return steps * static_cast<std::size_t>(schedule.num_ranks());
}

std::string render_grid(const Schedule& schedule, const std::vector<GridMark>& marks) {
  if (grid_cells(schedule) > kMaxGridCells) {
    return fmt::format("(the rank x step grid is not drawn: {} cells, more than the limit of {})\n",
                       grid_cells(schedule), kMaxGridCells);
  }
  std::size_t steps = 0;
  std::size_t width = 4;
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    const auto& actions = schedule.actions(RankId(r));
    steps = std::max(steps, actions.size());
    for (const Action& a : actions) width = std::max(width, to_string(a).size());
  }
  width += 2;  // room for the *marker*
  const std::string rank_label = fmt::format("rank {}", schedule.num_ranks() - 1);
  const std::size_t label_width = rank_label.size() + 2;

  std::string out = fmt::format("{:<{}}", "step", label_width);
  for (std::size_t i = 0; i < steps; ++i) out += fmt::format(" {:<{}}", i, width);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    std::set<std::size_t> marked;
    std::set<int> labels;
    for (const GridMark& m : marks) {
      if (m.rank.value() != r) continue;
      marked.insert(m.index);
      if (m.label > 0) labels.insert(m.label);
    }
    std::string row = fmt::format("{:<{}}", fmt::format("rank {}", r), label_width);
    const auto& actions = schedule.actions(RankId(r));
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const std::string cell = to_string(actions[i]);
      row += marked.count(i) ? fmt::format("*{:<{}}", cell + "*", width) : fmt::format(" {:<{}}", cell, width);
    }
    while (!row.empty() && row.back() == ' ') row.pop_back();
    if (!marked.empty()) {
      row += "   <-- ERROR HERE";
      for (int label : labels) row += fmt::format(" [{}]", label);
    }
    out += row + '\n';
  }
  return out;
}

}  // namespace pipeflow
