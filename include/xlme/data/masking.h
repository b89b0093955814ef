// The one masking rule of every micro-batch (docs/ARCHITECTURE.md#data): training's, the held-out
// batches' and the synthetic ones'.
#pragma once

#include "xlme/data/sampler.h"
#include "xlme/data/special_ids.h"

#include <cstdint>

namespace xlme::data {

struct MaskOptions {
  double ratio = 0.15;       // objectives.mask_ratio: share of a row's pieces selected
  double token_ratio = 1.0;  // objectives.mask_token_ratio: selected pieces shown as <mask>
};

// Masks one row of `length` tokens in place: k of its n non-special positions, E[k] = ratio * n
// exactly (randomized rounding), drawn uniformly without replacement by a partial Fisher-Yates
// shuffle; each is marked in `masked` and replaced by <mask> in `input` with probability
// token_ratio (ELECTRA's 85% / 15% split), else keeps its token. The draws from `rng` are
// uniform (k), then below and uniform per selected position: a row's masking is a function of
// the rng's state.
void mask_row(int64_t* input, bool* masked, int64_t length, const SpecialIds& ids,
              const MaskOptions& options, Rng& rng);

}  // namespace xlme::data
