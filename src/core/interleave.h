// Two computations interleaved cooperatively on one thread, switching only where one says so (--moe-fb-overlap).
//
// run_interleaved(a, b) runs `a` and `b` on the calling thread, each on a stack of its own (ucontext
// fibers): `a` starts; each time the running one calls interleave_yield() the other resumes (or
// starts); once one has finished, the other runs to its end without switching. No thread is added
// and nothing runs concurrently: the interleaving is a pure function of where the yields are, so
// ranks that run the same two computations with the same yields issue their collectives in the same
// order (schedule/schedules.h: DualPipeV's overlapped forward/backward pairs, where each MoE
// all-to-all is issued, the other computation runs, and only then the exchange is waited for).
//
// Restrictions: no nesting (a computation may not call run_interleaved), yields only outside
// OpenMP parallel regions, and an exception thrown by one computation is rethrown by
// run_interleaved after the other has finished.
#pragma once

#include <array>
#include <functional>

namespace gale {

// Returns the seconds each of `a` and `b` ran (from each resume to its next yield or its end), so
// that callers can time the two apart; they add up to the call's duration less the switches.
std::array<double, 2> run_interleaved(const std::function<void()>& a, const std::function<void()>& b);

// Inside run_interleaved: hands the thread to the other computation if it has not finished yet.
// Anywhere else (or when the other has finished): does nothing.
void interleave_yield();

// Whether the calling code runs inside run_interleaved.
bool interleaving();

// How many times interleave_yield() switched computations on this thread (tests, statistics).
long long interleave_switches();

}  // namespace gale
