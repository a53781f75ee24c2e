// What a checkpoint, a saved model and every evaluation's gathered model
// cost to turn into safetensors bytes and back (nn/safetensors.h), against
// copying the same bytes once in the same run: into memory already touched
// (memcpy), and into a new string, as serialize and a file's read must (on
// this VM a fresh page costs more than its copy). Timed: serialize (the file
// in memory, each tensor's CRC-32 into its header), parse (the header read
// and every tensor's CRC-32 checked), and the file written (atomically, with
// fsync) and read back.
//
//   bench_checkpoint_io [--mib 64] [--rounds 5]
//
// Sizes in MiB of tensor data, in tensors of 256 KiB (a layer's weight of
// width 256); per size, min / median / max over the rounds in GB/s and the
// median's share of memcpy's median and of the new string's. From 32 MiB,
// glibc's ceiling for serving a block from its heap, every new buffer is
// fresh pages, as a real model's are (GPT-2 small's weights are 500 MB);
// below it, which buffer reuses which pages depends on the order of frees.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "flags.h"
#include "pipeflow/nn/safetensors.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Rates {
  std::vector<double> gb_per_s;
  double median() const { return sorted()[gb_per_s.size() / 2]; }
  std::vector<double> sorted() const {
    std::vector<double> s = gb_per_s;
    std::sort(s.begin(), s.end());
    return s;
  }
};

template <class F>
void time_round(Rates& rates, std::size_t bytes, F&& f) {
  const Clock::time_point start = Clock::now();
  f();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  rates.gb_per_s.push_back(static_cast<double>(bytes) / seconds / 1e9);
}

void print(const char* what, const Rates& rates, double memcpy_median, double fresh_median) {
  const std::vector<double> s = rates.sorted();
  std::printf("  %-38s %6.2f / %6.2f / %6.2f GB/s (min / median / max) = %6.3fx memcpy, %6.3fx a new string\n",
              what, s.front(), s[s.size() / 2], s.back(), s[s.size() / 2] / memcpy_median,
              s[s.size() / 2] / fresh_median);
}

std::vector<int> parse_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string word = text.substr(at, comma - at);
    char* end = nullptr;
    const long mib = std::strtol(word.c_str(), &end, 10);
    if (word.empty() || *end != '\0' || mib < 1 || mib > 4096) {
      std::fprintf(stderr, "--mib %s: '%s' is not a size in MiB from 1 to 4096: try --mib 64\n", text.c_str(),
                   word.c_str());
      std::exit(2);
    }
    sizes.push_back(static_cast<int>(mib));
    at = comma + 1;
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mib_list = "64";
  int rounds = 5;
  pipeflow::bench::parse_flags(argc, argv, {{"--mib", &mib_list}, {"--rounds", &rounds}});
  if (rounds < 1 || rounds > 100) {
    std::fprintf(stderr, "--rounds %d: must be 1 to 100 (timed rounds per size): try --rounds 5\n", rounds);
    return 2;
  }
  const std::vector<int> sizes = parse_sizes(mib_list);
  char pattern[] = "/tmp/pipeflow-bench-checkpoint-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    std::perror("bench_checkpoint_io: mkdtemp in /tmp");
    return 1;
  }
  // The folder and its file go however the program ends: returned, failed
  // or stopped by an error.
  struct RemovedAtExit {
    std::filesystem::path folder;
    ~RemovedAtExit() {
      std::error_code ignored;
      std::filesystem::remove_all(folder, ignored);
    }
  } const temporary{pattern};
  const std::filesystem::path file = temporary.folder / "model.safetensors";
  constexpr int kTensorFloats = 64 * 1024;  // 256 KiB
  try {
    for (const int mib : sizes) {
      const int tensors = mib * 4;
      const std::size_t bytes = static_cast<std::size_t>(tensors) * kTensorFloats * sizeof(float);
      std::vector<float> values(static_cast<std::size_t>(tensors) * kTensorFloats);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1009) * 0.001f - 0.5f;
      pipeflow::nn::SafetensorsWriter writer;
      for (int t = 0; t < tensors; ++t) {
        writer.add("layer." + std::to_string(t) + ".weight",
                   std::span<const float>(values).subspan(static_cast<std::size_t>(t) * kTensorFloats, kTensorFloats),
                   pipeflow::Shape({256, 256}));
      }
      std::vector<float> copy(values.size());
      std::memcpy(copy.data(), values.data(), bytes);  // (its pages touched before timing)
      Rates memcpy_rates, fresh_rates, serialize_rates, parse_rates, write_rates, read_rates;
      std::string text;
      std::optional<pipeflow::nn::SafetensorsFile> parsed;
      // (What a round frees, the last string or parsed file, is freed before
      // the clock starts or after it stops: only the path is timed.)
      const auto release = [&] {
        text.clear();
        text.shrink_to_fit();
        parsed.reset();
      };
      for (int r = 0; r < rounds; ++r) {
        time_round(memcpy_rates, bytes, [&] { std::memcpy(copy.data(), values.data(), bytes); });
        release();
        time_round(fresh_rates, bytes, [&] {  // allocated as serialize allocates its result
          text.reserve(bytes);
          text.append(reinterpret_cast<const char*>(values.data()), bytes);
        });
        release();
        time_round(serialize_rates, bytes, [&] { text = writer.serialize(); });
        time_round(parse_rates, bytes, [&] {
          parsed.emplace(pipeflow::nn::SafetensorsFile::parse(std::move(text), "the serialized bytes"));
        });
        release();
        std::filesystem::remove(file);  // (the last round's file freed before the clock starts)
        time_round(write_rates, bytes, [&] { writer.write(file); });
        time_round(read_rates, bytes, [&] { parsed.emplace(pipeflow::nn::SafetensorsFile::read(file)); });
        // Every tensor read back as written, or no rates are printed.
        std::vector<float> read_back(kTensorFloats);
        for (int t = 0; t < tensors; ++t) {
          const std::string name = "layer." + std::to_string(t) + ".weight";
          parsed->read_floats(name, pipeflow::Shape({256, 256}), read_back);
          if (std::memcmp(read_back.data(), values.data() + static_cast<std::size_t>(t) * kTensorFloats,
                          kTensorFloats * sizeof(float)) != 0) {
            std::fprintf(stderr, "bench_checkpoint_io: %s read back from %s differs from what was written\n",
                         name.c_str(), file.c_str());
            return 1;
          }
        }
        release();
      }
      if (std::memcmp(copy.data(), values.data(), bytes) != 0) {
        std::fprintf(stderr, "bench_checkpoint_io: memcpy's copy differs from its source\n");
        return 1;
      }
      std::printf("%d MiB in %d tensors of 256 KiB, %d round%s:\n", mib, tensors, rounds, rounds == 1 ? "" : "s");
      const double m = memcpy_rates.median();
      const double f = fresh_rates.median();
      print("memcpy (baseline)", memcpy_rates, m, f);
      print("copy into a new string (baseline)", fresh_rates, m, f);
      print("serialize (CRC-32s into the header)", serialize_rates, m, f);
      print("parse (CRC-32s checked)", parse_rates, m, f);
      print("write (header, tensors, fsync)", write_rates, m, f);
      print("read (file into a new string, parse)", read_rates, m, f);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_checkpoint_io: %s\n", error.what());
    return 1;
  }
  return 0;
}
