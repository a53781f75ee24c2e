#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/execute.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// One broken rule: its short name, the violation in words, and the offending
// cell of the grid when there is one.
struct Violation {
  std::string rule;     // "order", "deadlock", ...
  std::string message;  // "rank 2 step 5: 2B3 runs before 2F3 (step 8): ..."
  std::optional<RankId> rank;
  std::size_t index = 0;  // position in the rank's list, when rank is set
};

struct ValidationReport {
  // The violations found, in order, at most kMaxListed of them (a file with
  // a mistyped micro-batch index breaks the count rule for every index below
  // it: listing millions helps no one and takes gigabytes); `unlisted`
  // counts the rest.
  static constexpr std::size_t kMaxListed = 200;
  std::vector<Violation> violations;
  std::size_t unlisted = 0;
  // Per rank, the most micro-batch chunks whose F has run and whose B or I has
  // not finished (the activations the rank holds), and the most whose W (or
  // B) has not finished (what a split backward keeps until W).
  std::vector<int> peak_inflight;
  std::vector<int> peak_inflight_until_weight;
  bool split_backward = false;  // the schedule has I/W actions
  // The unit-cost dry run (rendezvous communication for a lowered schedule);
  // absent when actions lie outside the schedule's stages or micro-batches.
  std::optional<Execution> dry_run;

  bool ok() const { return violations.empty(); }
  // Every violation, numbered, then the rank x step grid with each offending
  // cell marked and labelled.
  std::string render(const Schedule& schedule) const;
  // One paragraph: size, unit-cost makespan and bubble, peak in-flight per rank.
  std::string summary(const Schedule& schedule) const;
};

// Checks, reporting every violation:
//   range:      stages and micro-batches within the schedule;
//   placement:  every action on the rank its stage is placed on;
//   count:      per (stage, micro-batch) exactly one F and either one B or
//               one I and one W (an inference schedule: the F alone); no
//               action twice;
//   forward-only: an inference schedule holds no B, I or W;
//   order:      on a stage, F before I/B, I before W;
//   dependency: a forward after the previous stage's forward and a backward
//               after the next stage's backward (the last stage: after its own
//               forward) when both are on one rank;
//   comm:       (lowered schedules) each cross-rank dependency has one SEND
//               after its producer and one RECV before its consumer, every
//               SEND/RECV pairs up and carries a real cross-rank dependency;
//   deadlock:   the dry run finishes; otherwise every stuck rank is named
//               with the action it is blocked on and what it waits for.
// Thread safety: a pure function of its argument.
ValidationReport validate(const Schedule& schedule);

}  // namespace pipeflow
