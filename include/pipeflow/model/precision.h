#pragma once

#include <string_view>

namespace pipeflow {

// The number format a model trains (or serves) in, DeepSpeed's fp16 / bf16
// sections and Megatron-LM's --fp16 / --bf16:
//   fp32  weights, gradients, activations and messages in 4 bytes; Adam's
//         moments in fp32; GEMMs at the device's fp32 peak (PyTorch's
//         default: no TF32 for matmuls).
//   bf16, fp16  mixed precision: half-precision weights, gradients,
//         activations and messages (2 bytes) with fp32 master weights and
//         moments; GEMMs at the device's half-precision tensor peak.
enum class Precision { kFp32, kBf16, kFp16 };

std::string_view to_string(Precision precision);  // "fp32", "bf16", "fp16"
// "fp32", "bf16" or "fp16"; anything else is an Error naming the three.
Precision parse_precision(std::string_view text);

// Bytes of one activation, message or working weight element: 4 or 2.
int bytes_per_element(Precision precision);

}  // namespace pipeflow
