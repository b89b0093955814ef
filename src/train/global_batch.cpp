#include "xlme/train/global_batch.h"

#include "xlme/common/error.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace xlme::train {

std::optional<GlobalBatch> try_global_batch(const config::TrainConfig& train, int world_size) {
  const int64_t per_round = static_cast<int64_t>(world_size) * train.micro_batch_tokens;
  const int64_t below = train.tokens_per_task / per_round;
  const bool exact = below * per_round == train.tokens_per_task;
  int64_t micro_batches = below;
  if (!exact) {
    if (train.batch_rounding == "up") {
      micro_batches = below + 1;
    } else if (train.batch_rounding != "down") {
      return std::nullopt;  // error
    }
  }
  if (micro_batches < 1) return std::nullopt;
  return GlobalBatch{micro_batches, micro_batches * per_round};
}

std::vector<int> world_sizes_with(const config::TrainConfig& train, int64_t tokens_per_step,
                                  int world_size, std::size_t count) {
  std::vector<int> found;
  for (int w = 1; w <= 4096; ++w) {
    const auto batch = try_global_batch(train, w);
    if (batch && batch->tokens_per_step == tokens_per_step) found.push_back(w);
  }
  std::stable_sort(found.begin(), found.end(), [&](int a, int b) {
    return std::abs(a - world_size) < std::abs(b - world_size);
  });
  if (found.size() > count) found.resize(count);
  std::sort(found.begin(), found.end());
  return found;
}

GlobalBatch global_batch(const config::TrainConfig& train, int world_size) {
  if (const auto batch = try_global_batch(train, world_size)) return *batch;
  const int64_t per_round = static_cast<int64_t>(world_size) * train.micro_batch_tokens;
  const auto change = [&](int64_t micro_batches) {
    if (micro_batches < 1) return std::string("no micro-batch: not possible");
    return fmt::format(
        "{} per rank, {} tokens per step, {:+.1f}%", micro_batches, micro_batches * per_round,
        100.0 * static_cast<double>(micro_batches * per_round - train.tokens_per_task) /
            static_cast<double>(train.tokens_per_task));
  };
  const int64_t below = train.tokens_per_task / per_round;
  std::string valid = "none: train.tokens_per_task is not a multiple of train.micro_batch_tokens";
  auto exact = train;
  exact.batch_rounding = "error";
  if (const auto sizes = world_sizes_with(exact, train.tokens_per_task, world_size);
      !sizes.empty()) {
    valid = fmt::format("{}", fmt::join(sizes, ", "));
  }
  XLME_FAIL(
      "train.tokens_per_task = {} is not a whole number of micro-batches over {} rank(s) "
      "(train.micro_batch_tokens = {}: {:.3g} per rank){}; the world sizes nearest to {} that "
      "divide it: {}. Launch on one of those, change train.tokens_per_task or "
      "train.micro_batch_tokens, or set train.batch_rounding=up ({}) or down ({})",
      train.tokens_per_task, world_size, train.micro_batch_tokens,
      static_cast<double>(train.tokens_per_task) / static_cast<double>(per_round),
      train.batch_rounding == "down" ? " and rounding down leaves no micro-batch" : "", world_size,
      valid, change(below + 1), change(below));
}

void log_global_batch(const GlobalBatch& batch, const config::TrainConfig& train, int world_size) {
  const std::string said = fmt::format(
      "tokens per step: {} per task ({} micro-batch(es) of train.micro_batch_tokens = {} on "
      "each of {} rank(s))",
      batch.tokens_per_step, batch.micro_batches, train.micro_batch_tokens, world_size);
  if (batch.tokens_per_step == train.tokens_per_task) {
    spdlog::info("{} = train.tokens_per_task", said);
  } else {
    spdlog::warn(
        "{}, not train.tokens_per_task = {}: rounded {} (train.batch_rounding) to whole "
        "micro-batches on every rank ({:+.1f}%)",
        said, train.tokens_per_task, train.batch_rounding,
        100.0 * static_cast<double>(batch.tokens_per_step - train.tokens_per_task) /
            static_cast<double>(train.tokens_per_task));
  }
}

}  // namespace xlme::train
