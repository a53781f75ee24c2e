#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeflow/tensor/memory_account.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// Which rows of an inference batch belong to which cached sequence: the
// batch is [1, R, ·], R = Σ counts, and sequence first + i owns the next
// counts[i] rows, its positions length(first + i) onwards. A prefill gives a
// sequence its whole prompt; a decode step one row each.
struct SequenceRows {
  int first = 0;
  std::vector<int> counts;

  int total() const {
    int rows = 0;
    for (const int count : counts) rows += count;
    return rows;
  }
};

// The keys and values one pipeline stage's blocks computed for every position
// of the sequences it decodes, so that a new token attends to them instead of
// recomputing the prefix. Allocated once, whole, for `context` positions of
// `sequences` sequences (nothing grows while decoding), and charged to its
// own account ("<name> kv cache"): 2 · blocks · W · sizeof(T) · context ·
// sequences bytes for a width W = key/value heads · head size (C for GPT-2's
// multi-head attention, less with a Llama's grouped-query attention;
// model_states.h's kv_cache_bytes).
//
// Layout [blocks, 2, sequences, context, W]: the keys (then the values) of
// one block for one sequence are a dense [context, W] matrix whose rows are
// positions and whose columns are the key/value heads side by side, as in
// the packed qkv of the forward.
//
// Thread safety: used by one thread at a time (the stage's).
template <class T>
class BasicKvCache {
 public:
  BasicKvCache(int blocks, int sequences, int context, int width, const std::string& name);
  BasicKvCache(const BasicKvCache&) = delete;
  BasicKvCache& operator=(const BasicKvCache&) = delete;

  int blocks() const { return blocks_; }
  int sequences() const { return static_cast<int>(lengths_.size()); }
  int context() const { return context_; }
  // Positions of `sequence` already held (the next one written goes there).
  int length(int sequence) const { return lengths_.at(static_cast<std::size_t>(sequence)); }
  // After every block has written `positions` more rows of `sequence`.
  void advance(int sequence, int positions) { lengths_.at(static_cast<std::size_t>(sequence)) += positions; }

  // [context, C] of one block for one sequence.
  T* keys(int block, int sequence) { return data_.data() + offset(block, 0, sequence); }
  T* values(int block, int sequence) { return data_.data() + offset(block, 1, sequence); }

  const MemoryAccount& memory() const { return memory_; }

 private:
  std::int64_t offset(int block, int which, int sequence) const;

  int blocks_;
  int context_;
  int width_;
  std::vector<int> lengths_;
  MemoryAccount memory_;
  BasicTensor<T> data_;
};

using KvCache = BasicKvCache<float>;

extern template class BasicKvCache<float>;
extern template class BasicKvCache<double>;

}  // namespace pipeflow::nn
