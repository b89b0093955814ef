// ShardBatchSource: one TaskReader per task on data.loader_threads loader threads, up to
// data.prefetch micro-batches ahead per task, handed out in order (batches.h).
#include "xlme/common/error.h"

#include "batches_internal.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace xlme::data {

ShardBatchSource::Impl::Pipeline* ShardBatchSource::Impl::pipeline(Task task) const {
  Pipeline* p = pipelines[static_cast<size_t>(task)].get();
  XLME_CHECK(p != nullptr,
             "no {} batches: this batch source was built without the {} task (objectives.set "
             "does not train it)",
             task_key(task), task == Task::kMono ? "MRTD" : "TRTD");
  return p;
}

ShardBatchSource::Impl::Pipeline* ShardBatchSource::Impl::pick() {
  for (size_t i = 0; i < pipelines.size(); ++i) {
    Pipeline* p = pipelines[(turn + i) % pipelines.size()].get();
    if (p != nullptr && p->scheduled - p->consumed < options.prefetch) {
      turn = (turn + i + 1) % pipelines.size();
      return p;
    }
  }
  return nullptr;
}

void ShardBatchSource::Impl::work() {
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    Pipeline* p = nullptr;
    work_cv.wait(lock, [&] { return stopping || (p = pick()) != nullptr; });
    if (stopping) return;
    const int64_t number = p->scheduled++;
    Slot slot;
    BatchJob job;
    try {
      job = p->reader->next_job();  // the schedule is sequential: under the lock
    } catch (...) {
      slot.error = std::current_exception();
    }
    lock.unlock();
    if (!slot.error) {
      try {
        slot.batch = p->reader->build(job);
        slot.language = job.language;
        slot.after = std::move(job.after);
      } catch (...) {
        slot.error = std::current_exception();
      }
    }
    job.pool.reset();
    lock.lock();
    p->ready.emplace(number, std::move(slot));
    ready_cv.notify_all();
  }
}

void ShardBatchSource::Impl::start() {
  stopping = false;
  for (int64_t i = 0; i < options.loader_threads; ++i) workers.emplace_back([this] { work(); });
}

void ShardBatchSource::Impl::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
  }
  work_cv.notify_all();
  for (auto& w : workers) w.join();
  workers.clear();
}

ShardBatchSource::ShardBatchSource(const BatchOptions& options) : impl_(std::make_unique<Impl>()) {
  XLME_CHECK(options.loader_threads >= 1 && options.prefetch >= 1,
             "data.loader_threads ({}) and data.prefetch ({}) must be >= 1", options.loader_threads,
             options.prefetch);
  XLME_CHECK(options.mono.enabled || options.para.enabled, "no task enabled: nothing to read");
  impl_->options = options;
  for (const Task task : {Task::kMono, Task::kPara}) {
    if (!(task == Task::kMono ? options.mono : options.para).enabled) continue;
    auto p = std::make_unique<Impl::Pipeline>();
    p->reader = std::make_unique<TaskReader>(options, task);
    p->consumed_state = p->reader->state();
    const auto names = p->reader->languages();
    const auto tokens = p->reader->shard_tokens();
    for (size_t j = 0; j < names.size(); ++j) {
      LanguageCount c;
      c.name = names[j];
      c.probability = p->reader->probabilities()[j];
      c.shard_tokens = tokens[j];
      p->counts.push_back(c);
    }
    impl_->pipelines[static_cast<size_t>(task)] = std::move(p);
  }
  spdlog::info(
      "data: languages, shard tokens, target share p and realized share of tokens read "
      "(this rank){}",
      language_report());
  impl_->start();
}

ShardBatchSource::~ShardBatchSource() {
  impl_->stop();
}

const SpecialIds& ShardBatchSource::special_ids() const {
  for (const auto& p : impl_->pipelines) {
    if (p) return p->reader->special_ids();
  }
  XLME_FAIL("no task enabled");
}

Batch ShardBatchSource::next(Task task) {
  Impl::Pipeline* p = impl_->pipeline(task);
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->ready_cv.wait(lock, [&] { return p->ready.count(p->consumed) > 0; });
  auto node = p->ready.extract(p->consumed);
  ++p->consumed;
  impl_->work_cv.notify_all();
  Impl::Slot& slot = node.mapped();
  if (slot.error) std::rethrow_exception(slot.error);
  p->consumed_state = std::move(slot.after);
  LanguageCount& c = p->counts[slot.language];
  const Batch& b = slot.batch;
  ++c.micro_batches;
  c.sequences += b.input_ids.size(0);
  c.tokens += b.real_tokens;
  c.padding += b.input_ids.numel() - b.real_tokens;
  return std::move(slot.batch);
}

std::vector<LanguageCount> ShardBatchSource::language_counts(Task task) const {
  const Impl::Pipeline* p = impl_->pipeline(task);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return p->counts;
}

std::string ShardBatchSource::language_report() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::string table;
  for (const Task task : {Task::kMono, Task::kPara}) {
    const auto& p = impl_->pipelines[static_cast<size_t>(task)];
    if (!p) continue;
    int64_t read = 0;
    for (const auto& c : p->counts) read += c.tokens;
    for (const auto& c : p->counts) {
      table += fmt::format("\n  {} {:<8} {:>12} tokens  target {:5.1f}%  realized {:5.1f}%",
                           task_key(task), c.name, c.shard_tokens, 100 * c.probability,
                           read > 0 ? 100.0 * static_cast<double>(c.tokens) / read : 0.0);
    }
  }
  return table;
}

}  // namespace xlme::data
