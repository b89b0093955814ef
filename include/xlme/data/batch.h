// What the data pipeline hands a training step, and the special ids every area agrees on.
// Data (issue #3) fills these; the model and objectives (issue #4) and the trainer (issue #5)
// only read them.
#pragma once

#include <torch/types.h>

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

// One micro-batch of one task, masked and ready for the generator.
struct Batch {
  Task task = Task::kMono;
  torch::Tensor input_ids;  // [B, T] int64: tokens, selected positions replaced by <mask>
  torch::Tensor labels;     // [B, T] int64: the original tokens
  torch::Tensor masked;     // [B, T] bool: positions selected for prediction (never special)
  torch::Tensor padding;    // [B, T] bool: true at <pad>
  torch::Tensor positions;  // [B, T] int64: absolute position ids (TRTD may restart them at f)
  int64_t real_tokens = 0;  // non-padding tokens in the batch
};

}  // namespace xlme::data
