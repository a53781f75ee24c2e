#pragma once

#include <cstdint>

namespace pipeflow {

// The number format a stage computes in. kFp32: every value a float.
// kBf16 / kFp16: the values a mixed-precision run keeps in half precision
// (the weights the layers multiply by, the activations and their gradients
// between layers) are rounded to that format, each kept in a float that holds
// it exactly while a layer computes (and in 16 bits between passes:
// nn/half_stash.h); the arithmetic inside a layer, the norms' statistics, softmax,
// the loss, the weight gradients and the optimizer stay fp32 (DeepSpeed's and
// Megatron's bf16/fp16 semantics with fp32 master weights and accumulation).
enum class ComputeFormat { kFp32, kBf16, kFp16 };

const char* to_string(ComputeFormat format);

// Round to nearest, ties to even, as a cast to bf16 / fp16 rounds. bf16 keeps
// float's exponent range (8 significant bits); fp16 has 11 significant bits,
// a largest finite value of 65504 (beyond it, ±inf: the overflow a loss scale
// must avoid) and subnormals down to 2^−24. NaN stays NaN.
float round_to_bf16(float x);
float round_to_fp16(float x);

// In place over n values; kFp32 leaves them as they are.
void round_to_format(ComputeFormat format, float* values, std::int64_t n);

// The 16 bits of the rounded value, and back (what a half-precision tensor
// stores): bf16 is the float's high half; fp16 is IEEE binary16.
std::uint16_t bf16_bits(float x);
float from_bf16_bits(std::uint16_t bits);
std::uint16_t fp16_bits(float x);
float from_fp16_bits(std::uint16_t bits);

// Over n values of a half format (kBf16 or kFp16): the bits of values the
// format represents (rounding any that it does not), and back.
void to_half_bits(ComputeFormat format, const float* values, std::uint16_t* bits, std::int64_t n);
void from_half_bits(ComputeFormat format, const std::uint16_t* bits, float* values, std::int64_t n);

}  // namespace pipeflow
