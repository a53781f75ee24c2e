#pragma once

#include <fmt/format.h>

#include <compare>
#include <cstddef>
#include <functional>

namespace pipeflow {

// An integer id that does not mix with ids of another kind: a StageId cannot be
// passed where a RankId is expected. Construction is explicit; value() reads it.
template <class Tag>
class StrongId {
 public:
  constexpr StrongId() = default;
  constexpr explicit StrongId(int value) : value_(value) {}

  constexpr int value() const { return value_; }
  constexpr auto operator<=>(const StrongId&) const = default;

 private:
  int value_ = 0;
};

// A (virtual) pipeline stage: a contiguous chunk of the model. With v chunks
// per rank there are v * ranks stages.
using StageId = StrongId<struct StageIdTag>;
// A micro-batch within one optimizer step.
using MicrobatchId = StrongId<struct MicrobatchIdTag>;
// A pipeline rank: one device (a thread or an MPI process).
using RankId = StrongId<struct RankIdTag>;

}  // namespace pipeflow

template <class Tag>
struct std::hash<pipeflow::StrongId<Tag>> {
  std::size_t operator()(pipeflow::StrongId<Tag> id) const noexcept {
    return std::hash<int>{}(id.value());
  }
};

template <class Tag>
struct fmt::formatter<pipeflow::StrongId<Tag>> : fmt::formatter<int> {
  auto format(pipeflow::StrongId<Tag> id, fmt::format_context& ctx) const {
    return fmt::formatter<int>::format(id.value(), ctx);
  }
};
