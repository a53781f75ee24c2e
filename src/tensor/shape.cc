#include "pipeflow/tensor/shape.h"

#include <fmt/format.h>

#include "pipeflow/core/error.h"

namespace pipeflow {

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  if (dims.size() > kMaxRank) fail("internal: a shape has at most {} dimensions, got {}", kMaxRank, dims.size());
  for (const std::int64_t dim : dims) {
    if (dim < 0) fail("internal: negative dimension {} in a shape", dim);
    dims_[static_cast<std::size_t>(rank_++)] = dim;
  }
}

std::int64_t Shape::numel() const {
  std::int64_t product = 1;
  for (int axis = 0; axis < rank_; ++axis) product *= (*this)[axis];
  return product;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int axis = 0; axis < rank_; ++axis) {
    if ((*this)[axis] != other[axis]) return false;
  }
  return true;
}

std::string Shape::to_string() const {
  std::string text = "[";
  for (int axis = 0; axis < rank_; ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string((*this)[axis]);
  }
  return text + "]";
}

}  // namespace pipeflow
