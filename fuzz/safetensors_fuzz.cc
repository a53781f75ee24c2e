// A safetensors file (--weights, --resume, grad --batch): the header and every tensor.
#include "fuzz_target.h"
#include "pipeflow/nn/safetensors.h"

PIPEFLOW_FUZZ_READER({
  const pipeflow::nn::SafetensorsFile file = pipeflow::nn::SafetensorsFile::parse(std::string(text), "fuzz");
  for (const std::string& name : file.names()) {
    if (file.entry(name).dtype == pipeflow::nn::Dtype::kF32) file.floats(name);
  }
})
