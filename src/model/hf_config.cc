#include "pipeflow/model/hf_config.h"

#include <string>
#include <vector>

#include "pipeflow/core/config.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"

namespace pipeflow {
namespace {

// The keys each family reads: the ones that set the shape pipeflow counts.
// Any other key of a config.json (token ids, "architectures", "id2label",
// "task_specific_params", ...) is ignored unless it is a likely misspelling
// of one of these; for a config of no known family, of either family's.
std::vector<std::string> shape_keys(const std::string& type) {
  const std::vector<std::string> gpt2 = {"n_layer",    "n_embd",      "n_head",     "n_inner",
                                         "vocab_size", "n_positions", "n_ctx",      "tie_word_embeddings",
                                         "attn_pdrop", "resid_pdrop", "embd_pdrop"};
  const std::vector<std::string> llama = {
      "num_hidden_layers", "hidden_size", "num_attention_heads",     "num_key_value_heads",
      "intermediate_size", "vocab_size",  "max_position_embeddings", "tie_word_embeddings",
      "attention_dropout", "head_dim",    "attention_bias",          "mlp_bias"};
  if (type == "gpt2") return gpt2;
  if (type == "llama") return llama;
  std::vector<std::string> both = gpt2;
  both.insert(both.end(), llama.begin(), llama.end());
  return both;
}

int positive(const Config& config, std::string_view key, int value) {
  if (value < 1) config.fail_value(key, "must be >= 1");
  return value;
}

int require_positive(const Config& config, std::string_view key) {
  return positive(config, key, config.require<int>(key));
}

double probability(const Config& config, std::string_view key, double fallback) {
  const double p = config.get(key, fallback);
  if (p < 0 || p >= 1) config.fail_value(key, "must be a probability in [0, 1)");
  return p;
}

ModelSpec gpt2_from(const Config& config, std::string name) {
  ModelSpec spec;
  spec.name = std::move(name);
  spec.architecture = Architecture::kGpt;
  spec.layers = require_positive(config, "n_layer");
  spec.hidden = require_positive(config, "n_embd");
  spec.heads = require_positive(config, "n_head");
  spec.kv_heads = spec.heads;
  spec.ffn = positive(config, "n_inner", config.get("n_inner", gpt_ffn(spec.hidden)));
  spec.vocab = require_positive(config, "vocab_size");
  const int context = config.get("n_ctx", 1024);
  spec.max_positions = positive(config, "n_positions", config.get("n_positions", context));
  spec.tied_embeddings = config.get("tie_word_embeddings", true);
  double dropout = 0;
  for (const char* key : {"attn_pdrop", "resid_pdrop", "embd_pdrop"}) dropout += probability(config, key, 0.1);
  spec.dropout = dropout > 0;
  return spec;
}

ModelSpec llama_from(const Config& config, std::string name) {
  ModelSpec spec;
  spec.name = std::move(name);
  spec.architecture = Architecture::kLlama;
  spec.layers = require_positive(config, "num_hidden_layers");
  spec.hidden = require_positive(config, "hidden_size");
  spec.heads = require_positive(config, "num_attention_heads");
  spec.kv_heads = positive(config, "num_key_value_heads", config.get("num_key_value_heads", spec.heads));
  spec.ffn = require_positive(config, "intermediate_size");
  spec.vocab = require_positive(config, "vocab_size");
  spec.max_positions = positive(config, "max_position_embeddings", config.get("max_position_embeddings", 2048));
  spec.tied_embeddings = config.get("tie_word_embeddings", false);
  spec.dropout = probability(config, "attention_dropout", 0.0) > 0;
  if (config.has("head_dim") && config.get("head_dim", 0) * spec.heads != spec.hidden) {
    config.fail_value("head_dim", fmt::format("pipeflow needs head_dim = hidden_size / num_attention_heads = {}",
                                              spec.hidden / spec.heads));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (config.get(key, false)) config.fail_value(key, "pipeflow models Llama layers without biases");
  }
  return spec;
}

}  // namespace

ModelSpec model_from_hf_config_text(std::string_view json_text, std::string name) {
  const Config config = Config::parse(json_text, name);
  const std::string type =
      config.get("model_type", config.has("n_layer") ? "gpt2" : config.has("num_hidden_layers") ? "llama" : "");
  // Before the values: a misspelt required key is a misspelling, not missing.
  config.check_no_misspelt_keys(shape_keys(type));
  ModelSpec spec;
  if (type == "gpt2") {
    spec = gpt2_from(config, name);
  } else if (type == "llama") {
    spec = llama_from(config, name);
  } else {
    config.fail_value("model_type", "pipeflow reads \"gpt2\" and \"llama\" configs (or, without model_type, "
                                    "one with n_layer or num_hidden_layers)");
  }
  validate_model(spec);
  check_head_width(spec);
  return spec;
}

ModelSpec model_from_hf_config(const std::filesystem::path& path) {
  return model_from_hf_config_text(read_file(path, kMaxConfigFileBytes, "Hugging Face config.json"), path.string());
}

}  // namespace pipeflow
