#include "pipeflow/nn/safetensors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/tensor/half.h"

namespace pipeflow::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

constexpr std::size_t kLengthBytes = 8;
constexpr std::uint64_t kMaxHeaderBytes = 100 * 1000 * 1000;  // the reference implementation's limit
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 60;  // so that bytes (x 4) fit in 63 bits

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kI32:
      return "I32";
    case Dtype::kBF16:
      return "BF16";
    case Dtype::kF16:
      return "F16";
    case Dtype::kF32:
      break;
  }
  return "F32";
}

std::size_t element_bytes(Dtype dtype) { return dtype == Dtype::kBF16 || dtype == Dtype::kF16 ? 2 : 4; }

bool floating(Dtype dtype) { return dtype != Dtype::kI32; }

// The float values of a floating tensor's bytes into `out`.
void widen(const std::byte* bytes, Dtype dtype, std::span<float> out) {
  if (dtype == Dtype::kF32) {
    std::memcpy(out.data(), bytes, out.size_bytes());
    return;
  }
  std::vector<std::uint16_t> bits(out.size());  // the file's bytes need not be 2-byte aligned
  std::memcpy(bits.data(), bytes, 2 * bits.size());
  from_half_bits(dtype == Dtype::kBF16 ? ComputeFormat::kBf16 : ComputeFormat::kFp16, bits.data(), out.data(),
                 static_cast<std::int64_t>(bits.size()));
}

// The __metadata__ key holding a tensor's checksum.
std::string crc_key(std::string_view name) { return fmt::format("crc32.{}", name); }

// CRC-32 (IEEE 802.3) by zlib: every checkpoint, saved model and
// evaluation's gathered model is checksummed on its way out and checked on
// its way in, several times over for a gathered one, and zlib's crc32 ran
// about 50 times as fast as the bitwise loop it replaced (docs/PERFORMANCE.md,
// 2026-12-08). It computes the same CRC-32, so files written by earlier
// versions still pass their checks.
std::string crc32_hex(const char* data, std::size_t bytes) {
  const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(data), bytes);
  return fmt::format("{:08x}", static_cast<std::uint32_t>(crc));
}

}  // namespace

SafetensorsFile SafetensorsFile::read(const std::filesystem::path& path) {
  return parse(read_file(path), path.string());
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, std::string source) {
  SafetensorsFile file;
  file.source_ = std::move(source);
  file.bytes_ = std::move(bytes);
  if (file.bytes_.size() < kLengthBytes) {
    fail("{}: truncated safetensors file: {} bytes, shorter than the 8-byte header length", file.source_,
         file.bytes_.size());
  }
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, file.bytes_.data(), kLengthBytes);
  const std::uint64_t available = file.bytes_.size() - kLengthBytes;
  if (header_length > available || header_length > kMaxHeaderBytes) {
    fail("{}: header length {} runs past the end of the file ({} bytes): truncated or not a safetensors file",
         file.source_, header_length, file.bytes_.size());
  }
  file.parse_header(static_cast<std::size_t>(header_length), Tensors::kRead);
  return file;
}

SafetensorsFile SafetensorsFile::read_metadata(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.source_ = path.string();
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", file.source_, std::strerror(errno));
  file.bytes_.resize(kLengthBytes);
  in.read(file.bytes_.data(), kLengthBytes);
  std::uint64_t header_length = 0;
  if (in.gcount() == static_cast<std::streamsize>(kLengthBytes)) {
    std::memcpy(&header_length, file.bytes_.data(), kLengthBytes);
  }
  if (header_length == 0 || header_length > kMaxHeaderBytes) {
    fail("{}: no safetensors header (header length {}): truncated or not a safetensors file", file.source_,
         header_length);
  }
  file.bytes_.resize(kLengthBytes + header_length);
  in.read(file.bytes_.data() + kLengthBytes, static_cast<std::streamsize>(header_length));
  if (in.gcount() != static_cast<std::streamsize>(header_length)) {
    fail("{}: header length {} runs past the end of the file: truncated or not a safetensors file", file.source_,
         header_length);
  }
  file.parse_header(static_cast<std::size_t>(header_length), Tensors::kSkip);
  return file;
}

void SafetensorsFile::parse_header(std::size_t header_length, Tensors tensors) {
  const nlohmann::json header =
      parse_json(std::string_view(bytes_).substr(kLengthBytes, header_length), source_ + " header");
  if (!header.is_object()) fail("{}: header must be a JSON object", source_);
  data_start_ = kLengthBytes + header_length;
  const std::size_t data_bytes = bytes_.size() - data_start_;
  for (const auto& item : header.items()) {
    // Named copies, not structured bindings: lambdas below capture them (clang 14 refuses bindings there).
    const std::string& name = item.key();
    const nlohmann::json& value = item.value();
    if (name == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ must be an object of strings", source_);
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) fail("{}: __metadata__.{} must be a string, got {}", source_, key, short_dump(text));
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    if (tensors == Tensors::kSkip) continue;
    auto bad = [&](const std::string& what) { fail("{}: tensor {}: {}", source_, name, what); };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      bad("needs dtype, shape and data_offsets");
    }
    SafetensorsEntry entry;
    const std::string dtype = value["dtype"].is_string() ? value["dtype"].get<std::string>() : short_dump(value["dtype"]);
    if (dtype == "F32") {
      entry.dtype = Dtype::kF32;
    } else if (dtype == "I32") {
      entry.dtype = Dtype::kI32;
    } else if (dtype == "BF16") {
      entry.dtype = Dtype::kBF16;
    } else if (dtype == "F16") {
      entry.dtype = Dtype::kF16;
    } else {
      bad(fmt::format("dtype {} is not supported (pipeflow reads F32, BF16, F16 and I32)", dtype));
    }
    const auto& shape = value["shape"];
    if (!shape.is_array() || shape.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
      bad(fmt::format("shape {} must be a list of at most {} dimensions", short_dump(shape), Shape::kMaxRank));
    }
    std::int64_t dims[Shape::kMaxRank] = {};
    std::uint64_t elements = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (!shape[i].is_number_unsigned()) bad(fmt::format("shape {} has a non-integer dimension", short_dump(shape)));
      const std::uint64_t dim = shape[i].get<std::uint64_t>();
      // Checked before multiplying: an overflowing product could match a small data_offsets span.
      if (dim > kMaxElements || (dim > 0 && elements > kMaxElements / dim)) {
        bad(fmt::format("shape {} has more than 2^60 elements: a corrupt header", short_dump(shape)));
      }
      elements *= dim;
      dims[i] = static_cast<std::int64_t>(dim);
    }
    switch (shape.size()) {
      case 0: entry.shape = Shape{}; break;
      case 1: entry.shape = Shape{dims[0]}; break;
      case 2: entry.shape = Shape{dims[0], dims[1]}; break;
      case 3: entry.shape = Shape{dims[0], dims[1], dims[2]}; break;
      default: entry.shape = Shape{dims[0], dims[1], dims[2], dims[3]}; break;
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned() || offsets[0].get<std::uint64_t>() > offsets[1].get<std::uint64_t>()) {
      bad(fmt::format("data_offsets {} must be [begin, end] with begin <= end", short_dump(offsets)));
    }
    entry.begin = offsets[0].get<std::size_t>();
    entry.end = offsets[1].get<std::size_t>();
    const std::size_t needed = static_cast<std::size_t>(entry.shape.numel()) * element_bytes(entry.dtype);
    if (entry.end - entry.begin != needed) {
      bad(fmt::format("{} {} needs {} bytes but data_offsets [{}, {}] span {}", dtype, entry.shape.to_string(),
                      needed, entry.begin, entry.end, entry.end - entry.begin));
    }
    if (entry.end > data_bytes) {
      bad(fmt::format("ends at data byte {} but the file holds only {} data bytes: the file is truncated",
                      entry.end, data_bytes));
    }
    entries_.emplace(name, entry);
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& [name, entry] : entries_) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  std::size_t expected = 0;
  for (const SafetensorsEntry* entry : by_offset) {
    if (entry->begin != expected) {
      fail("{}: tensor data is not contiguous (a gap or overlap at data byte {}): corrupt file", source_, expected);
    }
    expected = entry->end;
  }
  if (expected != data_bytes) {
    fail("{}: {} bytes after the last tensor: corrupt file or a wrong header", source_, data_bytes - expected);
  }
  check_checksums();
}

void SafetensorsFile::check_checksums() const {
  for (const auto& [name, entry] : entries_) {
    const auto stored = metadata_.find(crc_key(name));
    if (stored == metadata_.end()) continue;  // written without checksums (another tool)
    const std::string actual =
        crc32_hex(reinterpret_cast<const char*>(data(entry)), entry.end - entry.begin);
    if (actual != stored->second) {
      fail("{}: tensor {}: CRC32 {} does not match the {} stored in __metadata__: the file is corrupt; use another "
           "copy or an earlier checkpoint",
           source_, name, actual, stored->second);
    }
  }
}

const std::string& SafetensorsFile::metadata(std::string_view key) const {
  const auto found = metadata_.find(key);
  if (found == metadata_.end()) fail("{}: no {} in the __metadata__ of the file", source_, key);
  return found->second;
}

std::int64_t SafetensorsFile::metadata_count(std::string_view key) const {
  const std::string& text = metadata(key);
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) {
    fail("{}: __metadata__ {} = \"{}\" is not a whole number >= 0", source_, key, text);
  }
  return value;
}

double SafetensorsFile::metadata_number(std::string_view key) const {
  const std::string& text = metadata(key);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    fail("{}: __metadata__ {} = \"{}\" is not a finite number", source_, key, text);
  }
  return value;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) names.push_back(name);
  std::sort(names.begin(), names.end(),
            [&](const auto& a, const auto& b) { return entries_.find(a)->second.begin < entries_.find(b)->second.begin; });
  return names;
}

const SafetensorsEntry& SafetensorsFile::entry(std::string_view name) const {
  const auto found = entries_.find(name);
  if (found == entries_.end()) fail("{}: no tensor {} in the file ({} tensors)", source_, name, entries_.size());
  return found->second;
}

const SafetensorsEntry& SafetensorsFile::typed_entry(std::string_view name, Dtype dtype) const {
  const SafetensorsEntry& found = entry(name);
  if (found.dtype != dtype) {
    fail("{}: tensor {} is {}, expected {}", source_, name, dtype_name(found.dtype), dtype_name(dtype));
  }
  return found;
}

const std::byte* SafetensorsFile::data(const SafetensorsEntry& entry) const {
  return reinterpret_cast<const std::byte*>(bytes_.data()) + data_start_ + entry.begin;
}

Tensor SafetensorsFile::floats(std::string_view name, Allocator allocator) const {
  const SafetensorsEntry& found = entry(name);
  if (!floating(found.dtype)) fail("{}: tensor {} is {}, expected a float tensor", source_, name, dtype_name(found.dtype));
  auto tensor = Tensor::uninitialized(found.shape, allocator);
  if (!tensor.empty()) widen(data(found), found.dtype, tensor.span());
  return tensor;
}

IntTensor SafetensorsFile::ints(std::string_view name, Allocator allocator) const {
  const SafetensorsEntry& found = typed_entry(name, Dtype::kI32);
  auto tensor = IntTensor::uninitialized(found.shape, allocator);
  if (!tensor.empty()) std::memcpy(tensor.data(), data(found), found.end - found.begin);
  return tensor;
}

void SafetensorsFile::read_floats(std::string_view name, const Shape& shape, std::span<float> out) const {
  const SafetensorsEntry& found = entry(name);
  if (!floating(found.dtype)) fail("{}: tensor {} is {}, expected a float tensor", source_, name, dtype_name(found.dtype));
  if (!(found.shape == shape)) {
    fail("{}: tensor {} has shape {}, expected {}", source_, name, found.shape.to_string(), shape.to_string());
  }
  widen(data(found), found.dtype, out.first(static_cast<std::size_t>(shape.numel())));
}

SafetensorsFile SafetensorsFile::merge(const std::vector<SafetensorsFile>& parts, std::string source) {
  return parse(merged(parts).serialize(), std::move(source));
}

SafetensorsWriter SafetensorsFile::merged(const std::vector<SafetensorsFile>& parts) {
  SafetensorsWriter merged;
  for (const SafetensorsFile& part : parts) {
    for (const auto& [key, value] : part.metadata()) merged.set_metadata(key, value);
    for (const std::string& name : part.names()) {
      if (merged.contains(name)) continue;
      const SafetensorsEntry& found = part.entry(name);
      merged.add_bytes(name, found.dtype, found.shape, part.data(found), found.end - found.begin);
    }
  }
  return merged;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> names;
  for (const Pending& tensor : tensors_) names.push_back(tensor.name);
  return names;
}

void SafetensorsWriter::add_bytes(std::string name, Dtype dtype, const Shape& shape, const void* data,
                                  std::size_t bytes) {
  if (static_cast<std::size_t>(shape.numel()) * element_bytes(dtype) != bytes) {
    fail("internal: tensor {} of shape {} given {} bytes", name, shape.to_string(), bytes);
  }
  if (!names_.insert(name).second) fail("internal: tensor {} added twice to one safetensors file", name);
  const std::size_t begin = data_.size();
  data_.append(static_cast<const char*>(data), bytes);
  tensors_.push_back({std::move(name), dtype, shape, begin, data_.size()});
}

void SafetensorsWriter::add(std::string name, std::span<const float> values, const Shape& shape) {
  add_bytes(std::move(name), Dtype::kF32, shape, values.data(), values.size_bytes());
}

void SafetensorsWriter::add(std::string name, std::span<const std::int32_t> values, const Shape& shape) {
  add_bytes(std::move(name), Dtype::kI32, shape, values.data(), values.size_bytes());
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

std::string SafetensorsWriter::length_and_header() const {
  nlohmann::json header = nlohmann::json::object();
  for (const Pending& tensor : tensors_) {
    nlohmann::json dims = nlohmann::json::array();
    for (int axis = 0; axis < tensor.shape.rank(); ++axis) dims.push_back(tensor.shape[axis]);
    header[tensor.name] = {{"dtype", dtype_name(tensor.dtype)}, {"shape", dims},
                           {"data_offsets", {tensor.begin, tensor.end}}};
  }
  nlohmann::json metadata = metadata_;
  for (const Pending& tensor : tensors_) {
    metadata[crc_key(tensor.name)] = crc32_hex(data_.data() + tensor.begin, tensor.end - tensor.begin);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = json_text(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t length = text.size();
  std::string out(reinterpret_cast<const char*>(&length), kLengthBytes);
  out += text;
  return out;
}

std::string SafetensorsWriter::serialize() const {
  std::string out = length_and_header();
  out.reserve(out.size() + data_.size());
  out += data_;
  return out;
}

// The header, then the tensors' bytes as they are held: no copy of the
// whole file in memory on the way to the disk.
void SafetensorsWriter::write(const std::filesystem::path& path) const {
  AtomicFileWriter file(path);
  file.write(length_and_header());
  file.write(data_);
  file.commit();
}

}  // namespace pipeflow::nn
