#pragma once

#include <cstdint>
#include <string_view>

namespace pipeflow::nn {

// A small, fully specified random generator, so that the same seed gives the
// same weights and batches on every platform and standard library
// (std::normal_distribution is implementation-defined). SplitMix64 (Steele,
// Lea & Flood, "Fast splittable pseudorandom number generators", 2014).
//
// Thread safety: one generator per thread; generators share nothing.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next();
  // Uniform in [0, 1), 53 random bits.
  double uniform();
  // Uniform integer in [0, n), n > 0 (by remainder; bias below n / 2^64).
  std::uint64_t below(std::uint64_t n);
  // Standard normal by the Box–Muller transform (one draw per two uniforms).
  double normal();

 private:
  std::uint64_t state_;
};

// Derives an independent seed from a seed and a value (SplitMix64's finaliser
// of their combination): seeds per tensor, per step, per sample.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t value);
// 64-bit FNV-1a of a string, to derive seeds from tensor names.
std::uint64_t hash_name(std::string_view name);

}  // namespace pipeflow::nn
