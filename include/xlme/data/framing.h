// The one framing of sequences (docs/ARCHITECTURE.md#data), for training, the held-out batches and
// the synthetic ones: MRTD packs whole sentences into <s> x </s>, TRTD frames a translation pair as
// <s> e </s> f </s>, and a sequence over max_len is cut (or, for a pair, dropped: data.too_long)
// by the rules below.
#pragma once

#include "xlme/data/special_ids.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace xlme::data {

// MRTD packing (fairseq's "complete" mode): consecutive sentences of `lengths` tokens grouped in
// order while they fit between <s> and </s> in `max_len` tokens; a sentence longer than
// max_len - 2 is truncated and fills a sequence alone. [begin, end) of each group, in order.
std::vector<std::pair<int64_t, int64_t>> pack_sentences(const std::vector<int64_t>& lengths,
                                                        int64_t max_len);

// <s> pieces </s> into `out` (replaced), the pieces cut to max_len - 2.
void frame_sentence(const std::vector<int32_t>& pieces, int64_t max_len, const SpecialIds& ids,
                    std::vector<int32_t>& out);

// The tokens each side of a TRTD pair keeps.
struct PairLengths {
  int64_t e = 0, f = 0;
};

// A pair of e and f tokens in `max_len`: whole when e + f + 3 <= max_len; otherwise dropped
// (nullopt) unless `truncate` (data.too_long), and then the longer side gives up tokens first,
// each side keeping at least half the room (max_len - 3) if it needs it: 10 + 10 tokens in 18
// keep (8, 7).
std::optional<PairLengths> fit_pair(int64_t e, int64_t f, int64_t max_len, bool truncate);

// <s> e </s> f </s> into `out` (replaced), keeping kept.e tokens of e and kept.f of f; returns
// where f starts.
size_t frame_pair(const std::vector<int32_t>& e, const std::vector<int32_t>& f,
                  const PairLengths& kept, const SpecialIds& ids, std::vector<int32_t>& out);

// VECO's monolingual pairs (TaskBatchOptions::sentence_pairs): sentences taken two at a time in
// order, a and its successor b of the same document, framed <s> a </s> b </s> like a translation
// pair; `starts_document[i]` says sentence i opens a document. A sentence whose successor opens
// another document (or is missing) has no partner and is left out. The index of each pair's a.
std::vector<int64_t> pair_adjacent_sentences(const std::vector<bool>& starts_document);

}  // namespace xlme::data
