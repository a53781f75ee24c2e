#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// The safetensors format (Hugging Face): an 8-byte little-endian header
// length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
//    "__metadata__": {"<key>": "<string>", ...}}
// (padded with spaces to a multiple of 8 bytes), then the tensors' raw
// little-endian bytes, offsets relative to the start of that data section.
// pipeflow reads and writes F32 and I32 tensors of rank <= 4, and reads BF16
// and F16 ones (Hugging Face's checkpoints are mostly BF16) as floats.
enum class Dtype { kF32, kI32, kBF16, kF16 };

struct SafetensorsEntry {
  Dtype dtype = Dtype::kF32;
  Shape shape;
  std::size_t begin = 0;  // byte offsets in the data section
  std::size_t end = 0;
};

// A whole safetensors file in memory, validated on parse: every error names
// the file and what is wrong (truncated, header not JSON, a tensor whose
// bytes do not match its shape, gaps or overlaps between tensors, a tensor
// whose bytes do not match the CRC32 that __metadata__ "crc32.<name>" holds
// for it, ...). Files without those keys (other writers) load unchecked.
//
// Thread safety: immutable after construction; const methods may run concurrently.
class SafetensorsWriter;

class SafetensorsFile {
 public:
  static SafetensorsFile read(const std::filesystem::path& path);
  // `source` names the bytes in errors (a path).
  static SafetensorsFile parse(std::string bytes, std::string source);
  // The header's __metadata__ alone, without reading the tensors' data (a
  // checkpoint's model shape before it is loaded): no tensors.
  static SafetensorsFile read_metadata(const std::filesystem::path& path);
  // Every tensor and __metadata__ key of `parts` in one file (the tensors in
  // part order; a name two parts hold: the first part's), `source` naming it.
  static SafetensorsFile merge(const std::vector<SafetensorsFile>& parts, std::string source);
  // The same, to write.
  static SafetensorsWriter merged(const std::vector<SafetensorsFile>& parts);

  const std::string& source() const { return source_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  // A metadata value; Error naming the file and the key when absent.
  const std::string& metadata(std::string_view key) const;
  // A metadata value that must be a whole number >= 0 (an Error naming the
  // file, the key and the text otherwise).
  std::int64_t metadata_count(std::string_view key) const;
  // A metadata value that must be a finite number (an Error naming the file,
  // the key and the text otherwise).
  double metadata_number(std::string_view key) const;
  // Sets a metadata value in memory (the file on disk is not touched): for a
  // reader that supplies what a file written elsewhere leaves out. Not while
  // other threads read the file.
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }
  bool contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }
  // Tensor names in data order.
  std::vector<std::string> names() const;
  const SafetensorsEntry& entry(std::string_view name) const;

  // A copy of an F32 / I32 tensor (Error if absent or of another dtype).
  Tensor floats(std::string_view name, Allocator allocator = {}) const;
  IntTensor ints(std::string_view name, Allocator allocator = {}) const;
  // floats and read_floats take F32, BF16 and F16 tensors (widened exactly).
  // Copies a float tensor that must have exactly `shape` into `out`.
  void read_floats(std::string_view name, const Shape& shape, std::span<float> out) const;

 private:
  SafetensorsFile() = default;
  enum class Tensors { kRead, kSkip };
  void parse_header(std::size_t header_length, Tensors tensors);
  void check_checksums() const;
  const SafetensorsEntry& typed_entry(std::string_view name, Dtype dtype) const;
  const std::byte* data(const SafetensorsEntry& entry) const;

  std::string source_;
  std::string bytes_;
  std::size_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry, std::less<>> entries_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

// Collects tensors (copied) and metadata, then writes one safetensors file
// atomically (core/file.h): readers never see half a file. Tensors are laid
// out in the order added; a name may be added once. __metadata__ gets
// "crc32.<name>" (8 hex digits) for every tensor.
class SafetensorsWriter {
 public:
  void add(std::string name, std::span<const float> values, const Shape& shape);
  void add(std::string name, std::span<const std::int32_t> values, const Shape& shape);
  bool contains(std::string_view name) const { return names_.contains(name); }
  // The tensors' names in the order added, and their bytes together.
  std::vector<std::string> names() const;
  std::size_t data_bytes() const { return data_.size(); }
  void set_metadata(std::string key, std::string value);

  std::string serialize() const;
  void write(const std::filesystem::path& path) const;

 private:
  friend class SafetensorsFile;  // merge() copies tensors' bytes as they are
  struct Pending {
    std::string name;
    Dtype dtype;
    Shape shape;
    std::size_t begin;
    std::size_t end;
  };
  void add_bytes(std::string name, Dtype dtype, const Shape& shape, const void* data, std::size_t bytes);
  // The file's first part: the 8-byte header length, then the header (each
  // tensor's CRC-32 in __metadata__), padded to 8 bytes.
  std::string length_and_header() const;

  std::vector<Pending> tensors_;
  std::set<std::string, std::less<>> names_;
  std::string data_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pipeflow::nn
