#include "xlme/data/framing.h"

#include "xlme/common/error.h"

#include <algorithm>

namespace xlme::data {

std::vector<std::pair<int64_t, int64_t>> pack_sentences(const std::vector<int64_t>& lengths,
                                                        int64_t max_len) {
  XLME_CHECK(max_len >= 3, "an MRTD sequence <s> x </s> needs max_len >= 3, got {}", max_len);
  const int64_t room = max_len - 2;
  const auto count = static_cast<int64_t>(lengths.size());
  std::vector<std::pair<int64_t, int64_t>> groups;
  int64_t first = 0, length = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (lengths[i] > room) {  // truncated, alone
      if (i > first) groups.emplace_back(first, i);
      groups.emplace_back(i, i + 1);
      first = i + 1;
      length = 0;
      continue;
    }
    if (i > first && length + lengths[i] > room) {
      groups.emplace_back(first, i);
      first = i;
      length = 0;
    }
    length += lengths[i];
  }
  if (count > first) groups.emplace_back(first, count);
  return groups;
}

void frame_sentence(const std::vector<int32_t>& pieces, int64_t max_len, const SpecialIds& ids,
                    std::vector<int32_t>& out) {
  const auto kept = std::min(pieces.size(), static_cast<size_t>(max_len - 2));
  out.assign(1, static_cast<int32_t>(ids.bos));
  out.insert(out.end(), pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(kept));
  out.push_back(static_cast<int32_t>(ids.eos));
}

std::optional<PairLengths> fit_pair(int64_t e, int64_t f, int64_t max_len, bool truncate) {
  const int64_t room = max_len - 3;
  if (e + f <= room) return PairLengths{e, f};
  if (!truncate) return std::nullopt;
  PairLengths kept;
  kept.e = std::min(e, std::max((room + 1) / 2, room - f));
  kept.f = std::min(f, room - kept.e);
  return kept;
}

size_t frame_pair(const std::vector<int32_t>& e, const std::vector<int32_t>& f,
                  const PairLengths& kept, const SpecialIds& ids, std::vector<int32_t>& out) {
  const auto eos = static_cast<int32_t>(ids.eos);
  out.assign(1, static_cast<int32_t>(ids.bos));
  out.insert(out.end(), e.begin(), e.begin() + static_cast<std::ptrdiff_t>(kept.e));
  out.push_back(eos);
  const size_t second = out.size();
  out.insert(out.end(), f.begin(), f.begin() + static_cast<std::ptrdiff_t>(kept.f));
  out.push_back(eos);
  return second;
}

std::vector<int64_t> pair_adjacent_sentences(const std::vector<bool>& starts_document) {
  std::vector<int64_t> firsts;
  const auto count = static_cast<int64_t>(starts_document.size());
  for (int64_t i = 0; i + 1 < count;) {
    if (starts_document[i + 1]) {  // i ends its document alone
      ++i;
      continue;
    }
    firsts.push_back(i);
    i += 2;
  }
  return firsts;
}

}  // namespace xlme::data
