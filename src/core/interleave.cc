// run_interleaved: two ucontext fibers on the calling thread, switched at interleave_yield().
#include "core/interleave.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <chrono>
#include <exception>

#include "core/check.h"

namespace gale {

namespace {

// Each fiber's stack: reserved once per thread (never released), committed by the kernel as it is touched.
constexpr size_t kStackBytes = size_t{64} << 20;
constexpr size_t kGuardBytes = 4096;

struct Fibers {
  ucontext_t scheduler;
  ucontext_t fiber[2];
  const std::function<void()>* fn[2] = {nullptr, nullptr};
  bool done[2] = {false, false};
  std::exception_ptr error[2];
  int current = 0;
};

thread_local Fibers* t_fibers = nullptr;
thread_local void* t_stacks[2] = {nullptr, nullptr};
thread_local long long t_switches = 0;

void* stack(int which) {
  if (!t_stacks[which]) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    GALE_CHECK(p != MAP_FAILED) << "run_interleaved: could not reserve a " << (kStackBytes >> 20) << " MiB fiber stack";
    // A guard page at the bottom: an overflow faults instead of writing over other memory.
    GALE_CHECK_EQ(mprotect(p, kGuardBytes, PROT_NONE), 0);
    t_stacks[which] = p;
  }
  return t_stacks[which];
}

void fiber_main(int which) {
  Fibers* f = t_fibers;
  try {
    (*f->fn[which])();
  } catch (...) {
    f->error[which] = std::current_exception();
  }
  f->done[which] = true;  // returns to the scheduler (uc_link)
}

}  // namespace

std::array<double, 2> run_interleaved(const std::function<void()>& a, const std::function<void()>& b) {
  GALE_CHECK(t_fibers == nullptr) << "run_interleaved: nested interleaving is not supported";
  Fibers f;
  f.fn[0] = &a;
  f.fn[1] = &b;
  for (int i = 0; i < 2; ++i) {
    GALE_CHECK_EQ(getcontext(&f.fiber[i]), 0);
    f.fiber[i].uc_stack.ss_sp = stack(i);
    f.fiber[i].uc_stack.ss_size = kStackBytes;
    f.fiber[i].uc_link = &f.scheduler;
    makecontext(&f.fiber[i], reinterpret_cast<void (*)()>(&fiber_main), 1, i);
  }
  t_fibers = &f;
  std::array<double, 2> seconds = {0.0, 0.0};
  // Run the current fiber until it yields or ends; after a yield switch to the other unless it ended.
  while (!f.done[0] || !f.done[1]) {
    if (f.done[f.current]) f.current = 1 - f.current;
    const int ran = f.current;
    const auto start = std::chrono::steady_clock::now();
    GALE_CHECK_EQ(swapcontext(&f.scheduler, &f.fiber[ran]), 0);
    seconds[static_cast<size_t>(ran)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!f.done[1 - f.current]) f.current = 1 - f.current;
  }
  t_fibers = nullptr;
  for (const std::exception_ptr& e : f.error)
    if (e) std::rethrow_exception(e);
  return seconds;
}

void interleave_yield() {
  Fibers* f = t_fibers;
  if (!f || f->done[1 - f->current]) return;
  ++t_switches;
  GALE_CHECK_EQ(swapcontext(&f->fiber[f->current], &f->scheduler), 0);
}

bool interleaving() { return t_fibers != nullptr; }

long long interleave_switches() { return t_switches; }

}  // namespace gale
