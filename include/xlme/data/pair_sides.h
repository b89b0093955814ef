// VECO's split of a framed micro-batch into its two sides.
#pragma once

#include "xlme/data/batch.h"

namespace xlme::data {

// VECO's two sides of a micro-batch (docs/pretraining.md#veco-cross-attention-mlm), each
// framed <s> ... </s>, positions 0.. and padded to its own longest row: a row <s> a </s> b </s>
// (a translation pair, or two adjacent sentences of one document) gives x = <s> a </s> and
// y = <s> b </s>; XLM-R's doubled separator <s> a </s></s> b </s> (fine-tuning) splits the same
// way. Masked positions keep their <mask> input and their label; the added <s> and </s> are never
// masked. Host tensors in, host tensors out.
struct PairSides {
  Batch x, y;
};
PairSides split_pair(const Batch& batch, const SpecialIds& ids);

}  // namespace xlme::data
