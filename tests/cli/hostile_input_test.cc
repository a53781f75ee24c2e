// Input meant to break pipeflow (deep JSON, endless files, files of the wrong
// kind) gets a clear error naming the file, the rule and the fix: no crash,
// no "internal error", no unbounded memory.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../trace/xml_check.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/safetensors.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

const std::string kDeep(100'000, '[');

void expect_error(const CommandResult& result, const std::string& part) {
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_NE(result.err.find(part), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("internal error"), std::string::npos) << result.err;
}

// 100 000 nested '[' used to overflow the stack (SIGSEGV) in every JSON reader.
TEST(HostileInput, DeepJsonIsAnErrorInEveryReader) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/deep.json", kDeep);
  write_file_atomic(dir + "/config.json", "{\"n_layer\": " + kDeep);
  const std::string deep = "JSON nested deeper than the limit of 64 levels";
  expect_error(run_pipeflow("train --config " + dir + "/deep.json"), dir + "/deep.json: " + deep);
  expect_error(run_pipeflow("simulate --config " + dir + "/deep.json"), dir + "/deep.json: " + deep);
  expect_error(run_pipeflow("simulate --model " + dir + "/config.json"), dir + "/config.json: " + deep);
  expect_error(run_pipeflow("validate " + dir + "/deep.json"), "deep.json: " + deep);
}

// /dev/zero used to grow to the memory limit, then "internal error: std::bad_alloc".
TEST(HostileInput, EndlessFilesFailAtTheirSizeLimit) {
  expect_error(run_pipeflow("validate /dev/zero"), "/dev/zero: more than 67108864 bytes, the limit for a schedule file");
  expect_error(run_pipeflow("simulate --config /dev/zero"),
               "/dev/zero: more than 16777216 bytes, the limit for a configuration file");
}

// Used to take 89 s and 5 GB for a 1.3 GB file (at 2048 x 2048).
TEST(HostileInput, OutputsThatGrowWithTheInputAreRefusedNamingTheFix) {
  expect_error(run_pipeflow("schedule --schedule gpipe --stages 512 --microbatches 512 --format svg"),
               "an SVG timeline of 524288 events is more than the limit of 200000");
  expect_error(run_pipeflow("schedule --schedule gpipe --stages 1024 --microbatches 1024"),
               "cells, more than the limit of 1000000: use fewer stages or micro-batches, or --format csv");
}

// Used to be "internal error: filesystem error".
TEST(HostileInput, AnOutDirThatIsAFileIsRefusedByKey) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/taken", "a file");
  write_file_atomic(dir + "/run.json", R"({"model": "gpt2-124m", "out_dir": ")" + dir + R"(/taken"})");
  expect_error(run_pipeflow("train --config " + dir + "/run.json"),
               "out_dir = \"" + dir + "/taken\": names a file, not a directory: choose another out_dir");
}

// `from`'s tensors, each through `edit`, and its metadata with `metadata`
// over it, written to `to` (with CRCs of the new values).
void rewrite_weights(const std::string& from, const std::string& to,
                     const std::function<void(const std::string&, Tensor&)>& edit,
                     const std::map<std::string, std::string>& metadata = {}) {
  const nn::SafetensorsFile file = nn::SafetensorsFile::read(from);
  nn::SafetensorsWriter writer;
  for (const std::string& name : file.names()) {
    Tensor values = file.floats(name);
    edit(name, values);
    writer.add(name, values.span(), values.shape());
  }
  for (const auto& [key, text] : file.metadata()) {
    if (!key.starts_with("crc32.")) writer.set_metadata(key, metadata.contains(key) ? metadata.at(key) : text);
  }
  writer.write(to);
}

// A batch for grad: 2 sequences of 8 tokens and their next tokens.
void write_batch(const std::string& path) {
  std::vector<std::int32_t> tokens(18);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i);
  nn::SafetensorsWriter writer;
  writer.add("tokens", tokens, {2, 9});
  writer.write(path);
}

// Used to generate from all-NaN weights, exiting 0 with token 0 after token 0.
TEST(HostileInput, GenerateAndGradRefuseWeightsThatAreNotFiniteNamingTheTensor) {
  const std::string dir = make_temp_dir();
  const std::string weights = dir + "/w.safetensors", nan = dir + "/nan.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 2 --heads 2 --width 32 --context 32 --seed 1 --out " + weights).exit_code, 0);
  rewrite_weights(weights, nan, [](const std::string&, Tensor& values) {
    for (float& v : values.span()) v = std::nanf("");
  });
  const std::string refused = nan + ": tensor wte.weight holds nan at index 0: values must be finite; start from "
                                    "another file or an earlier checkpoint";
  expect_error(run_pipeflow("generate --weights " + nan + " --prompt 'the cat' --max-new-tokens 4"), refused);
  expect_error(run_pipeflow("generate --weights " + nan + " --prompt 'the cat' --max-new-tokens 4 --stages 2"), refused);

  rewrite_weights(weights, nan, [](const std::string& name, Tensor& values) {
    if (name == "h.1.mlp.c_proj.weight") values.span()[5] = -INFINITY;
  });
  write_batch(dir + "/batch.safetensors");
  const std::string one = nan + ": tensor h.1.mlp.c_proj.weight holds -inf at index 5: values must be finite";
  expect_error(run_pipeflow("generate --weights " + nan + " --prompt a --max-new-tokens 1"), one);
  expect_error(run_pipeflow("grad --weights " + nan + " --batch " + dir + "/batch.safetensors --out " + dir +
                            "/g.safetensors"),
               one);
  EXPECT_FALSE(std::filesystem::exists(dir + "/g.safetensors"));
}

// A file of 6 blocks whose metadata says 2 used to load as its first 2
// blocks, silently, in generate, grad and train --weights.
TEST(HostileInput, WeightsWithMoreBlocksThanTheirMetadataSaysAreRefused) {
  const std::string dir = make_temp_dir();
  const auto keep = [](const std::string&, Tensor&) {};
  const std::string six = dir + "/six.safetensors", wrong = dir + "/wrong.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 6 --heads 2 --width 32 --context 32 --seed 1 --out " + six).exit_code, 0);
  rewrite_weights(six, wrong, keep, {{"n_layer", "2"}});
  const std::string refused =
      wrong + ": tensor h.2.ln_1.weight is not a parameter of the model its metadata describes (GPT-2, 2 layers, "
              "width 32, 2 heads, context 32, vocabulary 256): a file whose tensors the model does not all take is "
              "another model's, or its metadata is wrong; give this model's weights, or correct n_layer in its "
              "metadata";
  expect_error(run_pipeflow("generate --weights " + wrong + " --prompt a --max-new-tokens 1"), refused);
  write_batch(dir + "/batch.safetensors");
  expect_error(run_pipeflow("grad --weights " + wrong + " --batch " + dir + "/batch.safetensors --out " + dir +
                            "/g.safetensors --schedule 1f1b --stages 2 --microbatches 2"),
               refused);
  write_file_atomic(dir + "/run.json", R"({"steps": 1, "eval_interval": 0, "gradient_accumulation_steps": 2})");
  expect_error(run_pipeflow("train --config " + dir + "/run.json --weights " + wrong + " --out-dir " + dir + "/out"),
               refused);

  // Hugging Face's names: a Llama whose metadata says 1 block of its 3.
  const std::string llama = dir + "/llama.safetensors";
  ASSERT_EQ(run_pipeflow("init --arch llama --layers 3 --heads 2 --width 32 --context 32 --seed 1 --out " + llama)
                .exit_code,
            0);
  rewrite_weights(llama, wrong, keep, {{"n_layer", "1"}});
  expect_error(run_pipeflow("generate --weights " + wrong + " --prompt a --max-new-tokens 1"),
               wrong + ": tensor model.layers.1.input_layernorm.weight is not a parameter of the model its metadata "
                       "describes (Llama, 1 layers");
}

// Used to be accepted: only the Llama path checked it.
TEST(HostileInput, Gpt2WidthMustBeAMultipleOfHeads) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/config.json",
                    R"({"model_type": "gpt2", "n_layer": 12, "n_head": 7, "n_embd": 768, "n_positions": 1024,
                        "vocab_size": 50257})");
  expect_error(run_pipeflow("simulate --model " + dir + "/config.json --pp 1"),
               "hidden = 768: must be a multiple of heads (7)");
}

// Used to overwrite the weights silently.
TEST(HostileInput, GradOutMayNotBeTheWeights) {
  const std::string dir = make_temp_dir();
  const std::string weights = dir + "/w.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 1 --width 8 --context 4 --seed 1 --out " + weights).exit_code, 0);
  const std::string before = read_file(weights);
  expect_error(run_pipeflow("grad --weights " + weights + " --batch " + weights + " --out " + dir + "/./w.safetensors"),
               "is the file of --weights " + weights + ": writing it would replace what is read; choose another --out");
  EXPECT_EQ(read_file(weights), before);
}

TEST(HostileInput, GradOutMayNotBeTheBatch) {
  const std::string dir = make_temp_dir();
  const std::string weights = dir + "/w.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 1 --width 8 --context 4 --seed 1 --out " + weights).exit_code, 0);
  const std::string batch = dir + "/batch.safetensors";
  write_file_atomic(batch, read_file(weights));  // any file: the check comes before it is read
  const std::string before = read_file(batch);
  expect_error(run_pipeflow("grad --weights " + weights + " --batch " + batch + " --out " + batch),
               "is the file of --batch " + batch + ": writing it would replace what is read; choose another --out");
  EXPECT_EQ(read_file(batch), before);
}

// An output onto an input replaced the input: every command refuses it
// and leaves the input as it was.
TEST(HostileInput, NoCommandWritesOverWhatItReads) {
  const std::string dir = make_temp_dir();
  const std::string config = dir + "/c.json";
  write_file_atomic(config, read_file(std::string(PIPEFLOW_SOURCE_DIR) + "/examples/simulate/gpt-tiny-1f1b-cpu.json"));
  const std::string before = read_file(config);
  expect_error(run_pipeflow("simulate --config " + config + " --trace " + dir + "/./c.json"),
               "is the file of --config " + config + ": writing it would replace what is read; choose another --trace");
  expect_error(run_pipeflow("plan --model " + config + " --devices 2 --global-batch 4 --seq 32 --write-config " + config),
               "is the file of --model " + config + ": writing it would replace what is read");
  EXPECT_EQ(read_file(config), before);

  ASSERT_EQ(run_pipeflow("simulate --config " + config + " --trace " + dir + "/t.json").exit_code, 0);
  const std::string trace = read_file(dir + "/t.json");
  expect_error(run_pipeflow("analyze " + dir + "/t.json --html " + dir + "/t.json"),
               "is the file of the trace " + dir + "/t.json: writing it would replace what is read");
  EXPECT_EQ(read_file(dir + "/t.json"), trace);

  const std::string weights = dir + "/w/weights.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 2 --heads 2 --width 32 --context 32 --seed 1 --out " + weights).exit_code, 0);
  const std::string init = read_file(weights);
  write_file_atomic(dir + "/run.json", R"({"steps": 1, "eval_interval": 0, "gradient_accumulation_steps": 2})");
  expect_error(run_pipeflow("train --config " + dir + "/run.json --weights " + weights + " --out-dir " + dir + "/w"),
               "out_dir's " + dir + "/w/weights.safetensors is the file of --weights " + weights);
  EXPECT_EQ(read_file(weights), init);
}

// A metrics.jsonl of 100 000 nested '[' in the out_dir of a resumed run
// used to go to nlohmann's parser without a depth limit.
TEST(HostileInput, ADeeplyNestedMetricsLineIsNoMetricsLine) {
  const std::string dir = make_temp_dir();
  const std::string out = dir + "/out";
  write_file_atomic(dir + "/run.json", R"({"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_ctx": 4,
    "vocab_size": 256}, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "steps": 1,
    "checkpoint": {"interval": 1}, "out_dir": ")" + out + R"("})");
  ASSERT_EQ(run_pipeflow("train --config " + dir + "/run.json").exit_code, 0);
  write_file_atomic(out + "/metrics.jsonl", std::string(100000, '[') + "\n");
  expect_error(run_pipeflow("train --config " + dir + "/run.json --steps 2 --resume " + out),
               "metrics.jsonl line 1 is no metrics line (JSON with a \"step\")");
}

// data.path at /dev/zero used to be read without end.
TEST(HostileInput, AnEndlessCorpusFailsAtTheCap) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/run.json", R"({"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_ctx": 4,
    "vocab_size": 256}, "data": {"path": "/dev/zero"}, "steps": 1, "out_dir": ")" + dir + R"(/out"})");
  expect_error(run_pipeflow("train --config " + dir + "/run.json"),
               "/dev/zero: more than 67108864 bytes, the limit for a training corpus");
}

const std::string kTinyRun = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/simulate/gpt-tiny-1f1b-cpu.json";

// A trace of simulate whose run's configuration has `key` (a JSON pointer)
// set to `value`, written to `path`.
void write_trace_naming(const std::string& dir, const std::string& path, const std::string& key,
                        const std::string& value) {
  ASSERT_EQ(run_pipeflow("simulate --config " + kTinyRun + " --trace " + dir + "/t.json").exit_code, 0);
  nlohmann::json trace = nlohmann::json::parse(read_file(dir + "/t.json"));
  nlohmann::json& config = trace["otherData"]["pipeflow"]["config"];
  config[nlohmann::json::json_pointer(key)] = value;
  if (key == "/pipeline/schedule_file") config["pipeline"].erase("schedule");
  write_file_atomic(path, trace.dump());
}

// A trace naming /etc/passwd as its model or schedule file used to have
// analyze open it and print its first line in the error.
TEST(HostileInput, ATraceNamesOnlyFilesBesideItOrUnderTheWorkingDirectory) {
  const std::string dir = make_temp_dir();
  const std::string trace = dir + "/evil.json";
  const std::string rule = ": a trace names only files beside it (" + dir +
                           " or below) or under the working directory: copy the file beside the trace and name it so";
  for (const char* key : {"/model", "/pipeline/schedule_file"}) {
    SCOPED_TRACE(key);
    write_trace_naming(dir, trace, key, "/etc/passwd");
    const CommandResult result = run_pipeflow("analyze " + trace);
    const std::string name = std::string(key) == "/model" ? "model" : "pipeline.schedule_file";
    expect_error(result, trace + ": otherData.pipeflow.config." + name + " = \"/etc/passwd\"" + rule);
    EXPECT_EQ(result.err.find("root"), std::string::npos) << result.err;
    // A link beside the trace is followed to where it leads.
    std::filesystem::create_symlink("/etc/passwd", dir + "/link.json");
    write_trace_naming(dir, trace, key, dir + "/link.json");
    expect_error(run_pipeflow("analyze " + trace), "config." + name + " = \"" + dir + "/link.json\"" + rule);
    std::filesystem::remove(dir + "/link.json");
  }
  // Beside the trace: read (a model read from config.json, a schedule file as written).
  write_file_atomic(dir + "/sub/config.json", R"({"model_type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 128,
    "n_positions": 64, "vocab_size": 256})");
  write_trace_naming(dir, trace, "/model", dir + "/sub/../sub/config.json");
  const CommandResult beside = run_pipeflow("analyze " + trace);
  EXPECT_EQ(beside.exit_code, 0) << beside.err;
  ASSERT_EQ(run_pipeflow("schedule --schedule 1f1b --stages 2 --microbatches 8 --format json -o " + dir + "/s.json")
                .exit_code,
            0);
  write_trace_naming(dir, trace, "/pipeline/schedule_file", "s.json");  // relative: under the working directory
  EXPECT_EQ(run_pipeflow("analyze " + trace, dir).exit_code, 0);
}

// A schedule's name with control characters (\x01, an escape sequence)
// used to make the SVG ill-formed XML.
TEST(HostileInput, ControlCharactersInAScheduleNameLeaveTheSvgWellFormed) {
  const std::string dir = make_temp_dir();
  ASSERT_EQ(run_pipeflow("schedule --schedule 1f1b --stages 2 --microbatches 8 --format json -o " + dir + "/s.json")
                .exit_code,
            0);
  nlohmann::json schedule = nlohmann::json::parse(read_file(dir + "/s.json"));
  schedule["name"] = "1f1b\x01\x1b[31mred\x7f";
  write_file_atomic(dir + "/s.json", schedule.dump());
  const CommandResult result = run_pipeflow("simulate --config " + kTinyRun + " --schedule-file " + dir +
                                            "/s.json --svg " + dir + "/t.svg");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string svg = read_file(dir + "/t.svg");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("1f1b\uFFFD\uFFFD[31mred\x7f"), std::string::npos);
}

// A path that is not UTF-8 used to end in "internal error:
// [json.exception.type_error.316] invalid UTF-8 byte" when pipeflow wrote
// it into JSON: a message's value, run_config.json, profile.json.
TEST(HostileInput, PathsThatAreNotUtf8WorkOrAreRefusedCleanly) {
  const std::string dir = make_temp_dir();
  expect_error(run_pipeflow("simulate --config " + kTinyRun + " --schedule-file " + dir + "/\xff.json"),
               "pipeline.schedule_file = \"" + dir + "/\uFFFD.json\": cannot read " + dir + "/\xff.json");
  write_file_atomic(dir + "/run\xff.json", R"({"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_ctx": 4,
    "vocab_size": 256}, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "steps": 1, "eval_interval": 0})");
  const CommandResult trained =
      run_pipeflow("train --config " + dir + "/run\xff.json --out-dir " + dir + "/out\xff");
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_NE(read_file(dir + "/out\xff/run_config.json").find("out\uFFFD"), std::string::npos);
  EXPECT_NE(read_file(dir + "/out\xff/profile.json").find("run\uFFFD.json"), std::string::npos);
}

// A value of 100 KB used to be echoed whole, once or twice; an out_dir of
// 5 MB ended in "internal error: filesystem error: status: File name too long".
TEST(HostileInput, ErrorsQuoteALongValueCutAndNeverEchoItWhole) {
  const std::string dir = make_temp_dir();
  ASSERT_EQ(run_pipeflow("simulate --config " + kTinyRun + " --trace " + dir + "/t.json").exit_code, 0);
  const std::string value(100'000, 'x');
  const std::string cut = "\"" + std::string(200, 'x') + "\"... (100000 bytes)";
  for (const std::string& arguments :
       {"simulate --config " + kTinyRun + " --model " + value, "simulate --config " + kTinyRun + " --hardware " + value,
        "simulate --config " + kTinyRun + " --stages " + value, "schedule --schedule " + value +
        " --stages 2 --microbatches 2", "generate --weights " + value + " --prompt a --max-new-tokens 1",
        "analyze " + value, "sweep --config " + kTinyRun + " --vary " + value,
        "train --config " + kTinyRun + " --resume " + value, "analyze " + dir + "/t.json --config " + value,
        "schedule --schedule gpipe --stages 2 --microbatches 2 --format " + value}) {
    SCOPED_TRACE(arguments.substr(0, 60));
    const CommandResult result = run_pipeflow(arguments);
    EXPECT_NE(result.exit_code, 0);
    EXPECT_LT(result.err.size(), 2000u) << result.err.substr(0, 2000);
    EXPECT_EQ(result.err.find("internal error"), std::string::npos) << result.err.substr(0, 2000);
  }
  expect_error(run_pipeflow("simulate --config " + kTinyRun + " --model " + value), "unknown model " + cut);

  nlohmann::json run = nlohmann::json::parse(read_file(kTinyRun));
  run["out_dir"] = "/" + std::string(5 << 20, 'x');
  run["steps"] = 1;
  write_file_atomic(dir + "/run.json", run.dump());
  const CommandResult result = run_pipeflow("train --config " + dir + "/run.json");
  expect_error(result, "out_dir \"/" + std::string(199, 'x') + "\"... (5242881 bytes): a path of 5242881 bytes, "
                       "more than the system's limit of 4096: give a shorter path");
  EXPECT_LT(result.err.size(), 2000u);
}

// std::filesystem's tests throw on a path they cannot look at: these used to
// end in "internal error: filesystem error: status: ...".
TEST(HostileInput, PathsThatCannotBeLookedAtAreErrorsNamingTheReason) {
  const std::string dir = make_temp_dir();
  std::filesystem::create_symlink("loop", dir + "/loop");  // a link to itself
  const std::string loop = dir + "/loop/x";
  const std::string reason = "Too many levels of symbolic links";
  expect_error(run_pipeflow("generate --weights " + loop + " --prompt a --max-new-tokens 1"), reason);
  expect_error(run_pipeflow("train --config " + kTinyRun + " --weights " + loop + " --steps 1"), reason);
  expect_error(run_pipeflow("train --config " + kTinyRun + " --resume " + loop + " --steps 1"),
               "checkpoint.load = \"" + loop + "\": no such file or directory");
  expect_error(run_pipeflow("train --config " + kTinyRun + " --steps 1 --out-dir " + loop),
               "out_dir " + loop + ": cannot create it: " + reason);
  expect_error(run_pipeflow("simulate --config " + kTinyRun + " --profile " + loop), ": no such file or folder");
  // A Megatron-LM launch line longer than a file name may be is a line, not a file.
  const CommandResult megatron = run_pipeflow(
      "simulate --megatron-args '--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 "
      "--max-position-embeddings 64 --micro-batch-size 1 --global-batch-size 8 --pipeline-model-parallel-size 2 "
      "--tokenizer-model " +
      std::string(300, 'x') + "'");
  EXPECT_EQ(megatron.exit_code, 0) << megatron.err;
}

// Used to print every stage count up to --devices: 146 MB in 15 s.
TEST(HostileInput, AnInferencePlanListsTheBestStageCountsWhateverTheDevices) {
  const CommandResult r = run_pipeflow("plan --inference --model llama3-70b --devices 1000000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.out.size(), 2000u) << r.out;
  EXPECT_NE(r.out.find("75 more stage counts fit: --top 80 lists them all\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  83 .. 1000000 stages: more than the 82 pipeline layers of llama3-70b (embedding, 80 "
                       "blocks, head), and every stage needs one\n"),
            std::string::npos)
      << r.out;
}

// 0 and negative counts used to mean "the default" (--context -1 priced the
// model's context); each is refused naming the flag, the value and the rule.
TEST(HostileInput, EveryInferenceCountBelowOneIsRefusedNamingTheFlag) {
  const std::string dir = make_temp_dir();
  const std::string weights = dir + "/w.safetensors";
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 1 --width 8 --context 8 --seed 1 --out " + weights).exit_code, 0);
  const std::string simulate = "simulate --inference --model gpt2-124m --stages 2";
  const std::string plan = "plan --inference --model gpt2-124m --devices 2";
  const std::string generate = "generate --weights " + weights + " --prompt a";
  const std::string two_tokens = generate + " --max-new-tokens 2";
  const std::pair<std::string, std::string> cases[] = {
      {simulate + " --context -1", "--context -1: must be >= 1 (tokens the KV cache holds per sequence)"},
      {simulate + " --context 0", "--context 0: must be >= 1"},
      {simulate + " --sequences 0", "--sequences 0: must be >= 1 (concurrent sequences)"},
      {simulate + " --sequences -3", "--sequences -3: must be >= 1"},
      {simulate + " --prompt-tokens 0", "--prompt-tokens 0: must be >= 1 (tokens of each prompt)"},
      {simulate + " --prompt-tokens -1", "--prompt-tokens -1: must be >= 1"},
      {simulate + " --microbatches 0", "--microbatches 0: must be >= 1 (groups of sequences"},
      {simulate + " --microbatches -1", "--microbatches -1: must be >= 1"},
      {simulate + " --context 2048", "context = 2048: gpt2-124m has a position table of 1024 positions"},
      {plan + " --context -1", "--context -1: must be >= 1"},
      {plan + " --context 0", "--context 0: must be >= 1"},
      {plan + " --sequences 0", "--sequences 0: must be >= 1"},
      {plan + " --prompt-tokens -1", "--prompt-tokens -1: must be >= 1"},
      {plan + " --seq 0", "--seq 0: must be >= 1"},
      {plan + " --seq -5", "--seq -5: must be >= 1"},
      {plan + " --top 0", "top = 0: must be >= 1 (the stage counts to list)"},
      // A setup no stage count runs: refused once, not once per stage count.
      {plan + " --context 2048", "context = 2048: gpt2-124m has a position table of 1024 positions"},
      {two_tokens + " --stages 0", "--stages 0: must be at least 1"},
      {two_tokens + " --stages -1", "--stages -1: must be at least 1"},
      {two_tokens + " --tp 0", "--tensor-parallel 0: must be at least 1"},
      {two_tokens + " --microbatches 0", "--microbatches 0: must lie in [1, 1]"},
      {two_tokens + " --microbatches -1", "--microbatches -1: must lie in [1, 1]"},
      {generate + " --max-new-tokens 0", "--max-new-tokens 0: must be at least 1"},
      {generate + " --max-new-tokens -1", "--max-new-tokens -1: must be at least 1"},
      {two_tokens + " --top-k -1", "--top-k -1: must be >= 0"},
      {two_tokens + " --top-p 0", "--top-p 0: must lie in (0, 1]"},
      {two_tokens + " --temperature -1", "--temperature -1: must be a finite number >= 0"},
  };
  for (const auto& [arguments, message] : cases) {
    SCOPED_TRACE(arguments);
    expect_error(run_pipeflow(arguments), message);
  }
  // Without --inference they used to be ignored.
  expect_error(run_pipeflow("simulate --model gpt2-124m --context 512"),
               "--context, --sequences, --prompt-tokens, --prefill-chunk and --microbatches shape a generation: add "
               "--inference");
  expect_error(run_pipeflow("plan --model gpt2-124m --devices 1 --global-batch 8 --seq 1024 --sequences 4"),
               "--context, --sequences, --prompt-tokens and --prefill-chunk shape a generation: add --inference");
}

// 4 stages x 1048576 micro-batches used to end in std::bad_alloc (at 3 GB
// under ulimit -v 4000000; about 12 GB without): the trace of 8388608
// actions was built in memory first. Refused past the limits, before the
// timeline is built; here just past them.
TEST(HostileInput, ATraceTooLargeToWriteIsRefusedBeforeItIsBuilt) {
  const std::string dir = make_temp_dir();
  const std::string simulate = "simulate --model gpt2-124m --pp 4 --micro-batch 1";
  expect_error(run_pipeflow(simulate + " --global-batch 131072 --trace " + dir + "/t.json"),
               "a Chrome trace of 1048576 events (about 140 MiB of JSON, 1.46 GiB of memory to write) is more than "
               "the limit of 1000000: lower the micro-batches (--global-batch, --micro-batch) or the stages (--pp), or "
               "leave out --trace");
  EXPECT_FALSE(std::filesystem::exists(dir + "/t.json"));
  expect_error(run_pipeflow(simulate + " --global-batch 32768 --svg " + dir + "/t.svg"),
               "an SVG timeline of 262144 events is more than the limit of 200000 (about 60 MB, more than a browser "
               "draws): lower the micro-batches (--global-batch, --micro-batch) or the stages (--pp), or leave out "
               "--svg");
  // --inference's groups: 2^31 - 1 of them used to be sized before the schedule's limit refused them.
  expect_error(run_pipeflow("simulate --inference --model gpt2-124m --sequences 2147483647 --microbatches 2147483647"),
               "schedule inference is too large: 1 stages x 2147483647 microbatches = 2147483647 (stage, micro-batch) "
               "pairs, more than the limit of 4194304: use fewer stages or microbatches");
}

// --seconds 1e9 used to measure for 126 years; NaN and infinity passed CLI11's
// PositiveNumber. ulimit -t: a run that measures ends (and fails) within 10 s.
TEST(HostileInput, CalibrateSecondsAreBounded) {
  for (const std::string seconds : {"1e9", "61", "0", "-1", "nan", "inf"}) {
    const CommandResult r = run_pipeflow("calibrate --seconds " + seconds, "", "ulimit -t 10");
    expect_error(r, ": must be in (0, 60] (seconds for each of the seven measurements");
    EXPECT_EQ(r.err.rfind("pipeflow: error: --seconds ", 0), 0u) << r.err;
  }
}

TEST(HostileInput, CalibrateGemmShapesAreBounded) {
  for (const std::string width : {"0", "7", "4097", "-128"}) {
    const CommandResult r = run_pipeflow("calibrate --seconds 0.01 --gemm-width " + width, "", "ulimit -t 10");
    expect_error(r, "--gemm-width " + width + ": must be in [8, 4096] (the model width C");
    expect_error(r, "pass your model's n_embd");
  }
  for (const std::string rows : {"0", "512,0", "8193", "-1"}) {
    const CommandResult r = run_pipeflow("calibrate --seconds 0.01 --gemm-rows " + rows, "", "ulimit -t 10");
    expect_error(r, ": each row count must be in [1, 8192] (micro-batch × sequence length, or a decode group's rows)");
    EXPECT_EQ(r.err.rfind("pipeflow: error: --gemm-rows ", 0), 0u) << r.err;
  }
  for (const auto& [flag, value, word] :
       {std::tuple{"--gemm-rows", "512,many", "many"}, std::tuple{"--gemm-rows", "512,,8", ""},
        std::tuple{"--gemm-rows", "5e2", "5e2"}, std::tuple{"--gemm-width", "wide", "wide"},
        std::tuple{"--gemm-width", "128.5", "128.5"}}) {
    const CommandResult r = run_pipeflow(fmt::format("calibrate --seconds 0.01 {} {}", flag, value));
    expect_error(r, fmt::format("{} {}: '{}' is not a whole number: give ", flag, value, word));
  }
  expect_error(run_pipeflow("calibrate --gemm-rows 512,x"), "e.g. --gemm-rows 512,8");
  expect_error(run_pipeflow("calibrate --gemm-width x"), "e.g. your model's n_embd (128)");
}

// One prompt per line of a file of a million used to ask for every prompt's
// kv cache at once; they run in passes of bounded memory, every prompt
// answered. The file itself is bounded (/dev/zero).
TEST(HostileInput, AMillionPromptsRunInPassesOfBoundedMemory) {
  const std::string dir = make_temp_dir();
  const std::string weights = dir + "/w.safetensors";
  // 4 MiB of kv cache a prompt: 300 prompts are 1.2 GiB, more than a pass holds.
  ASSERT_EQ(run_pipeflow("init --layers 1 --heads 8 --width 512 --context 1024 --seed 1 --out " + weights).exit_code,
            0);
  std::string prompts;
  for (int i = 0; i < 300; ++i) prompts += "a\n";
  write_file_atomic(dir + "/prompts.txt", prompts);
  const CommandResult r =
      run_pipeflow("generate --weights " + weights + " --prompts " + dir + "/prompts.txt --max-new-tokens 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["outputs"].size(), 300u);
  EXPECT_EQ(json["passes"], 2);
  EXPECT_LE(json["stages"][0]["kv_cache_bytes"].get<std::int64_t>(), std::int64_t{1} << 30);
  expect_error(run_pipeflow("generate --weights " + weights + " --prompts /dev/zero --max-new-tokens 1"),
               "/dev/zero: more than 16777216 bytes, the limit for a prompts file");
}

}  // namespace
}  // namespace pipeflow::testing
