#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pipeflow {

// The two decoder families pipeflow models.
//   kGpt:   GPT-2/GPT-3. Learned position table (max_positions × hidden),
//           LayerNorm with weight and bias, biased linear layers, GELU MLP
//           hidden → ffn → hidden, multi-head attention (kv_heads == heads).
//   kLlama: Llama 2/3. Rotary positions (no table), RMSNorm (weight only),
//           linear layers without bias, SwiGLU MLP (gate and up: hidden → ffn,
//           down: ffn → hidden), grouped-query attention with kv_heads heads
//           for K and V.
enum class Architecture { kGpt, kLlama };

std::string_view to_string(Architecture architecture);

// The shape of a decoder-only language model: everything that decides its
// parameter count, FLOPs and activation memory. A plain value; copy freely.
//
// A spec is built from a preset (model_preset), a Hugging Face config.json
// (model_from_hf_config), or by hand, e.g. the tiny model pipeflow trains:
//   ModelSpec tiny = gpt_model("tiny", /*layers=*/4, /*hidden=*/128, /*heads=*/4,
//                              /*vocab=*/256, /*max_positions=*/64);
// and is checked with validate_model before use.
// Llama's rotary embedding and norm as config.json gives them: numerics only,
// no effect on counts (what pipeflow train needs beside the shape).
struct LlamaNumerics {
  double rope_theta = 10000;
  // rope_scaling: "default" (none, or null), "llama3" (the four fields
  // below), or the type a config names that pipeflow does not compute
  // ("linear", "dynamic", "yarn", ...: counted all the same).
  std::string rope_type = "default";
  double rope_factor = 1;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int rope_original_context = 8192;
  double rms_norm_eps = 1e-6;  // transformers' LlamaConfig default
};

// A vision tower in front of the language model, as LLaVA puts CLIP's ViT
// there (Liu et al. 2023; LLaVA-1.5: CLIP ViT-L/14 at 336 px and a 2-layer
// MLP projector). The tower turns each image into patch tokens; the
// projector maps them to the language model's width, where they take their
// place among the text tokens: the language model's sequence (the run's
// seq_length) is images · image_tokens + text tokens.
//   patch embedding: a convolution of stride and kernel patch_size, i.e. a
//     linear map of patch_size²·channels pixels to `hidden` per patch (no
//     bias, as CLIP); a class token (CLIP's CLS) if class_token; a learned
//     position table of one row per token; CLIP's pre-LayerNorm.
//   blocks: `layers` pre-LayerNorm transformer encoder layers, GPT-shaped
//     (LayerNorm with bias, biased linears, a GELU-family MLP of width ffn,
//     multi-head attention, no causal mask, no dropout), over all tokens.
//   projector: LLaVA-1.5's mlp2x_gelu, Linear(hidden -> LM width) with bias,
//     GELU, Linear(LM width -> LM width) with bias.
struct VisionSpec {
  int layers = 0;         // ViT blocks the pipeline runs (up to the feature layer)
  int hidden = 0;
  int heads = 0;
  int ffn = 0;
  int image_size = 0;     // pixels per side
  int patch_size = 0;     // pixels per patch side
  int channels = 3;
  bool class_token = true;  // CLIP prepends a learned CLS token
  // LLaVA's vision_feature_select_strategy "default": the CLS token is
  // dropped before the projector; "full" keeps it.
  bool drop_class_token = true;
  int images = 1;  // images per sequence
  // What the tower computes, as a config.json names it: the counts are the
  // same whatever these say, so only the runtime reads them, to refuse what
  // it computes otherwise. The defaults are pipeflow's tower (the inline
  // model's); a LLaVA config.json that leaves them out means transformers'.
  std::string activation = "gelu_new";            // vision_config.hidden_act (CLIPVisionConfig's: "quick_gelu")
  std::string projector_activation = "gelu_new";  // projector_hidden_act (LlavaConfig's: "gelu")
  double layer_norm_eps = 1e-5;                   // vision_config.layer_norm_eps

  friend bool operator==(const VisionSpec&, const VisionSpec&) = default;
};

// Patches per image, (image_size / patch_size)².
int patch_tokens(const VisionSpec& vision);
// Tokens each ViT block sees per image: the patches and the CLS token.
int vision_tokens(const VisionSpec& vision);
// Tokens per image that reach the language model (the CLS dropped or kept).
int image_tokens(const VisionSpec& vision);

struct ModelSpec {
  std::string name;
  Architecture architecture = Architecture::kGpt;
  int layers = 0;         // L: transformer blocks
  int hidden = 0;         // h: model width
  int heads = 0;          // a: attention (query) heads
  int kv_heads = 0;       // key/value heads (GQA); == heads for kGpt
  int ffn = 0;            // MLP inner width (4h for GPT; Llama's intermediate_size)
  int vocab = 0;          // V: vocabulary size (not padded)
  int max_positions = 0;  // context length; the size of kGpt's position table
  bool tied_embeddings = true;  // LM head shares the token-embedding matrix
  // Dropout after attention probabilities, attention output, MLP output and
  // the embeddings (p > 0 during training). It adds the 1-byte masks of
  // Korthikanti et al. 2022 to activation memory.
  bool dropout = false;
  LlamaNumerics llama = {};  // kLlama only
  // kGpt: a config.json's activation_function and layer_norm_epsilon (GPT2Config's
  // defaults: the tanh GELU, 1e-5), read as the vision tower's above.
  std::string gpt_activation = "gelu_new";
  double layer_norm_eps = 1e-5;
  // A vision-language model (LLaVA): the tower and projector before the
  // language model described by the fields above.
  std::optional<VisionSpec> vision = std::nullopt;
};

// GPT's MLP width, 4·hidden; saturated at INT_MAX so that an absurd hidden
// fails validate_model instead of wrapping around.
int gpt_ffn(int hidden);

// A GPT-style spec with ffn = 4·hidden, tied embeddings and no dropout
// (pipeflow's own GPT-2 trains without dropout; see DESIGN.md).
ModelSpec gpt_model(std::string name, int layers, int hidden, int heads, int vocab, int max_positions);

// The largest shapes validate_model accepts: far above any published model
// (Llama 3 405B: 126 layers, width 16384, ffn 53248, vocabulary 128256), low
// enough that parameter counts stay within 64 bits and the exact partitioner,
// O(stages · layers²), answers in seconds.
inline constexpr int kMaxModelLayers = 1 << 12;
inline constexpr int kMaxModelWidth = 1 << 20;      // hidden, heads, kv_heads
inline constexpr int kMaxModelFfn = 1 << 22;
inline constexpr int kMaxModelVocab = 1 << 24;
inline constexpr int kMaxModelPositions = 1 << 24;

// Throws Error naming the field, its value, the rule and the fix when the
// spec is not a model pipeflow can count (e.g. kv_heads not dividing heads,
// a field above its kMax).
void validate_model(const ModelSpec& spec);

// The largest image validate_model accepts, in pixels per side.
inline constexpr int kMaxImageSize = 1 << 14;

// Throws unless hidden is a multiple of heads. validate_model applies it to
// Llama models; a config.json applies it to every model, since code built
// from it splits hidden into heads. The GPT-3 paper's presets are exempt:
// gpt3-1.3b (2048 wide, 24 heads) and gpt3-13b (5140, 40) are published so.
void check_head_width(const ModelSpec& spec);

// Width of K and V together, 2·kv_heads·(hidden/heads): 2·hidden for
// multi-head attention, less with grouped-query attention.
double kv_width(const ModelSpec& spec);

// Parameter count of the whole model, counting a tied matrix once.
std::int64_t parameter_count(const ModelSpec& spec);

// The built-in presets, in a fixed order: gpt2-124m, gpt2-355m, gpt2-774m,
// gpt2-1.5b, gpt3-1.3b, gpt3-6.7b, gpt3-13b, gpt3-175b, llama2-7b,
// llama2-13b, llama2-70b, llama3-8b, llama3-70b, llama3-405b, gpt-tiny.
const std::vector<ModelSpec>& model_presets();

// A preset by name (case-sensitive); throws Error listing the presets.
ModelSpec model_preset(std::string_view name);

// A preset name, or a path to a Hugging Face config.json (anything containing
// '/' or ending in ".json" is a path). Unknown names list the presets.
ModelSpec resolve_model(std::string_view name_or_path);

}  // namespace pipeflow
