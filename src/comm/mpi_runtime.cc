// MPI type mapping, error checks, the operation watchdog and the point-to-point progress thread.
#include "comm/mpi_runtime.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/check.h"
#include "core/log.h"

namespace gale::mpi {

MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kBF16:
      return MPI_UINT16_T;
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kU16:
      return MPI_UINT16_T;
    case DType::kU8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

void check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::string message = str_cat("gale: rank ", log_rank(), ": MPI error in ", what, ": ", text, "; aborting the job");
  fatal_exit(1, message);
}

int to_int_count(int64_t n, const char* what) {
  GALE_CHECK(n >= 0 && n <= INT_MAX) << what << ": " << n << " elements exceed MPI's int count limit; split the buffer";
  return static_cast<int>(n);
}

// ---- watchdog ----

namespace {

struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_set<TrackedOp*> ops;
  double timeout = -1.0;  // < 0: never set; 0: disabled
  bool stopping = false;
  std::thread thread;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      double period = timeout > 0.0 ? std::clamp(timeout / 8.0, 0.05, 1.0) : 1.0;
      cv.wait_for(lock, std::chrono::duration<double>(period));
      if (stopping || timeout <= 0.0) continue;
      double now = now_seconds();
      for (TrackedOp* op : ops) {
        double waited = now - op->started_at;
        if (waited > timeout) {
          std::string message = str_cat("gale: rank ", log_rank(), ": ", op->describe(), " has not completed after ",
                                        static_cast<int64_t>(waited), " s (the --distributed-timeout-minutes limit is ",
                                        timeout, " s); a rank is hung or has died; aborting the job");
          lock.unlock();
          fatal_exit(1, message);
        }
      }
    }
  }
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: used from threads until the process ends
  return *w;
}

}  // namespace

void track(TrackedOp* op) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  w.ops.insert(op);
}

void untrack(TrackedOp* op) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  w.ops.erase(op);
}

void set_timeout(double seconds) {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  w.timeout = seconds;
  if (!w.thread.joinable() && !w.stopping) w.thread = std::thread([&w] { w.loop(); });
  w.cv.notify_one();
}

double timeout_seconds() {
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  return w.timeout;
}

void stop_watchdog() {
  Watchdog& w = watchdog();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.stopping = true;
    w.cv.notify_one();
  }
  if (w.thread.joinable()) w.thread.join();
}

// ---- point-to-point progress ----

namespace {

struct Pending {
  std::string what;
  std::function<void()> on_done;
};

struct ProgressEngine {
  std::mutex mu;
  std::condition_variable cv;       // wakes the thread when requests arrive
  std::condition_variable drained;  // signals stop_progress() that nothing is pending
  std::vector<MPI_Request> incoming_requests;
  std::vector<Pending> incoming;
  bool stopping = false;
  std::thread thread;
  int64_t in_flight = 0;  // handed over and not completed

  void loop() {
    std::vector<MPI_Request> requests;
    std::vector<Pending> pending;
    std::vector<int> indices;
    std::vector<MPI_Status> statuses;
    double idle_since = 0.0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (requests.empty()) {
          cv.wait(lock, [this] { return stopping || !incoming.empty(); });
          if (incoming.empty()) return;
        }
        for (size_t i = 0; i < incoming.size(); ++i) {
          requests.push_back(incoming_requests[i]);
          pending.push_back(std::move(incoming[i]));
        }
        incoming.clear();
        incoming_requests.clear();
      }
      int n = static_cast<int>(requests.size());
      indices.resize(n);
      statuses.resize(n);
      int done = 0;
      int rc = MPI_Testsome(n, requests.data(), &done, indices.data(), statuses.data());
      if (rc == MPI_ERR_IN_STATUS) {
        for (int k = 0; k < done; ++k) check(statuses[k].MPI_ERROR, pending[indices[k]].what);
      }
      check(rc, "MPI_Testsome (point-to-point progress)");
      if (done == MPI_UNDEFINED) done = 0;
      if (done == 0) {
        // Nothing finished: yield the core, and once idle for a while sleep for a tenth of the
        // idle time (at most 1 ms), so a long wait costs little CPU and at most ~10% latency.
        double now = now_seconds();
        if (idle_since == 0.0) idle_since = now;
        double idle = now - idle_since;
        if (idle < 50e-6) {
          sched_yield();
        } else {
          long ns = static_cast<long>(std::min(idle / 10.0, 1e-3) * 1e9);
          timespec ts{0, ns};
          nanosleep(&ts, nullptr);
        }
        continue;
      }
      idle_since = 0.0;
      std::sort(indices.begin(), indices.begin() + done);
      for (int k = done - 1; k >= 0; --k) {
        int i = indices[k];
        pending[i].on_done();
        requests.erase(requests.begin() + i);
        pending.erase(pending.begin() + i);
      }
      std::lock_guard<std::mutex> lock(mu);
      in_flight -= done;
      if (in_flight == 0) drained.notify_all();
    }
  }
};

ProgressEngine& engine() {
  static ProgressEngine* e = new ProgressEngine;  // never destroyed (see watchdog())
  return *e;
}

}  // namespace

void complete_in_background(MPI_Request request, std::string what, std::function<void()> on_done) {
  ProgressEngine& e = engine();
  std::lock_guard<std::mutex> lock(e.mu);
  GALE_CHECK(!e.stopping) << what << " started after MPI was finalised";
  if (!e.thread.joinable()) {
    e.thread = std::thread([&e] { e.loop(); });
    pthread_setname_np(e.thread.native_handle(), "gale-mpi-p2p");
  }
  e.incoming_requests.push_back(request);
  e.incoming.push_back(Pending{std::move(what), std::move(on_done)});
  ++e.in_flight;
  e.cv.notify_one();
}

void stop_progress() {
  ProgressEngine& e = engine();
  {
    std::unique_lock<std::mutex> lock(e.mu);
    e.drained.wait(lock, [&e] { return e.in_flight == 0; });
    e.stopping = true;
    e.cv.notify_one();
  }
  if (e.thread.joinable()) e.thread.join();
}

}  // namespace gale::mpi
