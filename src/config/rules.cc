#include "pipeflow/config/rules.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <limits>

#include "pipeflow/core/error.h"

namespace pipeflow {

int checked_product(std::initializer_list<int> factors, std::string_view what, std::string_view unit) {
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  std::int64_t product = 1;
  for (int factor : factors) {
    if (factor < 1) fail("internal: {} has a factor {} < 1", what, factor);
    product *= factor;  // both sides <= kMax, so this fits in 64 bits
    if (product > kMax) {
      fail("{} = {}: more than {} {}: use smaller sizes", what, fmt::join(factors, " × "), kMax, unit);
    }
  }
  return static_cast<int>(product);
}

std::string nearest_multiples(int value, int unit) {
  const std::int64_t below = value / unit * static_cast<std::int64_t>(unit);
  if (below == 0) return fmt::format("{}", unit);
  return fmt::format("{} or {}", below, below + unit);
}

void check_sequence_parallel_split(int seq_length, int tensor_parallel) {
  if (tensor_parallel <= 1 || seq_length % tensor_parallel == 0) return;
  fail("seq_length {} is not a multiple of tensor_parallel {}: Megatron's sequence parallelism splits the sequence "
       "over the tensor-parallel ranks: use seq_length {}, another tensor_parallel, or drop sequence_parallel",
       seq_length, tensor_parallel, nearest_multiples(seq_length, tensor_parallel));
}

void check_device_count(int devices, int tensor_parallel, int stages, int data_parallel) {
  const int product = checked_product({tensor_parallel, stages, data_parallel},
                                      "tensor_parallel × pipeline stages × data_parallel", "devices");
  if (devices == product) return;
  const int model_parallel = tensor_parallel * stages;
  const std::string fix = devices % model_parallel == 0
                              ? fmt::format("use data_parallel {} or devices {}", devices / model_parallel, product)
                              : fmt::format("use devices {}", product);
  fail("tensor_parallel × pipeline stages × data_parallel = {} × {} × {} = {} devices, not {}: {}", tensor_parallel,
       stages, data_parallel, product, devices, fix);
}

}  // namespace pipeflow
