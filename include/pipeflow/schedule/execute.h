#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "pipeflow/core/ids.h"
#include "pipeflow/schedule/action.h"
#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// How SEND/RECV actions of a lowered schedule use time.
//   kOverlapped: a SEND takes no rank time; its message arrives at the SEND's
//                time + transfer; a RECV ends at max(rank free, arrival) and
//                the gap is waiting (an eager, buffered transport: MPI_Isend
//                then MPI_Recv).
//   kBlocking:   rendezvous: a SEND and its RECV start together once both
//                ranks have reached them, and both occupy their ranks for the
//                transfer time (synchronous send/recv).
enum class CommMode { kOverlapped, kBlocking };

// The costs that turn a schedule into times. `duration` is called for
// compute actions (F/B/I/W) with the rank that runs them; `transfer` for
// every message, with the sending action (the SEND of a lowered schedule, the
// producing F/B/I of a compute-only one) and the two ranks. Both must return
// finite values >= 0.
struct ExecutionCosts {
  std::function<double(const Action&, RankId)> duration;
  std::function<double(const Action& send_or_producer, RankId from, RankId to)> transfer;
  CommMode mode = CommMode::kOverlapped;
};

// The unit costs of the tests and the validator's dry run: F = 1, B = 2,
// I = 1, W = 1 (so B = I + W), every transfer 0.
ExecutionCosts unit_costs(CommMode mode);

// One executed action. [start, end) is the time the action held its rank;
// `wait` is the part of it, at its beginning, spent waiting for a peer (a
// RECV waiting for its message, or under kBlocking a SEND/RECV waiting for
// its partner to arrive). Compute actions have wait 0: idle before them is
// the gap to the previous action.
struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
  double wait = 0;
};

// A rank that could not finish: the action it is blocked at and, in words,
// what it waits for, e.g.
//   rank 1 blocked at 1RECV_F3: waits for 0SEND_F3, which rank 0 has not
//   reached (rank 0 is blocked at 0RECV_B2)
struct StuckRank {
  RankId rank;
  std::size_t index = 0;  // position of the blocked action in the rank's list
  Action blocked_at;
  std::string message;
};

struct Execution {
  // Per rank, the actions that ran, in list order (the whole list unless deadlocked).
  std::vector<std::vector<TimedAction>> ranks;
  double makespan = 0;  // latest end of any action
  bool deadlocked = false;
  std::vector<StuckRank> stuck;  // every stuck rank, in rank order

  // The stuck ranks' messages, one per line.
  std::string deadlock_message() const;
};

// Runs every rank's list in order: an action starts when its rank is free and
// its inputs are ready. Inputs: F(s) needs F(s-1) (stage 0: nothing); B or
// I(s) needs F(s) and the B or I of s+1 (the last stage: only F(s)); W(s)
// needs I(s). In a compute-only schedule a cross-rank input is ready at the
// producer's end + transfer and uses no rank time; in a lowered schedule a
// cross-rank input arrives only through its RECV (which must precede the
// consumer on its rank), a SEND needs its producer, and `costs.mode` decides
// how SEND/RECV use time. Same-rank inputs (the V turn, p = 1) never need
// communication.
//
// Event-driven and O(total actions): a blocked rank waits on the one input
// it lacks and is woken when that input completes; times do not depend on
// the order ranks are visited. Never hangs: when no rank can move, the result
// is deadlocked with every stuck rank described.
//
// `rank_start_s`, if not empty, holds per rank the time it becomes free: its
// first action starts no earlier (the simulator's steady state releases each
// rank into the next step when that rank has finished the previous one).
// Empty: every rank is free at 0.
//
// Throws Error if an action's stage or micro-batch lies outside the schedule
// (validate() reports those first), or rank_start_s has neither 0 nor one
// finite entry >= 0 per rank.
Execution execute(const Schedule& schedule, const ExecutionCosts& costs, std::span<const double> rank_start_s = {});

// Time rank `rank` spent on compute actions (F/B/I/W) in `execution`.
double busy_time(const Execution& execution, RankId rank);
// The idle share of the step: 1 - (compute time of all ranks) / (ranks *
// makespan); communication and waiting count as idle. 0 for an empty run.
double bubble_fraction(const Execution& execution);

// The validator's dry run: unit costs, rendezvous communication for a
// lowered schedule.
Execution dry_run(const Schedule& schedule);

}  // namespace pipeflow
