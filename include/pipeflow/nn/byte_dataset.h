#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "pipeflow/nn/batch.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

enum class Split { kTrain, kValidation };

struct DatasetOptions {
  int seq_length = 64;  // T: a sample is T + 1 consecutive bytes
  std::uint64_t seed = 0;
  // The last fraction of the text is the validation split, the rest training.
  double validation_fraction = 0.1;
};

// Byte-level language-model data: the bytes of one or more text files,
// concatenated, each byte a token (vocabulary 256).
//
// Sampling is a pure function of (seed, split, step, index): sample i of
// optimizer step n is T + 1 consecutive bytes at an offset drawn uniformly
// from the split by a generator seeded with those four numbers. So a step's
// global batch is the same samples in the same order however it is later cut
// into micro-batches and data-parallel replicas: replica d's micro-batch j of
// b samples (m per replica) is samples (d·m + j)·b … (d·m + j + 1)·b − 1.
//
// Thread safety: immutable after construction; any thread may sample.
class ByteDataset {
 public:
  // The files together hold at most this many bytes: the whole corpus is
  // held in memory, and 64 MiB (23 times the 2.8 MB fortunes corpus) is more
  // bytes than a CPU run trains on in hours.
  static constexpr std::size_t kMaxCorpusBytes = std::size_t{64} << 20;

  // Error naming the file when one cannot be read or the corpus passes
  // kMaxCorpusBytes, and when a split is too short for one sample.
  ByteDataset(const std::vector<std::filesystem::path>& files, DatasetOptions options);
  // From text in memory; `source` names it in messages.
  ByteDataset(std::string text, std::string source, DatasetOptions options);

  // The default corpus: the plain-text files of Debian's fortunes package
  // (the .dat indexes and .u8 links left out, subdirectories too), by name.
  // Error saying to install the package when there are none.
  static std::vector<std::filesystem::path> default_corpus(
      const std::filesystem::path& directory = "/usr/share/games/fortunes");

  std::int64_t bytes(Split split) const;
  const DatasetOptions& options() const { return options_; }
  const std::string& source() const { return source_; }
  // Error unless every byte of the text is a token of a vocabulary of
  // vocab_size (a model of fewer than 256 tokens trains on bytes only if
  // the text stays below it): names the first byte outside, where it is,
  // and the fix.
  void check_vocabulary(int vocab_size) const;

  // Writes sample (step, index) of `split`: T + 1 tokens.
  void sample(Split split, std::int64_t step, std::int64_t index, std::span<std::int32_t> tokens) const;
  // Samples first … first + count − 1 of step `step` as inputs and targets [count, T].
  Batch batch(Split split, std::int64_t step, std::int64_t first, int count, Allocator allocator = {}) const;

 private:
  void check_split(Split split, const char* name) const;

  std::string text_;
  std::string source_;
  DatasetOptions options_;
  std::int64_t train_bytes_ = 0;
};

}  // namespace pipeflow::nn
