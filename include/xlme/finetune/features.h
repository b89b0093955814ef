// XTREME examples -> model inputs, and model outputs -> XTREME predictions, as XTREME's Python
// code does it for XLM-R (docs/finetuning.md#input-encoding, #question-answering): sentence pairs
// with longest_first truncation, tagging with the label on each word's first sub-token and long
// sentences split at word boundaries, extractive QA with HF run_squad's windows and n-best
// decoding.
#pragma once

#include "xlme/data/tokenizer.h"
#include "xlme/finetune/examples.h"

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace xlme::finetune {

// CrossEntropy's ignore_index: sub-tokens that carry no label (XTREME's pad_token_label_id).
constexpr int64_t kIgnoreLabel = -100;

// The index of `label` in `labels`; throws xlme::Error naming `source` and listing the set.
int64_t label_index(const std::vector<std::string>& labels, const std::string& label,
                    const Source& source);

// ---- Sentence pairs (xnli, pawsx) ---------------------------------------------------------------

// `<s> A </s></s> B </s>`: transformers' encode_plus(a, b, max_length) for XLM-R.
struct ClassificationFeature {
  std::vector<int64_t> input_ids;  // layout ids, at most max_len of them
  int64_t label = -1;              // index into the label list; -1 where the example has none
  int64_t example = 0;             // index of the PairExample
};

// How many tokens of A and of B survive HF's longest_first truncation to `budget` tokens in all:
// one token at a time from the end of the longer sequence, of B on ties.
std::pair<int64_t, int64_t> longest_first_lengths(int64_t length_a, int64_t length_b,
                                                  int64_t budget);

// One feature per example; A and B are tokenized whole. max_len counts the 4 special tokens.
std::vector<ClassificationFeature> featurize_pairs(const std::vector<PairExample>& examples,
                                                   const std::vector<std::string>& labels,
                                                   const data::Tokenizer& tokenizer,
                                                   int64_t max_len = 128);

// ---- Tagging (udpos, panx) ----------------------------------------------------------------------

struct TaggingOptions {
  int64_t max_len = 128;
  // XTREME's XLM-R runs end every sequence with two </s> (run_tag's sep_token_extra), so a chunk
  // holds max_len - 3 sub-tokens; false gives `<s> … </s>` and max_len - 2.
  bool double_eos = true;
};

// One chunk of a sentence: `<s> w_first … w_last </s></s>`.
struct TaggingFeature {
  std::vector<int64_t> input_ids;   // layout ids, at most max_len of them
  std::vector<int64_t> labels;      // per token: the word's label id at its first sub-token,
                                    // kIgnoreLabel elsewhere and everywhere for untagged sentences
  std::vector<int64_t> word_index;  // per token: the word's index in its sentence at its first
                                    // sub-token, -1 elsewhere (where predictions are read)
  int64_t sentence = 0;             // index of the TaggedSentence
  int64_t first_word = 0;           // index in the sentence of the chunk's first word
};

// Each word is tokenized alone (so it starts with ▁, or with a bare ▁ piece that then carries the
// label, as in XTREME); a non-empty word with no pieces, and a word with more pieces than a chunk
// holds, becomes one <unk> (an empty word too). A sentence with more sub-tokens than a chunk
// holds is split greedily at word boundaries, as XTREME's preprocess_udpos/panx, but without its
// counter-reset bug: a new chunk starts with the current word's pieces counted. Nothing is
// truncated. Tags must be in `labels` (error naming the sentence's file:line).
std::vector<TaggingFeature> featurize_tagging(const std::vector<TaggedSentence>& sentences,
                                              const std::vector<std::string>& labels,
                                              const data::Tokenizer& tokenizer,
                                              const TaggingOptions& options = {});

// The inverse of the split: one predicted label id per word of every sentence, read at each
// word's first sub-token. `predictions[f][t]` is the label id predicted for token t of
// features[f] (at least input_ids.size() entries; argmax of the logits). Throws unless every
// word of `sentences` is covered exactly once.
std::vector<std::vector<int64_t>> stitch_tags(const std::vector<TaggingFeature>& features,
                                              const std::vector<std::vector<int64_t>>& predictions,
                                              const std::vector<TaggedSentence>& sentences);

// ---- Extractive QA (xquad, mlqa, tydiqa) --------------------------------------------------------

struct QaOptions {
  int64_t max_len = 384;
  int64_t doc_stride = 128;  // step between window starts, in context sub-tokens
  int64_t max_query_len = 64;
};

// One window of a question's context: `<s> Q </s></s> C[window] </s>`.
struct QaFeature {
  std::vector<int64_t> input_ids;  // layout ids, at most max_len of them
  int64_t start = 0, end = 0;      // training targets (token indices, inclusive); 0, 0 (<s>) when
                                   // the window does not hold the whole answer, and in evaluation
  int64_t example = 0;             // index of the QaExample
  int64_t context_offset = 0;      // context sub-token index of the window's first context token
  std::vector<int64_t> token_to_word;  // per token: the context word it comes from, -1 outside
                                       // the context (HF's token_to_orig_map)
  std::vector<uint8_t> max_context;    // per token: 1 where this window gives the token its most
                                       // context (HF's token_is_max_context), 0 elsewhere
};

struct QaFeatures {
  std::vector<QaFeature> features;  // grouped by example, in example order
  // Training only: examples left out as HF run_squad does (the whitespace-normalized answer is
  // not in the words it spans), plus those whose answer offset is outside the context, starts
  // before the first word, is empty, or spans no sub-token.
  std::vector<int64_t> skipped;
};

// The context's words as run_squad splits it: on ' ', \t, \r, \n and U+202F only. When
// `byte_to_word` is given it receives, per byte of `context`, the index of the word it belongs to
// or, on separators, of the last word before it (-1 before the first word).
std::vector<std::string> split_context_words(const std::string& context,
                                             std::vector<int64_t>* byte_to_word = nullptr);

// HF squad_convert_examples_to_features (v1, XLM-R). Training uses the first answer: its start and
// end words (answer start byte and start + size - 1), their sub-token span tightened by
// _improve_answer_span (comparing ids where HF compares piece strings: the same but for <unk>),
// and targets per window. Each word is tokenized alone; the question
// whole, truncated to max_query_len. Windows start at context sub-token 0, doc_stride, … until
// the last one reaches the context's end; each holds max_len - |Q| - 4 context sub-tokens.
QaFeatures featurize_qa(const std::vector<QaExample>& examples, const data::Tokenizer& tokenizer,
                        const QaOptions& options, bool training);

// BERT's BasicTokenizer (do_lower_case=False) as get_final_text uses it: control characters
// dropped, whitespace split, punctuation and CJK ideographs made tokens of their own.
std::vector<std::string> bert_basic_tokenize(const std::string& text);

// transformers' get_final_text(pred_text, orig_text, do_lower_case=False): the part of
// `orig_text` that `pred_text` (detokenized sub-tokens) covers, found in BasicTokenizer's view of
// orig_text and aligned character by character after removing spaces; `orig_text` itself when
// the lookup or the alignment fails.
std::string get_final_text(const std::string& pred_text, const std::string& orig_text);

struct QaDecodeOptions {
  int64_t n_best = 20;
  int64_t max_answer_len = 30;  // in sub-tokens
};

// The model's outputs for one QaFeature (at least input_ids.size() entries each).
struct QaLogits {
  std::vector<float> start, end;
};

struct QaCandidate {
  std::string text;
  double start_logit = 0, end_logit = 0;
  double probability = 0;  // softmax of start + end logits over the example's n-best list
};

struct QaPredictions {
  std::map<std::string, std::string> text;                // question id -> predicted answer
  std::map<std::string, std::vector<QaCandidate>> nbest;  // question id -> best first
};

// transformers compute_predictions_logits (v1: no null answer). Per window, the n_best highest
// start and end logits among its own tokens (HF ranks the sequence padded to max_len, where
// padding logits could crowd out real ones; ours are not padded); a pair is kept when both lie in
// the context, the start is max-context, end >= start and it spans at most max_answer_len
// sub-tokens. Pairs of all the example's windows are ranked by start + end logit; each one's text
// is its context words joined with spaces, trimmed by get_final_text to the sub-tokens' text;
// repeated texts are dropped; "empty" when nothing is kept. This word-level mapping is XTREME's,
// kept to reproduce published numbers (docs/finetuning.md#question-answering): answers never start
// or end inside a word unless get_final_text can align them. `logits[f]` belongs to
// features.features[f].
QaPredictions decode_qa(const std::vector<QaExample>& examples, const QaFeatures& features,
                        const std::vector<QaLogits>& logits, const data::Tokenizer& tokenizer,
                        const QaDecodeOptions& options = {});

// ---- Batching -----------------------------------------------------------------------------------

// Features padded to the longest of the batch.
struct PaddedBatch {
  torch::Tensor input_ids;  // [B, T] int64: <pad> after each sequence's end
  torch::Tensor padding;    // [B, T] bool: true at <pad>
  torch::Tensor positions;  // [B, T] int64: 0..T-1 on every row (as pre-training batches)
  torch::Tensor labels;     // int64: [B] class (classification), [B, T] per token with
                            // kIgnoreLabel at padding (tagging), or [B, 2] start, end (QA)
};

// The features at `indices`, padded with `pad_id`.
PaddedBatch collate(const std::vector<ClassificationFeature>& features,
                    const std::vector<int64_t>& indices, int64_t pad_id);
PaddedBatch collate(const std::vector<TaggingFeature>& features,
                    const std::vector<int64_t>& indices, int64_t pad_id);
PaddedBatch collate(const std::vector<QaFeature>& features, const std::vector<int64_t>& indices,
                    int64_t pad_id);

}  // namespace xlme::finetune
