#include "pipeflow/nn/random.h"

#include <cmath>
#include <numbers>

namespace pipeflow::nn {
namespace {

std::uint64_t finalise(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t Rng::next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return finalise(state_);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::uint64_t Rng::below(std::uint64_t n) {
  return next() % n;
}

double Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t value) {
  return finalise(finalise(seed + 0x9e3779b97f4a7c15ULL) ^ (value + 0x632be59bd9b4e019ULL));
}

std::uint64_t hash_name(std::string_view name) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace pipeflow::nn
