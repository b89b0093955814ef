// One checkpoint write at a time on a background thread (train.async_save).
//
// The trainer copies the step's state to host memory at the step boundary and hands this class
// a job that writes, verifies and commits the checkpoint from that copy (file I/O only: no
// collectives, which must stay on the training thread). At most one save is in flight: start()
// refuses a second one until wait() has collected the first. The job's error is kept until
// wait() rethrows it; failed() lets the training thread notice it at any step without waiting.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace xlme::checkpoint {

class BackgroundSave {
 public:
  BackgroundSave() = default;
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;
  // Waits for the save in flight (a run that fails for another reason still finishes writing its
  // checkpoint); its error is logged, not thrown.
  ~BackgroundSave();

  // Runs `write` (which returns the committed checkpoint's path) on the background thread for
  // the checkpoint of `step`. Throws xlme::Error when a save is in flight: wait() for it first.
  void start(int64_t step, std::function<std::string()> write);
  // Whether a save was started and not yet collected by wait().
  bool in_flight() const { return thread_.joinable(); }
  // The step of the save in flight (-1 when none).
  int64_t step() const { return in_flight() ? step_ : -1; }
  // Whether the save in flight has ended with an error (does not wait).
  bool failed() const { return state_.load(std::memory_order_acquire) == kFailed; }
  // Waits for the save in flight and returns its path, or rethrows its error; nullopt when no
  // save is in flight.
  std::optional<std::string> wait();
  // Seconds the last collected save took on the background thread.
  double seconds() const { return seconds_; }

 private:
  enum State : int { kRunning = 0, kDone = 1, kFailed = 2 };

  std::thread thread_;
  std::atomic<int> state_{kRunning};
  int64_t step_ = -1;
  // Written by the thread before it sets state_, read after join().
  std::string path_;
  std::exception_ptr error_;
  double seconds_ = 0;
};

}  // namespace xlme::checkpoint
