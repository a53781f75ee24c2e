// Pipelined prefill against its baselines, in one run: the time to first
// token of one long prompt (runtime/inference.h, InferenceOptions::
// prefill_chunk) by
//   A. 1 stage on 1 thread, the prompt in one piece (prefill_chunk 0);
//   B. 1 stage on 1 thread, in chunks of `--chunk` tokens;
//   C. P stages on P threads, the same chunks flowing through the stages;
//   D. P stages, the prompt in one piece (nothing overlaps: the stages take
//      turns).
// Alternately, `--rounds` times; per round C / A and C / B, printed as
// minimum / median / maximum with each run's own. Every run generates one
// token (the prefill's), greedy: the four must agree, and the largest
// relative difference of C's logits from A's is printed (a fast wrong answer
// shows). Beside it, the process CPU time of C over B: the work, whatever
// the load of other processes; and how many of C's stages computed at once
// (their busy time over its time): near P with a core per stage, near 1
// when other processes hold the cores.
//
//   bench_inference_prefill [--stages 2 --chunk 128 --prompt 1024 --layers 12 --heads 12 --width 768 --rounds 5]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "flags.h"
#include "pipeflow/nn/random.h"
#include "pipeflow/runtime/inference.h"

namespace {

using namespace pipeflow;

struct Options {
  int stages = 2;
  int chunk = 128;
  int prompt = 1024;
  // GPT-2 124M's shape (12 layers, width 768, 12 heads, context 1024) with
  // pipeflow's byte vocabulary.
  nn::ModelConfig model{.vocab_size = 256, .context = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768};
  int rounds = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  bench::parse_flags(argc, argv,
                         {{"--stages", &o.stages},
                          {"--chunk", &o.chunk},
                          {"--prompt", &o.prompt},
                          {"--layers", &o.model.n_layer},
                          {"--heads", &o.model.n_head},
                          {"--width", &o.model.n_embd},
                          {"--rounds", &o.rounds}});
  if (o.prompt > o.model.context) o.model.context = o.prompt;
  return o;
}

struct Spread {
  double min = 0, median = 0, max = 0;
};

Spread spread(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {values.front(), values[values.size() / 2], values.back()};
}

// One token after the prompt; its logits into `logits`.
runtime::InferenceResult first_token(runtime::InferencePipeline& pipeline, const std::vector<std::int32_t>& prompt,
                                     int chunk, std::vector<float>& logits) {
  runtime::InferenceOptions options{.sampling = {.new_tokens = 1}, .prefill_chunk = chunk};
  options.on_token = [&logits](const runtime::GeneratedToken& token) {
    logits.assign(token.logits.begin(), token.logits.end());
  };
  return pipeline.generate({prompt}, options);
}

double max_relative_difference(const std::vector<float>& got, const std::vector<float>& expected) {
  double largest = 0;
  double scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    largest = std::max(largest, std::abs(static_cast<double>(got[i]) - expected[i]));
    scale = std::max(scale, std::abs(static_cast<double>(expected[i])));
  }
  return scale > 0 ? largest / scale : largest;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  nn::Stage model(o.model, nn::all_layers(o.model));
  model.init_parameters(1);
  nn::Rng rng(5);
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(o.prompt));
  for (auto& token : prompt) token = static_cast<std::int32_t>(rng.below(256));
  runtime::InferencePipeline one(model, 1);
  runtime::InferencePipeline piped(model, o.stages);
  const int chunks = (o.prompt + o.chunk - 1) / o.chunk;
  std::printf("prefill: GPT-2 %d layers, width %d, %d heads; one prompt of %d tokens, chunks of %d (%d chunks); "
              "ideal on %d equal stages (%d + %d - 1) / (%d x %d) = %.3f\n",
              o.model.n_layer, o.model.n_embd, o.model.n_head, o.prompt, o.chunk, chunks, o.stages, chunks, o.stages,
              chunks, o.stages, (chunks + o.stages - 1.0) / (chunks * o.stages));
  std::vector<double> whole_one, chunked_one, chunked_piped, whole_piped, against_whole, against_chunked, cpu,
      overlap;
  double logits_difference = 0;
  int wrong = 0;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<float> a, b, c, d;
    const auto ta = first_token(one, prompt, 0, a);
    const std::clock_t b_from = std::clock();
    const auto tb = first_token(one, prompt, o.chunk, b);
    const std::clock_t c_from = std::clock();
    const auto tc = first_token(piped, prompt, o.chunk, c);
    const std::clock_t c_to = std::clock();
    const auto td = first_token(piped, prompt, 0, d);
    wrong += tb.tokens != ta.tokens || tc.tokens != ta.tokens || td.tokens != ta.tokens;
    logits_difference = std::max(logits_difference, max_relative_difference(c, a));
    whole_one.push_back(ta.time_to_first_token_s);
    chunked_one.push_back(tb.time_to_first_token_s);
    chunked_piped.push_back(tc.time_to_first_token_s);
    whole_piped.push_back(td.time_to_first_token_s);
    against_whole.push_back(tc.time_to_first_token_s / ta.time_to_first_token_s);
    against_chunked.push_back(tc.time_to_first_token_s / tb.time_to_first_token_s);
    cpu.push_back(static_cast<double>(c_to - c_from) / static_cast<double>(c_from - b_from));
    double busy = 0;
    for (const auto& stage : tc.stages) busy += stage.busy_s;
    overlap.push_back(busy / tc.seconds);
  }
  auto print = [](const char* what, const std::vector<double>& seconds) {
    const Spread s = spread(seconds);
    std::printf("  %-44s min %7.1f ms, median %7.1f ms, max %7.1f ms\n", what, 1e3 * s.min, 1e3 * s.median,
                1e3 * s.max);
  };
  print("A. 1 stage, whole prompt:", whole_one);
  print("B. 1 stage, chunked:", chunked_one);
  std::string label = "C. " + std::to_string(o.stages) + " stages, chunked (pipelined):";
  print(label.c_str(), chunked_piped);
  label = "D. " + std::to_string(o.stages) + " stages, whole prompt:";
  print(label.c_str(), whole_piped);
  const Spread wa = spread(against_whole);
  const Spread wb = spread(against_chunked);
  std::printf("  time to first token C / A over %d rounds: min %.3fx, median %.3fx, max %.3fx\n", o.rounds, wa.min,
              wa.median, wa.max);
  std::printf("  time to first token C / B over %d rounds: min %.3fx, median %.3fx, max %.3fx\n", o.rounds, wb.min,
              wb.median, wb.max);
  std::printf("  process CPU time C / B (the work, whatever the load): median %.2fx\n", spread(cpu).median);
  std::printf("  C's stages busy at once (their busy time / its time; %d: every stage busy throughout): median %.2f\n",
              o.stages, spread(overlap).median);
  std::printf("  rounds with different tokens: %d; C's logits against A's: max relative difference %.1e\n", wrong,
              logits_difference);
  return wrong == 0 ? 0 : 1;
}
