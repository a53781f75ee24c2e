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

void check_microbatch_shapes(const std::vector<int>& lengths, const std::vector<int>& images, int seq_length,
                             const ModelSpec& model, int microbatches, int sequence_parallel_ranks) {
  for (int length : lengths) {
    if (length < 1) {
      fail("variable_seq_lengths holds {}: every length must be >= 1 (tokens per sequence of a micro-batch)", length);
    }
    if (length > seq_length) {
      fail("variable_seq_lengths holds {} > seq_length {}: seq_length is the longest micro-batch's (what the buffers "
           "are sized for): raise seq_length to {} or shorten the lengths",
           length, seq_length, length);
    }
    check_sequence_parallel_split(length, sequence_parallel_ranks);
  }
  if (!images.empty() && !model.vision) {
    fail("variable_images = [{}]: {} has no vision tower: drop variable_images, or give a vision-language model",
         fmt::join(images, ", "), model.name);
  }
  if (!model.vision || (lengths.empty() && images.empty())) return;
  const int per_image = image_tokens(*model.vision);
  const auto at = [](const std::vector<int>& list, int i, int otherwise) {
    return list.empty() ? otherwise : list[static_cast<std::size_t>(i) % list.size()];
  };
  for (int i = 0; i < microbatches; ++i) {
    const int length = at(lengths, i, seq_length);
    const int count = at(images, i, model.vision->images);
    const std::int64_t tokens = static_cast<std::int64_t>(count) * per_image;
    if (tokens >= length) {
      fail("{} {} with {} image(s) of {} tokens: they leave no text (a length counts its image tokens); {} above "
           "{}{}",
           lengths.empty() ? "seq_length =" : "variable_seq_lengths holds", length, count, per_image,
           lengths.empty() ? "raise seq_length" : "give variable_seq_lengths lengths", tokens,
           images.empty() ? "" : ", or fewer variable_images");
    }
  }
}

}  // namespace pipeflow
