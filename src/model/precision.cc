#include "pipeflow/model/precision.h"

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"

namespace pipeflow {

std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "";
}

Precision parse_precision(std::string_view text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  if (text == "fp16") return Precision::kFp16;
  fail("precision {}: use fp32, bf16 or fp16", quoted_excerpt(text));
}

int bytes_per_element(Precision precision) { return precision == Precision::kFp32 ? 4 : 2; }

}  // namespace pipeflow
