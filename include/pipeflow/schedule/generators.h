#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// Schedule generators: pure functions (no I/O, no threads, no global state)
// that build compute-only schedules (F/B/I/W; lower them with
// insert_send_recv). `ranks` is the number of pipeline ranks (devices) p,
// `microbatches` the micro-batches per step m, `chunks_per_rank` the model
// chunks per rank v. Inputs that break a schedule's constraint throw
// pipeflow::Error naming the rule and the fix; no generator returns a
// schedule that can hang.
//
// Closed forms below are for unit costs per chunk (F = 1, B = 2, I = W = 1,
// no transfer time); "peak in-flight" counts micro-batch chunks whose F has
// run and whose B/I has not finished (the activation memory a rank holds);
// "until W" counts until the W (or B) has finished. validate() measures both
// and the tests check them against these bounds for every p in 1..8 and m in
// 1..4p the constraints accept.

// GPipe (Huang et al. 2019; PyTorch ScheduleGPipe): all m forwards, then all
// m backwards in the same order (fill-drain). Any p, m >= 1.
// Makespan 3(m + p - 1); bubble (p - 1)/(m + p - 1); peak in-flight m.
Schedule make_gpipe(int ranks, int microbatches);

// 1F1B, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient
// Pipeline-Parallel DNN Training"; Megatron-LM §2.2; PyTorch Schedule1F1B):
// rank r runs p - r - 1 warm-up forwards (Megatron-core's num_warmup), then
// alternates one forward and one backward, then drains the backwards. Needs
// m >= p (PyTorch raises; a smaller m hangs torchtitan #775).
// Makespan 3(m + p - 1), as GPipe; peak in-flight min(p - r, m) = p - r.
Schedule make_1f1b(int ranks, int microbatches);

// Interleaved 1F1B (Narayanan et al. 2021 §2.2.2), ordered as Megatron-core's
// forward_backward_pipelining_with_interleaving: loop placement (rank r holds
// stages r, r + p, ...), forwards walk the "schedule table" -- micro-batch
// groups of g, each group through chunk 0, then chunk 1, ... -- and backwards
// walk it with the chunks reversed. Rank r runs
//   warmup = min((p - r - 1) * 2 + (v - 1) * g, m * v)
// forwards, then one forward and one backward, then the remaining backwards.
// g is Megatron-core's microbatch_group_size_per_vp_stage: it must lie in
// [p, m], and m % g must be 0 or >= p. `microbatch_group` 0 picks the smallest
// valid g (Megatron-core's default g = p whenever m % p == 0), so every m >= p
// is accepted, as Megatron-core accepts it with a suitable g. v = 1 is plain
// 1F1B (Megatron-core's non-interleaved path, warm-up p - r - 1).
// Makespan 3(v m + p - 1) chunk units (bubble (p - 1)/(v m) of the ideal);
// peak in-flight min(2(p - r - 1) + (v - 1) g + 1, v m) for v >= 2.
Schedule make_interleaved_1f1b(int ranks, int microbatches, int chunks_per_rank, int microbatch_group = 0);

// The micro-batch group make_interleaved_1f1b uses when given 0: the
// smallest g in [p, m] with m % g == 0 or m % g >= p. Throws if m < p.
int interleaved_microbatch_group(int ranks, int microbatches);

// Looped BFS, breadth-first pipeline parallelism (Lamy-Poirier 2023,
// arXiv:2211.05953; PyTorch ScheduleLoopedBFS): loop placement; each rank
// runs every micro-batch's forward through its first chunk, then its second,
// ...; then the backwards chunk by chunk in reverse, micro-batches in reverse
// order. Any p, m, v >= 1.
// Makespan 3((v - 1) max(m, p) + m + p - 1); peak in-flight v m.
Schedule make_looped_bfs(int ranks, int microbatches, int chunks_per_rank);

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1, Fig. 3;
// sail-sg/zero-bubble-pipeline-parallelism; PyTorch's ZB1P ordering): 1F1B
// with each B split into I and W; rank r keeps the warm-up of 1F1B, runs
// its first r I's without their W, then follows every I with the oldest
// pending W, and ends with the r deferred W's. Needs m >= p.
// Makespan 3m + p - 1 with F = I = W = 1 (1F1B with B = 2: 3m + 3(p - 1)):
// idle per rank (p - 1)(F + I - W) = p - 1. Peak in-flight p - r (as 1F1B);
// until W: p on every rank.
Schedule make_zb_h1(int ranks, int microbatches);

// ZB-H2 (Qi et al. 2023 §3.1, Fig. 4): rank r fills the warm-up with
// min(2(p - r) - 1, m) forwards, then repeats I, W, F, deferring the W of its
// first d_r = max(0, 2r - max(0, 2p - 1 - m)) I's to the end so that the tail becomes
// a parallelogram. Needs m >= p.
// Makespan 3m + p - 1 with F = I = W = 1, and for m >= 2p - 1 every rank is
// busy without a gap from its first action to its last (rank r: [r, r + 3m]):
// the paper's zero bubble (p - 1)(F + I - 2W) = 0. Peak in-flight
// min(2(p - r) - 1, m); until W: min(2p - 1, m).
Schedule make_zb_h2(int ranks, int microbatches);

// ZB-V (Qi et al. 2023 §6; sail-sg zero-bubble README; PyTorch
// ScheduleZBVZeroBubble): V placement, 2 chunks per rank (stages r and
// 2p - 1 - r); warm-up 2(p - r) - 1 forwards of chunk 0, r pairs (F1, F0),
// p - r triples (F1, I1, W1), a steady state F0 I0 W0 F1 I1 W1, and a
// cool-down of I0 I1 pairs and I0 W0 pairs, then the pending W's.
// Needs m >= 2p.
// Makespan 6m + p - 1 with F = I = W = 1 per chunk; every rank is busy
// without a gap from its first action to its last (rank r: [r, 6m + r]):
// zero bubble. Peak in-flight 2p chunks (p micro-batches' worth, as 1F1B),
// until W: 2p.
Schedule make_zbv(int ranks, int microbatches);

// DualPipeV (deepseek-ai/DualPipe's DualPipeV, the "cut-in-half" DualPipe
// of the DeepSeek-V3 report; PyTorch ScheduleDualPipeV): V placement, 2
// chunks per rank, built in eight phases (see generators.cc). Its steady
// state overlaps a forward of one chunk with a backward of the other
// (DualPipe's F&B). The IR has no fused action: an overlapped pair is an F
// immediately followed by a B of the other chunk in the rank's list, as in
// PyTorch's OVERLAP_F_B whose sub-actions run F then B. A cost model may
// charge such an adjacent pair F&B instead of F + B. Needs m >= 2p.
// Makespan 6m + p - 1 with F = I = W = 1 per chunk, the F&B pair charged
// F + B: idle per rank p - 1, within the README's bound
// (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages. Peak in-flight 2p + 1
// chunks (the README's PP + 1).
Schedule make_dualpipev(int ranks, int microbatches);

// Inference (DeepSpeed's InferenceSchedule; the prefill of `pipeflow
// generate`): forward only, rank r runs the forwards of micro-batches
// 0 .. m - 1 of its stage in order, so stage r forwards micro-batch k at step
// k + r. is_inference() is true: the validator expects no backward. Any
// p, m >= 1. Makespan m + p - 1 with F = 1 (DeepSpeed's m + p - 1 steps);
// bubble (p - 1)/(m + p - 1).
Schedule make_inference(int ranks, int microbatches);

// The schedule registry: one entry per generator, everything pipeflow knows
// about a schedule by its name. make_schedule, `pipeflow schedule --list`
// and the run configuration's check of pipeline.schedule all read it, so
// adding a schedule is adding one entry to list_schedules().
struct ScheduleInfo {
  std::string name;         // "1f1b"
  std::string description;  // one line
  std::string constraints;  // what it accepts, in words
  std::string source;       // paper / repository
  Placement placement = Placement::kLoop;
  bool takes_virtual = false;  // whether --virtual V applies (v chunks per rank, loop placement)
  bool inference = false;      // forward only (no backward): generation's prefill, never training
  // Throws the generator's pipeflow::Error, naming the rule and the fix, for
  // ranks, microbatches and chunks_per_rank it cannot schedule; the
  // generator itself calls the same function.
  void (*require)(std::string_view name, int ranks, int microbatches, int chunks_per_rank) = nullptr;
  Schedule (*generate)(int ranks, int microbatches, int chunks_per_rank) = nullptr;

  // Throws what make_schedule throws for these sizes: first the chunk rule
  // (chunks_per_rank must be 1 unless takes_virtual; the V-shaped schedules
  // also accept 2, the chunks they always hold), then `require`.
  void check(int ranks, int microbatches, int chunks_per_rank) const;
};

// Every generator, in the order above: the training schedules, then inference.
const std::vector<ScheduleInfo>& list_schedules();

// Throws unless `info` is a training schedule (training needs a backward).
void require_training_schedule(const ScheduleInfo& info);

// The entry called `name`, in any case ("ZBV" is zbv), or nullptr.
const ScheduleInfo* find_schedule(std::string_view name);

// The registry's names in list order, comma-separated, for errors that list them.
std::string known_schedule_names();

// Builds the schedule called `name` (any case) after its entry's check().
// Unknown names throw an Error listing the known ones.
Schedule make_schedule(std::string_view name, int ranks, int microbatches, int chunks_per_rank = 1);

}  // namespace pipeflow
