#pragma once

namespace pipeflow {

// The calling thread's CPU time (user + system) in seconds, from
// CLOCK_THREAD_CPUTIME_ID: it advances only while the thread runs on a core,
// so wall time less it over an interval is the time the thread was off its
// core (waiting to be scheduled, or asleep).
double thread_cpu_seconds();

}  // namespace pipeflow
