// A FIFO of tasks run one at a time, in submission order, on one lazily started thread.
//
// The MPI communicator runs each group's collectives on its own SerialExecutor: blocking MPI
// collectives (Open MPI's tuned algorithms) then progress while the caller computes, collectives
// of one group keep their issue order, and collectives of different groups never wait on each
// other (each group behaves like a NCCL stream).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace gale {

class SerialExecutor {
 public:
  explicit SerialExecutor(std::string name) : name_(std::move(name)) {}
  ~SerialExecutor() { shutdown(); }
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queue `task`; it runs after every task submitted before it. Starts the thread on first use.
  void submit(std::function<void()> task);
  // Run the queued tasks to the end, then stop and join the thread. Idempotent; submit() after
  // shutdown() runs the task on the calling thread.
  void shutdown();
  // True when no task is queued or running. Only meaningful to the one thread that submits: it
  // may then run work of its own inline, knowing nothing of this executor's is in between.
  bool idle();
  const std::string& name() const { return name_; }

 private:
  void loop();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
  bool stopping_ = false;
  bool stopped_ = false;
  bool busy_ = false;  // a task is running
};

}  // namespace gale
