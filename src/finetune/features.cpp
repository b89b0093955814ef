#include "xlme/finetune/features.h"

#include "xlme/common/error.h"
#include "xlme/data/text.h"
#include "xlme/finetune/text.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string_view>

namespace xlme::finetune {
namespace {

std::string where(const Source& source) {
  return source.line > 0 ? fmt::format("{}:{}", source.file, source.line) : source.file;
}

// BERT's _is_punctuation: every non-alphanumeric ASCII character, and Unicode category P*.
bool is_bert_punctuation(char32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126)) {
    return true;
  }
  return text::is_punctuation(cp);
}

// BERT's _is_chinese_char: the CJK Unified Ideographs blocks (not Hiragana, Katakana, Hangul).
bool is_cjk(char32_t cp) {
  return (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x3400 && cp <= 0x4dbf) ||
         (cp >= 0x20000 && cp <= 0x2a6df) || (cp >= 0x2a700 && cp <= 0x2b73f) ||
         (cp >= 0x2b740 && cp <= 0x2b81f) || (cp >= 0x2b820 && cp <= 0x2ceaf) ||
         (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0x2f800 && cp <= 0x2fa1f);
}

std::vector<std::u32string> basic_tokenize(std::u32string_view input) {
  // _clean_text: drop NUL, U+FFFD and category C* but \t \n \r; whitespace (those three and
  // category Zs) becomes a space. _tokenize_chinese_chars: spaces around each ideograph.
  std::u32string cleaned;
  for (const char32_t cp : input) {
    const bool whitespace =
        cp == U' ' || cp == U'\t' || cp == U'\n' || cp == U'\r' || text::is_space_separator(cp);
    if (whitespace) {
      cleaned.push_back(U' ');
    } else if (cp == 0 || cp == 0xfffd || text::is_other(cp)) {
      continue;
    } else if (is_cjk(cp)) {
      cleaned += {U' ', cp, U' '};
    } else {
      cleaned.push_back(cp);
    }
  }
  // _run_split_on_punc on every whitespace token: each punctuation character stands alone.
  std::vector<std::u32string> out;
  for (const auto& token : text::split(cleaned)) {
    bool start_new = true;
    for (const char32_t cp : token) {
      if (is_bert_punctuation(cp)) {
        out.emplace_back(1, cp);
        start_new = true;
      } else {
        if (start_new) out.emplace_back();
        out.back().push_back(cp);
        start_new = false;
      }
    }
  }
  return out;
}

// get_final_text's _strip_spaces: `text` without ' ', and for each kept character its index in
// `text`.
std::pair<std::u32string, std::vector<size_t>> strip_spaces(std::u32string_view text) {
  std::u32string kept;
  std::vector<size_t> to_original;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == U' ') continue;
    kept.push_back(text[i]);
    to_original.push_back(i);
  }
  return {kept, to_original};
}

std::vector<int64_t> encode_ids(const data::Tokenizer& tokenizer, const std::string& text) {
  const auto ids = tokenizer.encode(text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// Text fields cut before tokenization to data::kMaxBytesPerPiece bytes per token of the setting
// that bounds them: the cut changes no feature of real text, and bounds the tokenizer's memory
// (which grows with the text's length) on a hostile one.
class FeatTextBound {
 public:
  // `tokens` is the setting that bounds the field (`name`, e.g. "max_len").
  FeatTextBound(int64_t tokens, const char* name)
      : tokens_(tokens),
        bytes_(static_cast<size_t>(tokens * data::kMaxBytesPerPiece)),
        name_(name) {}

  // The ids of `text`, cut to the bound at a code-point boundary first.
  std::vector<int64_t> encode(const data::Tokenizer& tokenizer, const std::string& text,
                              const Source& source) {
    if (text.size() <= bytes_) return encode_ids(tokenizer, text);
    if (cut_++ == 0) first_ = source;
    return encode_ids(tokenizer, std::string(data::utf8_prefix(text, bytes_)));
  }

  // Logs how many fields were cut, naming the first one's file and line.
  void report() const {
    if (cut_ == 0) return;
    spdlog::warn(
        "{}: {} text field(s) longer than {} bytes ({} bytes per token of {} {}) were cut to "
        "that length before tokenization, the first at {}",
        first_.file, cut_, bytes_, data::kMaxBytesPerPiece, name_, tokens_, where(first_));
  }

 private:
  int64_t tokens_;
  size_t bytes_;
  const char* name_;
  int64_t cut_ = 0;
  Source first_;
};

std::string join_words(const std::vector<std::string>& words, int64_t first, int64_t last) {
  std::string out;
  for (int64_t w = first; w <= last; ++w) {
    if (w > first) out.push_back(' ');
    out += words[static_cast<size_t>(w)];
  }
  return out;
}

// XLM-R's convert_tokens_to_string followed by compute_predictions_logits's clean-up: pieces
// concatenated, ▁ -> space, "##" removed, whitespace stripped and collapsed.
std::string pieces_text(const data::Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                        int64_t first, int64_t last) {
  std::string joined;
  for (int64_t t = first; t <= last; ++t) {
    const int spm_id = tokenizer.to_spm(static_cast<int32_t>(ids[static_cast<size_t>(t)]));
    if (spm_id >= 0) joined += tokenizer.sentencepiece().id_to_piece(spm_id);
  }
  std::u32string spaced;
  for (const char32_t cp : text::decode_utf8(joined)) spaced.push_back(cp == U'\u2581' ? U' ' : cp);
  std::u32string detok = text::strip(spaced);
  for (const std::u32string_view pattern :
       {std::u32string_view(U" ##"), std::u32string_view(U"##")}) {
    for (size_t at = detok.find(pattern); at != std::u32string::npos;
         at = detok.find(pattern, at)) {
      detok.erase(at, pattern.size());
    }
  }
  return text::encode_utf8(text::collapse(detok));
}

// _get_best_indexes: the `n` indices of the highest values among the first `size`, ties in index
// order (Python's stable sort).
std::vector<int64_t> best_indexes(const std::vector<float>& values, size_t size, int64_t n) {
  std::vector<int64_t> order(size);
  for (size_t i = 0; i < size; ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return values[static_cast<size_t>(a)] > values[static_cast<size_t>(b)];
  });
  if (static_cast<int64_t>(order.size()) > n) order.resize(static_cast<size_t>(n));
  return order;
}

template <typename Feature>
PaddedBatch collate_inputs(const std::vector<Feature>& features,
                           const std::vector<int64_t>& indices, int64_t pad_id) {
  int64_t width = 0;
  for (const int64_t i : indices) {
    XLME_CHECK(i >= 0 && i < static_cast<int64_t>(features.size()),
               "collate: feature index {} is out of range (there are {} features)", i,
               features.size());
    width =
        std::max(width, static_cast<int64_t>(features[static_cast<size_t>(i)].input_ids.size()));
  }
  const auto rows = static_cast<int64_t>(indices.size());
  PaddedBatch batch;
  batch.input_ids = torch::full({rows, width}, pad_id, torch::kInt64);      // [B, T]
  batch.padding = torch::ones({rows, width}, torch::kBool);                 // [B, T]
  batch.positions = torch::arange(width, torch::kInt64).repeat({rows, 1});  // [B, T]
  auto* input = batch.input_ids.data_ptr<int64_t>();
  auto* padding = batch.padding.data_ptr<bool>();
  for (int64_t b = 0; b < rows; ++b) {
    const auto& ids = features[static_cast<size_t>(indices[static_cast<size_t>(b)])].input_ids;
    std::copy(ids.begin(), ids.end(), input + b * width);
    std::fill(padding + b * width, padding + b * width + static_cast<int64_t>(ids.size()), false);
  }
  return batch;
}

}  // namespace

int64_t label_index(const std::vector<std::string>& labels, const std::string& label,
                    const Source& source) {
  const auto it = std::find(labels.begin(), labels.end(), label);
  XLME_CHECK(it != labels.end(), "{}: label '{}' is not in the label set: {}", where(source), label,
             fmt::join(labels, " "));
  return it - labels.begin();
}

// ---- Sentence pairs -----------------------------------------------------------------------------

std::pair<int64_t, int64_t> longest_first_lengths(int64_t length_a, int64_t length_b,
                                                  int64_t budget) {
  XLME_CHECK(budget >= 0, "longest_first: a budget of {} tokens", budget);
  int64_t remove = std::max<int64_t>(0, length_a + length_b - budget);
  // HF removes from the longer sequence until both are equally long, then alternates starting
  // with B (ties go to B): B loses the rounded-up half of the rest.
  const int64_t first = std::min(remove, std::abs(length_a - length_b));
  (length_a > length_b ? length_a : length_b) -= first;
  remove -= first;
  return {length_a - remove / 2, length_b - (remove + 1) / 2};
}

std::vector<ClassificationFeature> featurize_pairs(const std::vector<PairExample>& examples,
                                                   const std::vector<std::string>& labels,
                                                   const data::Tokenizer& tokenizer,
                                                   int64_t max_len) {
  XLME_CHECK(max_len >= 4, "sentence pairs need max_len >= 4 for <s> </s></s> </s>, got {}",
             max_len);
  const auto& special = tokenizer.special_ids();
  std::vector<ClassificationFeature> features;
  features.reserve(examples.size());
  FeatTextBound bound(max_len, "max_len");
  for (size_t e = 0; e < examples.size(); ++e) {
    const PairExample& example = examples[e];
    ClassificationFeature feature;
    feature.example = static_cast<int64_t>(e);
    feature.label = example.label.empty() ? -1 : label_index(labels, example.label, example.source);
    const auto a = bound.encode(tokenizer, example.text_a, example.source);
    const auto b = bound.encode(tokenizer, example.text_b, example.source);
    const auto [keep_a, keep_b] = longest_first_lengths(
        static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size()), max_len - 4);
    auto& ids = feature.input_ids;
    ids.push_back(special.bos);
    ids.insert(ids.end(), a.begin(), a.begin() + keep_a);
    ids.insert(ids.end(), {special.eos, special.eos});
    ids.insert(ids.end(), b.begin(), b.begin() + keep_b);
    ids.push_back(special.eos);
    features.push_back(std::move(feature));
  }
  bound.report();
  return features;
}

// ---- Tagging ------------------------------------------------------------------------------------

std::vector<TaggingFeature> featurize_tagging(const std::vector<TaggedSentence>& sentences,
                                              const std::vector<std::string>& labels,
                                              const data::Tokenizer& tokenizer,
                                              const TaggingOptions& options) {
  const int64_t specials = options.double_eos ? 3 : 2;
  const int64_t limit = options.max_len - specials;
  XLME_CHECK(limit >= 1, "tagging needs max_len > {} (the special tokens), got {}", specials,
             options.max_len);
  const auto& special = tokenizer.special_ids();
  std::vector<TaggingFeature> features;
  // A word cut to max_len * 64 bytes still has more pieces than a chunk holds: still one <unk>.
  FeatTextBound bound(options.max_len, "max_len");
  for (size_t s = 0; s < sentences.size(); ++s) {
    const TaggedSentence& sentence = sentences[s];
    const auto& words = sentence.words;
    XLME_CHECK(sentence.tags.empty() || sentence.tags.size() == words.size(),
               "{}: a sentence of {} words has {} tags", where(sentence.source), words.size(),
               sentence.tags.size());
    std::vector<std::vector<int64_t>> pieces(words.size());
    std::vector<int64_t> label_ids(words.size(), kIgnoreLabel);
    for (size_t w = 0; w < words.size(); ++w) {
      pieces[w] = bound.encode(tokenizer, words[w], sentence.source);
      if (pieces[w].empty() || static_cast<int64_t>(pieces[w].size()) > limit) {
        pieces[w] = {special.unk};
      }
      if (!sentence.tags.empty())
        label_ids[w] = label_index(labels, sentence.tags[w], sentence.source);
    }
    const auto emit = [&](size_t first, size_t last) {
      TaggingFeature feature;
      feature.sentence = static_cast<int64_t>(s);
      feature.first_word = static_cast<int64_t>(first);
      const auto push = [&feature](int64_t id, int64_t label, int64_t word) {
        feature.input_ids.push_back(id);
        feature.labels.push_back(label);
        feature.word_index.push_back(word);
      };
      push(special.bos, kIgnoreLabel, -1);
      for (size_t w = first; w < last; ++w) {
        for (size_t p = 0; p < pieces[w].size(); ++p) {
          push(pieces[w][p], p == 0 ? label_ids[w] : kIgnoreLabel,
               p == 0 ? static_cast<int64_t>(w) : -1);
        }
      }
      for (int64_t k = 1; k < specials; ++k) push(special.eos, kIgnoreLabel, -1);
      features.push_back(std::move(feature));
    };
    // Greedy at word boundaries (XTREME's _preprocess_one_file). XTREME reset the count to 0 after
    // a split, letting the next chunk overflow (and run_tag truncate it); it restarts at the
    // current word's size here.
    size_t first = 0;
    int64_t count = 0;
    for (size_t w = 0; w < words.size(); ++w) {
      const auto size = static_cast<int64_t>(pieces[w].size());
      if (count + size > limit) {
        emit(first, w);
        first = w;
        count = size;
      } else {
        count += size;
      }
    }
    if (!words.empty()) emit(first, words.size());
  }
  bound.report();
  return features;
}

std::vector<std::vector<int64_t>> stitch_tags(const std::vector<TaggingFeature>& features,
                                              const std::vector<std::vector<int64_t>>& predictions,
                                              const std::vector<TaggedSentence>& sentences) {
  XLME_CHECK(predictions.size() == features.size(),
             "stitch_tags: {} prediction rows for {} features", predictions.size(),
             features.size());
  std::vector<std::vector<int64_t>> tags(sentences.size());
  std::vector<std::vector<uint8_t>> covered(sentences.size());
  for (size_t s = 0; s < sentences.size(); ++s) {
    tags[s].assign(sentences[s].words.size(), -1);
    covered[s].assign(sentences[s].words.size(), 0);
  }
  for (size_t f = 0; f < features.size(); ++f) {
    const TaggingFeature& feature = features[f];
    XLME_CHECK(feature.sentence >= 0 && feature.sentence < static_cast<int64_t>(sentences.size()),
               "stitch_tags: feature {} belongs to sentence {}, but there are {} sentences", f,
               feature.sentence, sentences.size());
    XLME_CHECK(predictions[f].size() >= feature.input_ids.size(),
               "stitch_tags: feature {} has {} tokens but {} predictions", f,
               feature.input_ids.size(), predictions[f].size());
    const auto s = static_cast<size_t>(feature.sentence);
    for (size_t t = 0; t < feature.word_index.size(); ++t) {
      const int64_t w = feature.word_index[t];
      if (w < 0) continue;
      XLME_CHECK(w < static_cast<int64_t>(tags[s].size()) && !covered[s][static_cast<size_t>(w)],
                 "stitch_tags: {}: word {} of a {}-word sentence is out of range or predicted "
                 "twice (feature {})",
                 where(sentences[s].source), w, tags[s].size(), f);
      tags[s][static_cast<size_t>(w)] = predictions[f][t];
      covered[s][static_cast<size_t>(w)] = 1;
    }
  }
  for (size_t s = 0; s < sentences.size(); ++s) {
    const auto missing = std::find(covered[s].begin(), covered[s].end(), 0);
    XLME_CHECK(missing == covered[s].end(), "stitch_tags: {}: word {} has no prediction",
               where(sentences[s].source), missing - covered[s].begin());
  }
  return tags;
}

// ---- Extractive QA ------------------------------------------------------------------------------

std::vector<std::string> split_context_words(const std::string& context,
                                             std::vector<int64_t>* byte_to_word) {
  std::vector<std::string> words;
  if (byte_to_word != nullptr) byte_to_word->clear();
  bool after_separator = true;
  for (size_t i = 0; i < context.size();) {
    const auto [code_point, length, valid] = data::utf8_char_at(context, i);
    const char32_t cp = valid ? code_point : U'\ufffd';
    if (cp == U' ' || cp == U'\t' || cp == U'\r' || cp == U'\n' || cp == 0x202f) {
      after_separator = true;
    } else {
      if (after_separator) words.emplace_back();
      words.back().append(context, i, length);
      after_separator = false;
    }
    if (byte_to_word != nullptr) {
      byte_to_word->insert(byte_to_word->end(), length, static_cast<int64_t>(words.size()) - 1);
    }
    i += length;
  }
  return words;
}

namespace {

// A context's words (split_context_words) and sub-tokens, each word tokenized alone as HF's
// squad_convert_example_to_features does.
struct QaContext {
  std::vector<std::string> words;
  std::vector<int64_t> byte_to_word;   // per byte of the context: its word (split_context_words)
  std::vector<int64_t> tokens;         // the context's sub-token ids (HF's all_doc_tokens)
  std::vector<int64_t> token_to_word;  // per sub-token: the word it comes from
  std::vector<int64_t> word_to_token;  // per word: its first sub-token
};

QaContext tokenize_context(const QaExample& example, const data::Tokenizer& tokenizer,
                           FeatTextBound& bound) {
  QaContext context;
  context.words = split_context_words(example.context, &context.byte_to_word);
  context.word_to_token.resize(context.words.size());
  for (size_t w = 0; w < context.words.size(); ++w) {
    context.word_to_token[w] = static_cast<int64_t>(context.tokens.size());
    for (const int64_t id : bound.encode(tokenizer, context.words[w], example.source)) {
      context.tokens.push_back(id);
      context.token_to_word.push_back(static_cast<int64_t>(w));
    }
  }
  return context;
}

// The first answer's first and last words, as SquadExample: the words of its first and last byte.
// Nothing when run_squad skips the example: no answer, or the words it spans do not contain the
// whitespace-normalized answer.
std::optional<std::pair<int64_t, int64_t>> answer_words(const QaExample& example,
                                                        const QaContext& context) {
  const QaAnswer* answer = example.answers.empty() ? nullptr : &example.answers[0];
  const auto context_size = static_cast<int64_t>(example.context.size());
  if (answer == nullptr || answer->text.empty() || answer->start < 0 ||
      answer->start >= context_size) {
    return std::nullopt;
  }
  const int64_t start_word = context.byte_to_word[static_cast<size_t>(answer->start)];
  const int64_t end_word = context.byte_to_word[static_cast<size_t>(
      std::min(answer->start + static_cast<int64_t>(answer->text.size()) - 1, context_size - 1))];
  const bool found =
      start_word >= 0 &&
      join_words(context.words, start_word, end_word)
              .find(text::encode_utf8(text::collapse(text::decode_utf8(answer->text)))) !=
          std::string::npos;
  if (!found) return std::nullopt;
  return std::make_pair(start_word, end_word);
}

// The answer's context sub-tokens, first and last (inclusive).
struct AnswerSpan {
  int64_t first = 0;
  int64_t last = 0;
};

// _improve_answer_span: the sub-tokens of the answer's words, tightened to the first, then
// longest, sub-span equal to the answer's own pieces. Nothing when the words have no pieces.
std::optional<AnswerSpan> answer_tokens(const QaExample& example, const QaContext& context,
                                        std::pair<int64_t, int64_t> words,
                                        const data::Tokenizer& tokenizer, FeatTextBound& bound) {
  const auto [start_word, end_word] = words;
  const auto num_words = static_cast<int64_t>(context.words.size());
  int64_t first = context.word_to_token[static_cast<size_t>(start_word)];
  int64_t last = end_word < num_words - 1
                     ? context.word_to_token[static_cast<size_t>(end_word + 1)] - 1
                     : static_cast<int64_t>(context.tokens.size()) - 1;
  const auto answer_ids = bound.encode(tokenizer, example.answers[0].text, example.source);
  bool improved = false;
  for (int64_t s = first; s <= last && !improved; ++s) {
    for (int64_t t = last; t >= s && !improved; --t) {
      if (t - s + 1 == static_cast<int64_t>(answer_ids.size()) &&
          std::equal(answer_ids.begin(), answer_ids.end(), context.tokens.begin() + s)) {
        first = s;
        last = t;
        improved = true;
      }
    }
  }
  if (last < first) return std::nullopt;
  return AnswerSpan{first, last};
}

// The question's ids, truncated to max_query_len.
std::vector<int64_t> encode_question(const QaExample& example, const data::Tokenizer& tokenizer,
                                     const QaOptions& options, FeatTextBound& bound) {
  auto query = bound.encode(tokenizer, example.question, example.source);
  if (static_cast<int64_t>(query.size()) > options.max_query_len) {
    query.resize(static_cast<size_t>(options.max_query_len));
  }
  return query;
}

// (first context sub-token, length) of each window: starts at 0, stride, ... until one reaches
// the last of `tokens` sub-tokens; each holds at most `capacity`.
using Windows = std::vector<std::pair<int64_t, int64_t>>;
Windows context_windows(int64_t tokens, int64_t capacity, int64_t stride) {
  Windows windows;
  while (static_cast<int64_t>(windows.size()) * stride < tokens) {
    const int64_t first = static_cast<int64_t>(windows.size()) * stride;
    windows.emplace_back(first, std::min(tokens - first, capacity));
    if (first + windows.back().second >= tokens) break;
  }
  return windows;
}

// _new_check_is_max_context: whether window `k` is the one maximizing min(left, right) + 0.01 *
// length around context sub-token `position`, the first one on ties.
bool is_max_context(const Windows& windows, size_t k, int64_t position) {
  double best = -1;
  size_t best_window = 0;
  for (size_t m = 0; m < windows.size(); ++m) {
    const auto [first, length] = windows[m];
    const int64_t last = first + length - 1;
    if (position < first || position > last) continue;
    const double score = static_cast<double>(std::min(position - first, last - position)) +
                         0.01 * static_cast<double>(length);
    if (score > best) {
      best = score;
      best_window = m;
    }
  }
  return best_window == k;
}

// Window `k` of example `example`: `<s> Q </s></s> C[window] </s>`, with the training targets
// when `answer` (its context sub-token span) lies inside the window.
QaFeature make_window(int64_t example, const std::vector<int64_t>& query, const QaContext& context,
                      const Windows& windows, size_t k, const std::optional<AnswerSpan>& answer,
                      const data::SpecialIds& special) {
  const auto [first, length] = windows[k];
  const auto offset = static_cast<int64_t>(query.size()) + 3;  // <s> Q </s></s>
  QaFeature feature;
  feature.example = example;
  feature.context_offset = first;
  auto& ids = feature.input_ids;
  ids.push_back(special.bos);
  ids.insert(ids.end(), query.begin(), query.end());
  ids.insert(ids.end(), {special.eos, special.eos});
  ids.insert(ids.end(), context.tokens.begin() + first, context.tokens.begin() + first + length);
  ids.push_back(special.eos);
  feature.token_to_word.assign(ids.size(), -1);
  feature.max_context.assign(ids.size(), 0);
  for (int64_t j = 0; j < length; ++j) {
    const int64_t position = first + j;
    feature.token_to_word[static_cast<size_t>(offset + j)] =
        context.token_to_word[static_cast<size_t>(position)];
    feature.max_context[static_cast<size_t>(offset + j)] =
        is_max_context(windows, k, position) ? 1 : 0;
  }
  if (answer && answer->first >= first && answer->last <= first + length - 1) {
    feature.start = answer->first - first + offset;
    feature.end = answer->last - first + offset;
  }
  return feature;
}

}  // namespace

QaFeatures featurize_qa(const std::vector<QaExample>& examples, const data::Tokenizer& tokenizer,
                        const QaOptions& options, bool training) {
  XLME_CHECK(options.doc_stride >= 1 && options.max_query_len >= 0,
             "QA needs doc_stride >= 1 and max_query_len >= 0, got {} and {}", options.doc_stride,
             options.max_query_len);
  QaFeatures out;
  // Context words and answers by max_len (a longer word fills whole windows), questions by
  // max_query_len.
  FeatTextBound context_bound(options.max_len, "max_len");
  FeatTextBound query_bound(options.max_query_len, "max_query_len");
  // The context's words and sub-tokens, kept while consecutive questions share a paragraph.
  const std::string* context_text = nullptr;
  QaContext context;
  for (size_t e = 0; e < examples.size(); ++e) {
    const QaExample& example = examples[e];
    if (context_text == nullptr || *context_text != example.context) {
      context_text = &example.context;
      context = tokenize_context(example, tokenizer, context_bound);
    }

    // Training targets: the answer's context sub-tokens; an example without them is skipped.
    std::optional<AnswerSpan> answer;
    if (training) {
      const auto words = answer_words(example, context);
      if (words) answer = answer_tokens(example, context, *words, tokenizer, context_bound);
      if (!answer) {
        out.skipped.push_back(static_cast<int64_t>(e));
        continue;
      }
    }

    const auto query = encode_question(example, tokenizer, options, query_bound);
    // Context sub-tokens per window: max_len less <s> Q </s></s> and the closing </s>.
    const int64_t capacity = options.max_len - static_cast<int64_t>(query.size()) - 4;
    XLME_CHECK(capacity >= options.doc_stride,
               "{}: question '{}' leaves {} context tokens per window, fewer than doc_stride {}; "
               "raise max_len or lower max_query_len",
               where(example.source), example.id, capacity, options.doc_stride);
    const auto windows =
        context_windows(static_cast<int64_t>(context.tokens.size()), capacity, options.doc_stride);
    for (size_t k = 0; k < windows.size(); ++k) {
      out.features.push_back(make_window(static_cast<int64_t>(e), query, context, windows, k,
                                         answer, tokenizer.special_ids()));
    }
  }
  context_bound.report();
  query_bound.report();
  return out;
}

std::vector<std::string> bert_basic_tokenize(const std::string& input) {
  std::vector<std::string> out;
  for (const auto& token : basic_tokenize(text::decode_utf8(input)))
    out.push_back(text::encode_utf8(token));
  return out;
}

std::string get_final_text(const std::string& pred_text, const std::string& orig_text) {
  const std::u32string pred = text::decode_utf8(pred_text), orig = text::decode_utf8(orig_text);
  const std::u32string tok = text::join(basic_tokenize(orig));
  const size_t start = tok.find(pred);
  if (start == std::u32string::npos || pred.empty()) return orig_text;
  const size_t end = start + pred.size() - 1;

  const auto [orig_ns, orig_ns_to_s] = strip_spaces(orig);
  const auto [tok_ns, tok_ns_to_s] = strip_spaces(tok);
  if (orig_ns.size() != tok_ns.size()) return orig_text;
  // Positions of `tok` -> positions without spaces; the span's ends must not be spaces.
  const auto to_ns = [&tok_ns_to_s = tok_ns_to_s](size_t s) -> int64_t {
    const auto it = std::lower_bound(tok_ns_to_s.begin(), tok_ns_to_s.end(), s);
    return it != tok_ns_to_s.end() && *it == s ? it - tok_ns_to_s.begin() : -1;
  };
  const int64_t ns_start = to_ns(start), ns_end = to_ns(end);
  if (ns_start < 0 || ns_end < 0) return orig_text;
  const size_t orig_start = orig_ns_to_s[static_cast<size_t>(ns_start)];
  const size_t orig_end = orig_ns_to_s[static_cast<size_t>(ns_end)];
  return text::encode_utf8(std::u32string_view(orig).substr(orig_start, orig_end - orig_start + 1));
}

QaPredictions decode_qa(const std::vector<QaExample>& examples, const QaFeatures& features,
                        const std::vector<QaLogits>& logits, const data::Tokenizer& tokenizer,
                        const QaDecodeOptions& options) {
  XLME_CHECK(logits.size() == features.features.size(), "decode_qa: {} logit rows for {} features",
             logits.size(), features.features.size());
  std::vector<std::vector<size_t>> by_example(examples.size());
  for (size_t f = 0; f < features.features.size(); ++f) {
    const QaFeature& feature = features.features[f];
    XLME_CHECK(feature.example >= 0 && feature.example < static_cast<int64_t>(examples.size()),
               "decode_qa: feature {} belongs to example {}, but there are {} examples", f,
               feature.example, examples.size());
    XLME_CHECK(logits[f].start.size() >= feature.input_ids.size() &&
                   logits[f].end.size() >= feature.input_ids.size(),
               "decode_qa: feature {} has {} tokens but {} start and {} end logits", f,
               feature.input_ids.size(), logits[f].start.size(), logits[f].end.size());
    by_example[static_cast<size_t>(feature.example)].push_back(f);
  }

  struct Prelim {
    size_t feature;
    int64_t start, end;
    double start_logit, end_logit;
  };
  QaPredictions out;
  for (size_t e = 0; e < examples.size(); ++e) {
    const QaExample& example = examples[e];
    std::vector<Prelim> prelim;
    for (const size_t f : by_example[e]) {
      const QaFeature& feature = features.features[f];
      const size_t size = feature.input_ids.size();
      for (const int64_t s : best_indexes(logits[f].start, size, options.n_best)) {
        for (const int64_t t : best_indexes(logits[f].end, size, options.n_best)) {
          if (feature.token_to_word[static_cast<size_t>(s)] < 0 ||
              feature.token_to_word[static_cast<size_t>(t)] < 0 ||
              !feature.max_context[static_cast<size_t>(s)] || t < s ||
              t - s + 1 > options.max_answer_len) {
            continue;
          }
          prelim.push_back({f, s, t, logits[f].start[static_cast<size_t>(s)],
                            logits[f].end[static_cast<size_t>(t)]});
        }
      }
    }
    std::stable_sort(prelim.begin(), prelim.end(), [](const Prelim& a, const Prelim& b) {
      return a.start_logit + a.end_logit > b.start_logit + b.end_logit;
    });

    std::vector<QaCandidate> nbest;
    std::set<std::string> seen;
    std::vector<std::string> words;
    if (!prelim.empty()) words = split_context_words(example.context);
    for (const Prelim& p : prelim) {
      if (static_cast<int64_t>(nbest.size()) >= options.n_best) break;
      const QaFeature& feature = features.features[p.feature];
      const std::string orig_text =
          join_words(words, feature.token_to_word[static_cast<size_t>(p.start)],
                     feature.token_to_word[static_cast<size_t>(p.end)]);
      std::string text =
          get_final_text(pieces_text(tokenizer, feature.input_ids, p.start, p.end), orig_text);
      if (!seen.insert(text).second) continue;
      nbest.push_back({std::move(text), p.start_logit, p.end_logit, 0});
    }
    if (nbest.empty()) nbest.push_back({"empty", 0, 0, 0});

    // _compute_softmax over the n-best totals.
    double max_score = -HUGE_VAL, sum = 0;
    for (const auto& c : nbest) max_score = std::max(max_score, c.start_logit + c.end_logit);
    for (auto& c : nbest) {
      c.probability = std::exp(c.start_logit + c.end_logit - max_score);
      sum += c.probability;
    }
    for (auto& c : nbest) c.probability /= sum;

    out.text[example.id] = nbest.front().text;
    out.nbest[example.id] = std::move(nbest);
  }
  return out;
}

// ---- Batching -----------------------------------------------------------------------------------

PaddedBatch collate(const std::vector<ClassificationFeature>& features,
                    const std::vector<int64_t>& indices, int64_t pad_id) {
  PaddedBatch batch = collate_inputs(features, indices, pad_id);
  batch.labels = torch::empty({static_cast<int64_t>(indices.size())}, torch::kInt64);  // [B]
  auto* labels = batch.labels.data_ptr<int64_t>();
  for (size_t b = 0; b < indices.size(); ++b) {
    labels[b] = features[static_cast<size_t>(indices[b])].label;
  }
  return batch;
}

PaddedBatch collate(const std::vector<TaggingFeature>& features,
                    const std::vector<int64_t>& indices, int64_t pad_id) {
  PaddedBatch batch = collate_inputs(features, indices, pad_id);
  const int64_t width = batch.input_ids.size(1);
  batch.labels = torch::full({static_cast<int64_t>(indices.size()), width}, kIgnoreLabel,
                             torch::kInt64);  // [B, T]
  auto* labels = batch.labels.data_ptr<int64_t>();
  for (size_t b = 0; b < indices.size(); ++b) {
    const auto& row = features[static_cast<size_t>(indices[b])].labels;
    std::copy(row.begin(), row.end(), labels + static_cast<int64_t>(b) * width);
  }
  return batch;
}

PaddedBatch collate(const std::vector<QaFeature>& features, const std::vector<int64_t>& indices,
                    int64_t pad_id) {
  PaddedBatch batch = collate_inputs(features, indices, pad_id);
  batch.labels = torch::empty({static_cast<int64_t>(indices.size()), 2}, torch::kInt64);  // [B, 2]
  auto* labels = batch.labels.data_ptr<int64_t>();
  for (size_t b = 0; b < indices.size(); ++b) {
    const QaFeature& feature = features[static_cast<size_t>(indices[b])];
    labels[2 * b] = feature.start;
    labels[2 * b + 1] = feature.end;
  }
  return batch;
}

}  // namespace xlme::finetune
