#include "pipeflow/nn/byte_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/random.h"

namespace pipeflow::nn {
namespace {

std::string read_all(const std::vector<std::filesystem::path>& files) {
  if (files.empty()) fail("a text dataset needs at least one file");
  std::string text;
  for (const auto& file : files) {
    text += read_file(file, ByteDataset::kMaxCorpusBytes - text.size(), "training corpus (all data files together)");
  }
  return text;
}

std::string describe(const std::vector<std::filesystem::path>& files) {
  if (files.size() == 1) return files.front().string();
  return fmt::format("{} files in {}", files.size(), files.front().parent_path().string());
}

}  // namespace

ByteDataset::ByteDataset(const std::vector<std::filesystem::path>& files, DatasetOptions options)
    : ByteDataset(read_all(files), describe(files), options) {}

ByteDataset::ByteDataset(std::string text, std::string source, DatasetOptions options)
    : text_(std::move(text)), source_(std::move(source)), options_(options) {
  if (options_.seq_length < 1) fail("data sequence length {} must be >= 1", options_.seq_length);
  if (options_.validation_fraction < 0 || options_.validation_fraction >= 1) {
    fail("data validation_fraction = {}: must lie in [0, 1)", options_.validation_fraction);
  }
  const auto total = static_cast<std::int64_t>(text_.size());
  train_bytes_ = total - static_cast<std::int64_t>(std::llround(options_.validation_fraction * total));
  check_split(Split::kTrain, "training");
  if (options_.validation_fraction > 0) check_split(Split::kValidation, "validation");
}

void ByteDataset::check_split(Split split, const char* name) const {
  const std::int64_t needed = options_.seq_length + 1;
  if (bytes(split) < needed) {
    fail("{}: the {} split has {} bytes, fewer than one sample of T + 1 = {}: use more text or a shorter context",
         source_, name, bytes(split), needed);
  }
}

std::vector<std::filesystem::path> ByteDataset::default_corpus(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const auto& path = entry.path();
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    if (path.extension() == ".dat" || path.extension() == ".u8") continue;
    files.push_back(path);
  }
  if (files.empty()) {
    fail("no corpus in {}: install Debian's fortunes package (make deps does) or name text files for the data",
         directory.string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::int64_t ByteDataset::bytes(Split split) const {
  return split == Split::kTrain ? train_bytes_ : static_cast<std::int64_t>(text_.size()) - train_bytes_;
}

void ByteDataset::sample(Split split, std::int64_t step, std::int64_t index, std::span<std::int32_t> tokens) const {
  const std::int64_t length = options_.seq_length + 1;
  if (static_cast<std::int64_t>(tokens.size()) != length) {
    fail("internal: a sample has {} tokens, given room for {}", length, tokens.size());
  }
  if (split == Split::kValidation && options_.validation_fraction == 0) {
    fail("{}: no validation split (validation_fraction is 0)", source_);
  }
  std::uint64_t seed = derive_seed(options_.seed, split == Split::kTrain ? 0 : 1);
  seed = derive_seed(derive_seed(seed, static_cast<std::uint64_t>(step)), static_cast<std::uint64_t>(index));
  Rng rng(seed);
  const std::int64_t begin = (split == Split::kTrain ? 0 : train_bytes_) +
                             static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(bytes(split) - length + 1)));
  for (std::int64_t i = 0; i < length; ++i) tokens[i] = static_cast<unsigned char>(text_[begin + i]);
}

Batch ByteDataset::batch(Split split, std::int64_t step, std::int64_t first, int count, Allocator allocator) const {
  const int t = options_.seq_length;
  Batch batch{IntTensor::uninitialized({count, t}, allocator), IntTensor::uninitialized({count, t}, allocator)};
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(t) + 1);
  for (int row = 0; row < count; ++row) {
    sample(split, step, first + row, tokens);
    std::copy(tokens.begin(), tokens.end() - 1, batch.inputs.data() + static_cast<std::int64_t>(row) * t);
    std::copy(tokens.begin() + 1, tokens.end(), batch.targets.data() + static_cast<std::int64_t>(row) * t);
  }
  return batch;
}

void ByteDataset::check_vocabulary(int vocab_size) const {
  if (vocab_size >= 256) return;
  const auto outside = std::find_if(text_.begin(), text_.end(),
                                    [&](char c) { return static_cast<unsigned char>(c) >= vocab_size; });
  if (outside == text_.end()) return;
  fail("model vocab_size = {} but the training text ({}) holds byte {} at offset {}: pipeflow trains on bytes, each "
       "a token; use a model of vocab_size 256 or more, or text whose bytes stay below {}",
       vocab_size, source_, static_cast<int>(static_cast<unsigned char>(*outside)), outside - text_.begin(),
       vocab_size);
}

}  // namespace pipeflow::nn
