#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace pipeflow {

// The dimensions of a tensor, outermost first (row-major), at most four:
// [B, T, C] activations, [B, NH, T, T] attention probabilities. Stored inline
// so that making a tensor never allocates for its shape.
class Shape {
 public:
  static constexpr int kMaxRank = 4;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);

  int rank() const { return rank_; }
  std::int64_t operator[](int axis) const { return dims_[static_cast<std::size_t>(axis)]; }
  // The product of the dimensions; 1 for rank 0.
  std::int64_t numel() const;

  bool operator==(const Shape& other) const;
  // "[2, 3, 4]".
  std::string to_string() const;

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace pipeflow
