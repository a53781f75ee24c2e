#include "pipeflow/nn/model_config.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "pipeflow/core/error.h"

namespace pipeflow::nn {

void ModelConfig::validate() const {
  auto require_in_range = [](const char* field, int value, int most) {
    if (value <= 0) fail("model {} = {}: must be positive", field, value);
    if (value > most) fail("model {} = {}: must be at most {}", field, value, most);
  };
  require_in_range("vocab_size", vocab_size, kMaxVocab);
  require_in_range("context", context, kMaxContext);
  require_in_range("n_layer", n_layer, kMaxLayers);
  require_in_range("n_head", n_head, kMaxWidth);
  require_in_range("n_embd", n_embd, kMaxWidth);
  if (n_embd % n_head != 0) {
    fail("model n_embd = {} is not a multiple of n_head = {}: every head needs n_embd / n_head features", n_embd,
         n_head);
  }
  if (!llama()) {
    if (n_kv_head != 0 && n_kv_head != n_head) {
      fail("model n_kv_head = {}: GPT-2 has one key/value head per query head; leave it 0 or set it to n_head = {}",
           n_kv_head, n_head);
    }
    if (intermediate != 0 && intermediate != 4 * n_embd) {
      fail("model intermediate = {}: GPT-2's MLP is 4 x n_embd = {} wide; leave it 0", intermediate, 4 * n_embd);
    }
    if (!tied_embeddings) fail("model tied_embeddings = false: GPT-2's LM head is tied to wte; leave it true");
    return;
  }
  if (n_kv_head < 0 || n_kv_head > n_head || n_head % kv_heads() != 0) {
    fail("model n_kv_head = {}: must divide n_head = {} (each key/value head serves n_head / n_kv_head query "
         "heads), or be 0 for one per query head",
         n_kv_head, n_head);
  }
  if (head_size() % 2 != 0) {
    fail("model n_embd / n_head = {} / {} = {}: Llama's rotary embedding turns pairs of features, so the head "
         "size must be even",
         n_embd, n_head, head_size());
  }
  if (intermediate < 0 || intermediate > kMaxWidth * 4) {
    fail("model intermediate = {}: must be in [1, {}] (0: 4 x n_embd)", intermediate, kMaxWidth * 4);
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) fail("model rope_theta = {}: must be a positive number", rope_theta);
  if (!(norm_eps > 0) || !(norm_eps < 1)) fail("model rms_norm_eps = {}: must be in (0, 1)", norm_eps);
  const RopeScaling& r = rope_scaling;
  if (!(r.factor >= 1) || !std::isfinite(r.factor) || !(r.low_freq_factor > 0) ||
      !(r.high_freq_factor > r.low_freq_factor) || r.original_context < 1) {
    fail("model rope_scaling = {{factor {}, low_freq_factor {}, high_freq_factor {}, "
         "original_max_position_embeddings {}}}: needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a "
         "positive original context (Llama 3.1: 8, 1, 4, 8192)",
         r.factor, r.low_freq_factor, r.high_freq_factor, r.original_context);
  }
}

const char* to_string(Family family) { return family == Family::kLlama ? "llama" : "gpt2"; }

const char* ModelConfig::embedding_name() const { return llama() ? "model.embed_tokens.weight" : "wte.weight"; }

const char* ModelConfig::head_matrix_name() const { return tied_embeddings ? embedding_name() : "lm_head.weight"; }

std::int64_t ModelConfig::parameter_count() const {
  const std::int64_t c = n_embd;
  if (llama()) {
    const std::int64_t v = vocab_size;
    const std::int64_t kv = static_cast<std::int64_t>(kv_heads()) * head_size();
    const std::int64_t block = 2 * c + 2 * c * c + 2 * c * kv + 3 * c * ffn();
    return v * c * (tied_embeddings ? 1 : 2) + n_layer * block + c;
  }
  return static_cast<std::int64_t>(vocab_size) * c + static_cast<std::int64_t>(context) * c +
         n_layer * (12 * c * c + 13 * c) + 2 * c;
}

void validate_tensor_parallel(const ModelConfig& config, int size) {
  if (size < 1) fail("tensor_parallel = {}: must be at least 1", size);
  if (size == 1) return;
  const std::pair<const char*, int> divided[] = {
      {"n_head (num_attention_heads: each rank computes whole heads)", config.n_head},
      {config.llama() ? "n_kv_head (num_key_value_heads: each rank holds its own key/value heads)" : nullptr,
       config.kv_heads()},
      {config.llama() ? "intermediate (intermediate_size: the MLP's columns are split)"
                      : "4 x n_embd (the MLP's columns are split)",
       config.ffn()},
      {"vocab_size (the embedding and the LM head are split by vocabulary rows)", config.vocab_size}};
  for (const auto& [what, value] : divided) {
    if (what == nullptr || value % size == 0) continue;
    std::string fits;  // every size that divides all four
    for (int t = 1; t <= config.n_head; ++t) {
      bool divides = true;
      for (const auto& [field, v] : divided) divides = divides && (field == nullptr || v % t == 0);
      if (divides) fits += (fits.empty() ? "" : ", ") + std::to_string(t);
    }
    fail("tensor_parallel = {}: the model's {} = {} is not a multiple of it: this model splits over tensor_parallel "
         "{}",
         size, what, value, fits);
  }
}

std::string describe(const ModelConfig& config) {
  const ModelConfig& c = config;
  if (!c.llama()) {
    return fmt::format("GPT-2, {} layers, width {}, {} heads, context {}, vocabulary {}", c.n_layer, c.n_embd,
                       c.n_head, c.context, c.vocab_size);
  }
  std::string text = fmt::format("Llama, {} layers, width {}, {} heads ({} key/value), MLP {}, context {}, "
                                 "vocabulary {}, rope_theta {}",
                                 c.n_layer, c.n_embd, c.n_head, c.kv_heads(), c.ffn(), c.context, c.vocab_size,
                                 c.rope_theta);
  const RopeScaling& r = c.rope_scaling;
  if (r.factor != 1) {
    text += fmt::format(" (llama3 scaling x{} from {}, frequency factors {} and {})", r.factor, r.original_context,
                        r.low_freq_factor, r.high_freq_factor);
  }
  text += fmt::format(", rms_norm_eps {}", c.norm_eps);
  return text + (c.tied_embeddings ? ", tied head" : ", untied head");
}

std::vector<double> rope_frequencies(const ModelConfig& config) {
  const int hs = config.head_size();
  const RopeScaling& r = config.rope_scaling;
  constexpr double kPi = 3.14159265358979323846;
  std::vector<double> frequencies(static_cast<std::size_t>(hs / 2));
  for (int i = 0; i < hs / 2; ++i) {
    double f = std::pow(config.rope_theta, -2.0 * i / hs);
    if (r.factor != 1) {
      const double wavelength = 2 * kPi / f;
      const double low_wavelength = r.original_context / r.low_freq_factor;
      const double high_wavelength = r.original_context / r.high_freq_factor;
      if (wavelength > low_wavelength) {
        f /= r.factor;
      } else if (wavelength >= high_wavelength) {
        const double smooth = (r.original_context / wavelength - r.low_freq_factor) /
                              (r.high_freq_factor - r.low_freq_factor);
        f = (1 - smooth) * f / r.factor + smooth * f;
      }
    }
    frequencies[static_cast<std::size_t>(i)] = f;
  }
  return frequencies;
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  return family == o.family && vocab_size == o.vocab_size && context == o.context && n_layer == o.n_layer &&
         n_head == o.n_head && n_embd == o.n_embd && kv_heads() == o.kv_heads() && ffn() == o.ffn() &&
         rope_theta == o.rope_theta && rope_scaling == o.rope_scaling && norm_eps == o.norm_eps &&
         tied_embeddings == o.tied_embeddings;
}

std::string pipeline_layer_name(const ModelConfig& config, int layer) {
  if (layer == 0) return "embedding";
  if (layer == config.n_layer + 1) return "head";
  return fmt::format("block.{}", layer - 1);
}

void validate_range(const ModelConfig& config, LayerRange range) {
  if (range.first < 0 || range.last > config.pipeline_layers() || range.first >= range.last) {
    fail("layer range [{}, {}) is not a non-empty range of the model's {} pipeline layers (embedding, {} blocks, "
         "head)",
         range.first, range.last, config.pipeline_layers(), config.n_layer);
  }
}

}  // namespace pipeflow::nn
