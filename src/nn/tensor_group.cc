#include "pipeflow/nn/tensor_group.h"

#include <algorithm>
#include <vector>

namespace pipeflow::nn {

void gather_sequence(TensorGroup& group, const float* part, float* whole, int b, int ts, int c,
                     std::string_view what) {
  const int members = group.size();
  const std::size_t block = static_cast<std::size_t>(ts) * static_cast<std::size_t>(c);  // one sequence's positions
  const std::size_t n = static_cast<std::size_t>(b) * block;
  std::vector<float> by_member(n * static_cast<std::size_t>(members));  // [member][b][ts][c]
  group.all_gather({part, n}, by_member, what);
  for (int k = 0; k < members; ++k) {
    for (int seq = 0; seq < b; ++seq) {
      const float* from = by_member.data() + static_cast<std::size_t>(k) * n + static_cast<std::size_t>(seq) * block;
      std::copy_n(from, block, whole + (static_cast<std::size_t>(seq) * members + static_cast<std::size_t>(k)) * block);
    }
  }
}

void scatter_sequence(TensorGroup& group, float* whole, float* part, int b, int ts, int c, std::string_view what) {
  const int members = group.size();
  const std::size_t block = static_cast<std::size_t>(ts) * static_cast<std::size_t>(c);
  const std::size_t n = static_cast<std::size_t>(b) * block;
  std::vector<float> by_member(n * static_cast<std::size_t>(members));  // [member][b][ts][c]
  for (int k = 0; k < members; ++k) {
    for (int seq = 0; seq < b; ++seq) {
      std::copy_n(whole + (static_cast<std::size_t>(seq) * members + static_cast<std::size_t>(k)) * block, block,
                  by_member.data() + static_cast<std::size_t>(k) * n + static_cast<std::size_t>(seq) * block);
    }
  }
  group.reduce_scatter(by_member, {part, n}, what);
}

}  // namespace pipeflow::nn
