// The single-thread FIFO executor behind each MPI group.
#include "comm/serial_executor.h"

#include <pthread.h>

namespace gale {

void SerialExecutor::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_ && !stopping_) {
      if (!thread_.joinable()) {
        thread_ = std::thread([this] { loop(); });
        std::string short_name = ("gale-" + name_).substr(0, 15);  // Linux limits names to 15 chars
        pthread_setname_np(thread_.native_handle(), short_name.c_str());
      }
      queue_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  task();
}

void SerialExecutor::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || stopping_) return;
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void SerialExecutor::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    task();
    task = nullptr;  // destroy captures before reporting idle
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

bool SerialExecutor::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && !busy_;
}

}  // namespace gale
