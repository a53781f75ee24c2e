#include "pipeflow/nn/kv_cache.h"

namespace pipeflow::nn {

template <class T>
BasicKvCache<T>::BasicKvCache(int blocks, int sequences, int context, int width, const std::string& name)
    : blocks_(blocks),
      context_(context),
      width_(width),
      lengths_(static_cast<std::size_t>(sequences), 0),
      memory_(name + " kv cache"),
      data_(Shape{2 * static_cast<std::int64_t>(blocks), sequences, context, width}, {nullptr, &memory_}) {}

template <class T>
std::int64_t BasicKvCache<T>::offset(int block, int which, int sequence) const {
  return ((static_cast<std::int64_t>(block) * 2 + which) * sequences() + sequence) * context_ * width_;
}

template class BasicKvCache<float>;
template class BasicKvCache<double>;

}  // namespace pipeflow::nn
