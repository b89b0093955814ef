// A SentencePiece model seen through the XLM-R id layout that the model consumes:
// <s>=0, <pad>=1, </s>=2, <unk>=3, the pieces, <mask> last (special_ids.h).
#pragma once

#include "xlme/data/sentencepiece.h"
#include "xlme/data/special_ids.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xlme::data {

// How SentencePiece ids map onto the layout.
//   own:  models trained by xlme-data train-spm already have <s>=0, <pad>=1, </s>=2, <unk>=3
//         and their pieces from 4; the id is the SentencePiece id and <mask> = piece count.
//   xlmr: XLM-R's sentencepiece.bpe.model has <unk>=0, <s>=1, </s>=2 and no <pad>; fairseq's
//         dictionary maps <unk> -> 3, <s> -> 0, </s> -> 2, piece i >= 3 -> i + 1, adds <pad>=1
//         and <mask> = piece count + 1 (250001 for XLM-R's 250000 pieces).
enum class VocabLayout { kOwn, kXlmr };

// "own" / "xlmr" (data.vocab_layout) -> VocabLayout; throws xlme::Error otherwise.
VocabLayout parse_vocab_layout(const std::string& name);

class Tokenizer {
 public:
  // Loads the model and checks that its special pieces sit where `layout` expects them; the
  // error says which layout the model looks like.
  Tokenizer(const std::string& model_path, VocabLayout layout);

  int64_t vocab_size() const { return ids_.vocab_size; }  // <mask> included
  const SpecialIds& special_ids() const { return ids_; }
  VocabLayout layout() const { return layout_; }

  // Pieces of `text` as layout ids, without <s> and </s>.
  std::vector<int32_t> encode(const std::string& text) const;
  // Text of layout ids; <s>, <pad>, </s> and <mask> are skipped.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t from_spm(int spm_id) const;  // SentencePiece id -> layout id
  int to_spm(int32_t id) const;        // layout id -> SentencePiece id; -1 for <pad> and <mask>

  // hash64 of the model file's bytes and the layout: identifies the tokenizer in shard headers.
  uint64_t hash() const { return hash_; }
  const SentencePiece& sentencepiece() const { return spm_; }

 private:
  SentencePiece spm_;
  VocabLayout layout_;
  SpecialIds ids_;
  uint64_t hash_ = 0;
};

}  // namespace xlme::data
