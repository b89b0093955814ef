// The special ids every area agrees on, and the two pre-training tasks: plain values, so that
// the tokenizer, the shard writers and the export's config need no tensor type.
#pragma once

#include <cstdint>

namespace xlme::data {

// The XLM-R id layout, used for both XLM-R's vocabulary and the models xlme-data trains:
// <s>=0, <pad>=1, </s>=2, <unk>=3, then the SentencePiece pieces, <mask> last.
struct SpecialIds {
  int64_t bos = 0;   // <s>
  int64_t pad = 1;   // <pad>
  int64_t eos = 2;   // </s>
  int64_t unk = 3;   // <unk>
  int64_t mask = 0;  // <mask> = vocab_size - 1
  int64_t vocab_size = 0;

  static SpecialIds for_vocab(int64_t vocab_size) {
    SpecialIds ids;
    ids.mask = vocab_size - 1;
    ids.vocab_size = vocab_size;
    return ids;
  }
  bool is_special(int64_t id) const {
    return id == bos || id == pad || id == eos || id == unk || id == mask;
  }
};

enum class Task { kMono, kPara };  // MRTD (monolingual) or TRTD (translation pairs)

}  // namespace xlme::data
