// The `tokenizers` (HuggingFace fast tokenizer) form of an export's SentencePiece model:
// tokenizer.json, built from the model file as transformers' SpmConverter builds it (Unigram or
// BPE model with the pieces' scores, the normalizer's precompiled charsmap, the whitespace rules,
// Metaspace, XLM-R's <s> a </s></s> b </s> template), with the ids of xlme's vocabulary layout.
#pragma once

#include "xlme/data/tokenizer.h"

#include <string>

namespace xlme::export_ {

// The SentencePiece model file `spm_path` as the text of a tokenizer.json whose ids are xlme's
// for `layout` (data::Tokenizer's). Throws xlme::Error naming the file for a model that is not a
// SentencePiece model or whose pieces are not where `layout` puts them.
std::string tokenizer_json(const std::string& spm_path, data::VocabLayout layout);

}  // namespace xlme::export_
