// The held-out translation pairs of periodic validation (data.heldout) and the fixed micro-batches
// built from them: the same framing, truncation (data.too_long), bucketing and masking as
// training's (framing.h, bucketing.h, masking.h). Computing the validation losses is
// train/validation.h's.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/data/batches.h"
#include "xlme/data/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::data {

// One held-out translation pair, tokenized (pieces, no special ids); a[i] translates b[i].
struct HeldoutPair {
  std::string name;  // "en-de"
  std::string first_language, second_language;
  std::vector<std::vector<int32_t>> a, b;
};

// Reads data.heldout (every pair in dir, or data.heldout.pairs) with `tokenizer`. Errors name the
// folder, the pair and the file (missing, or different line counts).
std::vector<HeldoutPair> read_heldout(const config::HeldoutConfig& heldout,
                                      const Tokenizer& tokenizer);

// The fixed micro-batches of `pairs` (host tensors), MRTD (options.mono.enabled) then TRTD
// (options.para.enabled):
//   MRTD  each language's distinct non-empty sentences over all pairs, in pair and line order,
//         packed into <s> ... </s> of up to mono.max_len tokens (pack_sentences), or for
//         mono.sentence_pairs (VECO) taken two at a time, <s> a </s> b </s>, cut or dropped at
//         mono.max_len as data.too_long says;
//   TRTD  <s> e </s> f </s> per line of each pair with two non-empty sides, cut or dropped at
//         para.max_len as data.too_long says (fit_pair);
// each task's sequences bucketed into micro_batch_tokens (bucket_by_length) and masked with
// mask_ratio / mask_token_ratio from one stream seeded with `seed`, so the batches are the same
// every time.
std::vector<Batch> heldout_batches(const std::vector<HeldoutPair>& pairs,
                                   const BatchOptions& options, uint64_t seed);

// One side of a held-out pair as the retrieval probe reads it: each sentence <s> pieces </s>,
// cut to max_len (frame_sentence).
std::vector<std::vector<int64_t>> framed_sentences(
    const std::vector<std::vector<int32_t>>& sentences, int64_t max_len, const SpecialIds& ids);

}  // namespace xlme::data
