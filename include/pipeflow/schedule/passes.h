#pragma once

#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// Lowering passes: Schedule -> Schedule, the input untouched.

// Adds a SEND and a RECV for every cross-rank dependency of a compute-only
// schedule (F(s) -> F(s+1) on another rank: sSEND_Fk after sFk, (s+1)RECV_Fk
// before (s+1)Fk; B/I(s) -> B/I(s-1): sSEND_Bk and (s-1)RECV_Bk). Same-rank
// dependencies (the V turn, one rank) get none.
//
// The order makes even rendezvous (synchronous) send/recv deadlock-free:
// the compute-only schedule is executed with unit costs; each message gets a
// time T in [its producer's end, its consumer's start] -- the earliest at
// which neither rank is inside an action, else the producer's end -- and the
// key (T, producer rank, producer index); on every rank all SEND/RECVs are
// placed in key order, each at the first action boundary whose next compute
// action starts at or after T (so a SEND follows its producer and a RECV
// precedes its consumer). Every rank meets its messages in the one global
// key order, and everything before a message's two ends needs only messages
// with smaller keys (a compute action before it starts before T and its own
// inputs arrived by its start), so the pending message with the smallest key
// can always complete. Where a T between the ranks' actions exists, the
// lowered schedule also runs, under rendezvous with zero transfer time, in
// exactly the unit-cost time of the compute-only one.
//
// Throws Error if the schedule already has communication or its compute-only
// order deadlocks.
Schedule insert_send_recv(const Schedule& schedule);

// An I immediately followed (in the same rank's list) by the W of the same
// stage and micro-batch becomes one B; everything else is kept.
Schedule merge_bw(const Schedule& schedule);

// The compute actions only (undoes insert_send_recv).
Schedule strip_communication(const Schedule& schedule);

}  // namespace pipeflow
