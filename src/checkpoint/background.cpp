#include "xlme/checkpoint/background.h"

#include "xlme/common/error.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace xlme::checkpoint {

BackgroundSave::~BackgroundSave() {
  if (!in_flight()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("the checkpoint of step {} was not saved: {}", step_, e.what());
  }
}

void BackgroundSave::start(int64_t step, std::function<std::string()> write) {
  XLME_CHECK(!in_flight(),
             "cannot start the checkpoint of step {} while the one of step {} is being written: "
             "at most one save is in flight (wait for it first)",
             step, step_);
  step_ = step;
  path_.clear();
  error_ = nullptr;
  state_.store(kRunning, std::memory_order_release);
  thread_ = std::thread([this, job = std::move(write)]() mutable {
    const auto start = std::chrono::steady_clock::now();
    int state = kDone;
    try {
      path_ = job();
    } catch (...) {
      error_ = std::current_exception();
      state = kFailed;
    }
    job = nullptr;  // the state copied for the save is freed as soon as it is written
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state_.store(state, std::memory_order_release);
  });
}

std::optional<std::string> BackgroundSave::wait() {
  if (!in_flight()) return std::nullopt;
  thread_.join();
  state_.store(kDone, std::memory_order_release);  // collected: nothing in flight fails now
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
  return path_;
}

}  // namespace xlme::checkpoint
