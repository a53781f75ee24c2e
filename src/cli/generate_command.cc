#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "inference_flags.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"
#include "pipeflow/runtime/checkpoint_search.h"
#include "pipeflow/runtime/inference.h"
#include "pipeflow/runtime/mpi_world.h"
#include "pipeflow/runtime/rank_group.h"

namespace pipeflow::cli {
namespace {

struct GenerateCommand {
  std::string weights;
  std::string prompt;
  std::string prompts_file;
  bool from_file = false;  // --prompts given
  int stages = 1;
  int tensor_parallel = 1;
  int microbatches = 1;
  int prefill_chunk = runtime::kDefaultPrefillChunk;
  std::string partition = "parameters";
  nn::SamplingOptions sampling;
  bool bf16 = false;
  bool fp16 = false;
  bool json = false;

  ComputeFormat format() const {
    return bf16 ? ComputeFormat::kBf16 : fp16 ? ComputeFormat::kFp16 : ComputeFormat::kFp32;
  }
};

// One prompt a line; a final newline ends the last line (it starts no empty
// prompt); a carriage return before a newline is dropped.
std::vector<std::string> read_prompts(const std::string& path) {
  const std::string text = read_file(path, kMaxConfigFileBytes, "prompts file");
  std::vector<std::string> prompts;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (line.ends_with('\r')) line.pop_back();
    prompts.push_back(std::move(line));
    begin = end + 1;
  }
  if (prompts.empty()) fail("--prompts {}: the file holds no prompt (one a line)", path);
  return prompts;
}

// Text on one line: newline, tab, carriage return and backslash as C escapes,
// other control bytes as \xHH; the rest as it is.
std::string one_line(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

nlohmann::ordered_json to_json(const std::vector<std::string>& prompts, const runtime::InferenceResult& result,
                               const GenerateCommand& command, const nn::ModelConfig& config) {
  nlohmann::ordered_json json;
  json["tokens_per_s"] = result.tokens_per_s();
  json["time_to_first_token_s"] = result.time_to_first_token_s;
  json["decode_tokens_per_s"] = result.decode_tokens_per_s();
  json["seconds"] = result.seconds;
  json["new_tokens"] = result.new_tokens();
  json["microbatches"] = command.microbatches;
  json["precision"] = to_string(command.format());
  json["prefill_chunk"] = command.prefill_chunk;
  json["passes"] = result.passes;
  json["stages"] = nlohmann::ordered_json::array();
  for (const runtime::StageInference& stage : result.stages) {
    json["stages"].push_back({{"first_layer", nn::pipeline_layer_name(config, stage.layers.first)},
                              {"last_layer", nn::pipeline_layer_name(config, stage.layers.last - 1)},
                              {"busy_share", stage.busy_share},
                              {"kv_cache_bytes", stage.kv_cache_bytes}});
  }
  json["outputs"] = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    json["outputs"].push_back({{"prompt", prompts[i]},
                               {"continuation", nn::decode_tokens(result.tokens[i])},
                               {"tokens", result.tokens[i]}});
  }
  return json;
}

void print_report(const std::vector<std::string>& prompts, const runtime::InferenceResult& result,
                  const GenerateCommand& command, const nn::ModelConfig& config) {
  fmt::print("tokens/s {:.1f} ({} new tokens for {} in {}; {}{}, {}{}{})\n", result.tokens_per_s(),
             result.new_tokens(), format_count(static_cast<std::int64_t>(prompts.size()), "prompt"),
             format_seconds(result.seconds), format_count(command.stages, "stage"),
             command.tensor_parallel > 1 ? fmt::format(" x tensor parallel {}", command.tensor_parallel) : "",
             format_count(command.microbatches, "micro-batch", "micro-batches"),
             result.passes > 1 ? fmt::format(", {} passes of bounded memory", result.passes) : "",
             command.format() == ComputeFormat::kFp32 ? "" : fmt::format(", in {}", to_string(command.format())));
  fmt::print("time to first token {}, then decode at {:.1f} tokens/s\n", format_seconds(result.time_to_first_token_s),
             result.decode_tokens_per_s());
  for (std::size_t r = 0; r < result.stages.size(); ++r) {
    const runtime::StageInference& stage = result.stages[r];
    fmt::print("stage {} ({}..{}): busy {}, kv cache {}\n", r, nn::pipeline_layer_name(config, stage.layers.first),
               nn::pipeline_layer_name(config, stage.layers.last - 1), format_percent(stage.busy_share),
               format_bytes(static_cast<double>(stage.kv_cache_bytes)));
  }
}

// Under mpirun: one stage (or one tensor-parallel part of one) per process,
// the text and the figures on world rank 0 alone.
void run(GenerateCommand& command, bool stages_given, const runtime::MpiWorld* mpi) {
  const std::vector<std::string> texts = command.from_file ? read_prompts(command.prompts_file)
                                                            : std::vector<std::string>{command.prompt};
  std::vector<std::vector<std::int32_t>> tokens;
  for (const std::string& text : texts) tokens.push_back(nn::encode_text(text));
  const nn::SafetensorsFile weights = runtime::read_checkpoint(command.weights);
  const PartitionMethod partition = parse_partition_method(command.partition);
  const int t = command.tensor_parallel;
  if (t < 1) fail("--tensor-parallel {}: must be at least 1", t);
  if (mpi != nullptr) {
    if (mpi->size() % t != 0) {
      fail("mpirun -np {} with --tensor-parallel {}: the processes must be a multiple of it (stages x tensor "
           "parallel); start mpirun -np {}",
           mpi->size(), t, (mpi->size() / t + 1) * t);
    }
    if (stages_given && command.stages * t != mpi->size()) {
      fail("--stages {} and mpirun -np {}: under mpirun each process runs one stage{}; give --stages {} or leave it "
           "out",
           command.stages, mpi->size(), t > 1 ? fmt::format("'s part of {}", t) : "", mpi->size() / t);
    }
    command.stages = mpi->size() / t;
  }
  if (command.stages < 1) fail("--stages {}: must be at least 1", command.stages);
  const std::unique_ptr<runtime::RankGroup> group =
      runtime::RankGroup::make(mpi, {.pipeline = command.stages, .data_parallel = 1, .tensor = t});
  runtime::InferencePipeline pipeline(weights, *group, partition, command.format());
  const bool reporter = group->is_reporter();
  runtime::InferenceOptions options{
      .microbatches = command.microbatches, .sampling = command.sampling, .prefill_chunk = command.prefill_chunk};
  // One prompt streams: its tokens are printed as they come.
  const bool stream = reporter && texts.size() == 1 && !command.json;
  if (stream) {
    options.on_token = [prompt = one_line(texts[0])](const runtime::GeneratedToken& token) {
      if (token.step == 0) fmt::print("{}", prompt);  // once the prompt has passed every check
      fmt::print("{}", one_line(nn::decode_tokens(std::span(&token.token, 1))));
      std::fflush(stdout);
    };
  }
  const runtime::InferenceResult result = pipeline.generate(tokens, options);
  if (!reporter) return;
  if (command.json) {
    fmt::print("{}\n", json_text(to_json(texts, result, command, pipeline.config()), 2));
    return;
  }
  if (stream) {
    fmt::print("\n");
  } else {
    for (std::size_t i = 0; i < texts.size(); ++i) {
      fmt::print("{}{}\n", one_line(texts[i]), one_line(nn::decode_tokens(result.tokens[i])));
    }
  }
  print_report(texts, result, command, pipeline.config());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto command = std::make_shared<GenerateCommand>();
  CLI::App* sub = app.add_subcommand(
      "generate", "Continue prompts with a GPT-2 or Llama weights file: pipelined inference with a KV cache per stage");
  sub->add_option("--weights", command->weights,
                  "Weights (safetensors with the model shape in __metadata__), or a checkpoint of train: a "
                  "sharded step_N folder or its model.safetensors.index.json")
      ->required();
  auto* prompt = sub->add_option("--prompt", command->prompt,
                                 "Text to continue (byte-level; an empty prompt starts from a newline)");
  auto* prompts = sub->add_option("--prompts", command->prompts_file, "File of prompts, one a line");
  prompt->excludes(prompts);
  sub->add_option("--stages", command->stages,
                  "Pipeline stages (threads; under mpirun the processes), each with its layers' KV cache")
      ->capture_default_str();
  sub->add_option("--tensor-parallel,--tp", command->tensor_parallel,
                  "Ranks each stage is split over (Megatron-LM's tensor parallelism; threads, or processes under "
                  "mpirun)")
      ->capture_default_str();
  sub->add_option("--microbatches", command->microbatches,
                  "Groups of prompts circulating through the stages (at most the number of prompts)")
      ->capture_default_str();
  sub->add_option("--prefill-chunk", command->prefill_chunk,
                  "Tokens of a prompt per prefill chunk: the chunks follow each other through the stages, so the "
                  "first token comes sooner with more stages (0: the whole prompt in one piece)")
      ->check(prefill_chunk_validator())
      ->capture_default_str();
  sub->add_option("--partition", command->partition,
                  "How to cut the layers into stages (uniform, parameters, type:REGEX, balanced, counts:..., "
                  "bounds:...)")
      ->capture_default_str();
  sub->add_option("--max-new-tokens", command->sampling.new_tokens, "Tokens generated for every prompt")->required();
  sub->add_option("--temperature", command->sampling.temperature, "0: greedy; > 0: sample softmax(logits / T)")
      ->capture_default_str();
  sub->add_option("--top-k", command->sampling.top_k, "Sample only among the K most likely tokens (0: all)")
      ->capture_default_str();
  sub->add_option("--top-p", command->sampling.top_p,
                  "Sample only among the most likely tokens whose probabilities sum to P (1: all)")
      ->capture_default_str();
  sub->add_option("--seed", command->sampling.seed, "Seed of the sampling (each prompt its own stream)")
      ->check(non_negative_seed())
      ->capture_default_str();
  auto* bf16 = sub->add_flag("--bf16", command->bf16,
                             "Compute in bf16: weights and every layer's output rounded to it, norms, softmax and "
                             "the logits in fp32 (default fp32, whatever the weights' format)");
  sub->add_flag("--fp16", command->fp16, "Compute in fp16 (as --bf16; a value past 65504 overflows: an error)")
      ->excludes(bf16);
  sub->add_flag("--json", command->json, "Print one JSON object instead of text");
  sub->callback([command, sub] {
    if (sub->count("--prompt") == 0 && sub->count("--prompts") == 0) {
      fail("generate needs --prompt TEXT or --prompts FILE (one prompt a line)");
    }
    command->sampling.validate();
    command->from_file = sub->count("--prompts") > 0;
    const bool stages_given = sub->count("--stages") > 0;
    run_here_or_in_mpi_job([&](const runtime::MpiWorld* mpi) { run(*command, stages_given, mpi); });
  });
}

}  // namespace pipeflow::cli
