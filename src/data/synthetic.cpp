#include "xlme/data/synthetic.h"

#include "xlme/common/error.h"
#include "xlme/data/batch_writer.h"
#include "xlme/data/framing.h"
#include "xlme/data/sampler.h"

#include <fmt/format.h>

#include <sstream>

namespace xlme::data {
namespace {

constexpr uint64_t kSaltSynthetic = 0x73796e62;

}  // namespace

SyntheticBatches::SyntheticBatches(const SpecialIds& special, int64_t batch_size, int64_t length,
                                   double mask_ratio, uint64_t seed, int rank, int world_size)
    : special_(special),
      batch_size_(batch_size),
      length_(length),
      mask_ratio_(mask_ratio),
      seed_(seed),
      rank_(rank),
      world_size_(world_size) {
  XLME_CHECK(length >= 6 && special.vocab_size > 5,
             "synthetic batches need sequences of >= 6 tokens and a vocabulary of > 5 ids");
}

Batch SyntheticBatches::next(Task task) {
  const auto t = static_cast<size_t>(task);
  const int64_t first = cursor_[t] + rank_ * batch_size_;
  cursor_[t] += world_size_ * batch_size_;
  BatchWriter writer(task, batch_size_, length_, special_, /*pinned=*/false);
  const MaskOptions mask{mask_ratio_, 1.0};
  // <s> x </s>, or <s> e </s> f </s> with </s> after e at length / 2.
  const bool pair = task == Task::kPara || sentence_pairs_;
  const int64_t e = pair ? length_ / 2 - 1 : length_ - 2;
  const int64_t f = length_ - 3 - e;
  std::vector<int32_t> a, b, tokens;
  for (int64_t i = 0; i < batch_size_; ++i) {
    Rng rng(hash_key({seed_, kSaltSynthetic, t, static_cast<uint64_t>(first + i)}));
    // Pieces only: ids 0-3 are <s> <pad> </s> <unk>, the last id is <mask>.
    const auto pieces = [&](int64_t n, std::vector<int32_t>& out) {
      out.resize(static_cast<size_t>(n));
      for (auto& id : out) id = static_cast<int32_t>(4 + rng.below(special_.vocab_size - 5));
    };
    size_t second = 0;
    pieces(e, a);
    if (!pair) {
      frame_sentence(a, length_, special_, tokens);
    } else {
      pieces(f, b);
      second = frame_pair(a, b, PairLengths{e, f}, special_, tokens);
    }
    writer.write(i, tokens, second, /*reset_positions=*/false, mask, rng);
  }
  return std::move(writer.batch());
}

std::string SyntheticBatches::state() const {
  return fmt::format("{} {}", cursor_[0], cursor_[1]);
}

void SyntheticBatches::restore(const std::vector<std::string>& saved) {
  XLME_CHECK(!saved.empty(), "synthetic batches: no saved state to restore");
  std::istringstream in(saved.front());
  XLME_CHECK(static_cast<bool>(in >> cursor_[0] >> cursor_[1]),
             "synthetic batches: malformed saved state '{}'", saved.front());
}

}  // namespace xlme::data
