// XTREME featurization with a real SentencePiece model (XLM-R layout, trained here on a small
// multilingual corpus with CJK runs): longest_first against a naive reference, first-sub-token
// labels, the word-boundary split and its stitching, QA windows and answers round trip,
// get_final_text, n-best decoding, collate.
#include "xlme/finetune/features.h"

#include "test_util.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <numeric>
#include <sstream>

namespace xlme::finetune {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

const std::vector<std::string> kFeatWords = {
    "the",   "house", "green",  "river", "water", "small",  "light",  "Haus",    "grün",
    "Fluss", "über",  "Wasser", "klein", "Licht", "дом",    "река",   "зелёный", "вода",
    "малый", "свет",  "city",   "Stadt", "город", "bridge", "Brücke", "мост"};
const std::vector<std::string> kFeatCjk = {"水", "河", "家", "光", "小", "城市", "绿色", "大桥"};

// A deterministic generator for corpora and test data.
struct FeatRng {
  unsigned state;
  unsigned next() {
    state = state * 1103515245u + 12345u;
    return state >> 8;
  }
};

// Words of the corpus vocabulary, CJK runs now and then, a period after some.
std::vector<std::string> feat_random_words(int count, unsigned seed) {
  FeatRng rng{seed};
  std::vector<std::string> words;
  for (int i = 0; i < count; ++i) {
    const unsigned r = rng.next();
    std::string word;
    if (r % 4 == 0) {
      for (unsigned k = 0; k < 1 + (r >> 12) % 3; ++k)
        word += kFeatCjk[(r / 8 + k) % kFeatCjk.size()];
    } else {
      word = kFeatWords[(r >> 4) % kFeatWords.size()];
    }
    if ((r >> 16) % 7 == 0) word += ".";
    words.push_back(word);
  }
  return words;
}

std::string feat_join(const std::vector<std::string>& words, size_t first, size_t last) {
  std::string out;
  for (size_t i = first; i < last; ++i) out += (i > first ? " " : "") + words[i];
  return out;
}

class FinetuneFeatures : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      std::string corpus;
      for (int line = 0; line < 600; ++line) {
        const auto words = feat_random_words(9, 12345u + static_cast<unsigned>(line));
        corpus += feat_join(words, 0, words.size()) + (line % 3 == 0 ? " .\n" : "\n");
      }
      write_file(*dir_ / "corpus.txt", corpus);
      // spm_train's default ids (<unk>=0, <s>=1, </s>=2) are XLM-R's: the xlmr layout.
      const std::string command = "spm_train --input=" + (*dir_ / "corpus.txt") +
                                  " --model_prefix=" + (*dir_ / "m") +
                                  " --vocab_size=100 --model_type=unigram --character_coverage=1.0";
      xlme::testing::run_or_throw(command, *dir_ / "train.log");
      tok_ = new data::Tokenizer(*dir_ / "m.model", data::VocabLayout::kXlmr);
    });
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  inline static xlme::testing::SuiteSetUp setup_;
  void SetUp() override { setup_.check(); }

  // The layout id of a piece; the piece must exist.
  static int64_t id(const std::string& piece) {
    const int spm_id = tok_->sentencepiece().piece_to_id(piece);
    EXPECT_EQ(tok_->sentencepiece().id_to_piece(spm_id), piece) << "no piece " << piece;
    return tok_->from_spm(spm_id);
  }
  static std::vector<int64_t> encode(const std::string& text) {
    const auto ids = tok_->encode(text);
    return {ids.begin(), ids.end()};
  }

  static TempDir* dir_;
  static data::Tokenizer* tok_;
};
TempDir* FinetuneFeatures::dir_ = nullptr;
data::Tokenizer* FinetuneFeatures::tok_ = nullptr;

// HF's truncate_sequences(longest_first), one token at a time.
std::pair<int64_t, int64_t> feat_naive_longest_first(int64_t a, int64_t b, int64_t budget) {
  for (int64_t remove = std::max<int64_t>(0, a + b - budget); remove > 0; --remove) {
    if (a > b) {
      --a;
    } else {
      --b;
    }
  }
  return {a, b};
}

TEST(FinetuneFeaturesPairs, LongestFirstMatchesNaiveReference) {
  for (int64_t a = 0; a <= 14; ++a) {
    for (int64_t b = 0; b <= 14; ++b) {
      for (int64_t budget = 0; budget <= 30; ++budget) {
        EXPECT_EQ(longest_first_lengths(a, b, budget), feat_naive_longest_first(a, b, budget))
            << a << " " << b << " " << budget;
      }
    }
  }
  EXPECT_EQ(longest_first_lengths(10, 3, 9), std::make_pair(int64_t{6}, int64_t{3}));
  EXPECT_EQ(longest_first_lengths(5, 5, 7), std::make_pair(int64_t{4}, int64_t{3}));  // B first
}

TEST_F(FinetuneFeatures, PairsAreXlmrEncodedAndTruncatedLongestFirst) {
  const std::vector<std::string> labels = {"contradiction", "entailment", "neutral"};
  const auto a_words = feat_random_words(30, 7), b_words = feat_random_words(9, 8);
  std::vector<PairExample> examples = {
      {feat_join(a_words, 0, a_words.size()),
       feat_join(b_words, 0, b_words.size()),
       "neutral",
       {"dev-de.tsv", 2}},
      {"Haus über dem Fluss", "das Wasser", "", {"test-de.tsv", 3}}};
  const auto a = encode(examples[0].text_a), b = encode(examples[0].text_b);
  ASSERT_GT(a.size(), b.size() + 5);
  const auto& sp = tok_->special_ids();
  for (const int64_t max_len : {4, 5, 12, 20, 40, 128}) {
    const auto features = featurize_pairs(examples, labels, *tok_, max_len);
    ASSERT_EQ(features.size(), 2u);
    EXPECT_EQ(features[0].label, 2);
    EXPECT_EQ(features[1].label, -1);
    EXPECT_EQ(features[1].example, 1);
    const auto [keep_a, keep_b] = feat_naive_longest_first(
        static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size()), max_len - 4);
    std::vector<int64_t> want = {sp.bos};
    want.insert(want.end(), a.begin(), a.begin() + keep_a);
    want.insert(want.end(), {sp.eos, sp.eos});
    want.insert(want.end(), b.begin(), b.begin() + keep_b);
    want.push_back(sp.eos);
    EXPECT_EQ(features[0].input_ids, want) << max_len;
    EXPECT_LE(static_cast<int64_t>(features[0].input_ids.size()), max_len);
  }
  examples[0].label = "neutre";
  EXPECT_TRUE(contains_all(error_message([&] { featurize_pairs(examples, labels, *tok_); }),
                           {"dev-de.tsv:2: label 'neutre' is not in the label set: contradiction "
                            "entailment neutral"}));
}

// Fields longer than 64 bytes per token of max_len are cut before tokenization (a 100 MB line took
// 24 GB): the features stay those of the whole text, and the log counts the cut fields.
TEST_F(FinetuneFeatures, LongFieldsAreCutBeforeTokenizationWithoutChangingFeatures) {
  const auto words = feat_random_words(2000, 11);
  std::string euros;
  for (int i = 0; i < 400; ++i) euros += "\xE2\x82\xAC";  // 1200 bytes; 1024 falls inside a '€'
  const std::vector<PairExample> examples = {
      {feat_join(words, 0, words.size()), "das Wasser", "1", {"train-en.tsv", 4}},
      {"kurz", euros, "0", {"train-en.tsv", 5}},
      {"kurz", "klein", "0", {"train-en.tsv", 6}}};
  ASSERT_GT(examples[0].text_a.size(), 16u * 64u);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  const auto features = featurize_pairs(examples, {"0", "1"}, *tok_, 16);
  spdlog::default_logger()->sinks().pop_back();
  const auto& sp = tok_->special_ids();
  for (size_t e = 0; e < examples.size(); ++e) {
    const auto a = encode(examples[e].text_a), b = encode(examples[e].text_b);
    const auto [keep_a, keep_b] = feat_naive_longest_first(static_cast<int64_t>(a.size()),
                                                           static_cast<int64_t>(b.size()), 12);
    std::vector<int64_t> want = {sp.bos};
    want.insert(want.end(), a.begin(), a.begin() + keep_a);
    want.insert(want.end(), {sp.eos, sp.eos});
    want.insert(want.end(), b.begin(), b.begin() + keep_b);
    want.push_back(sp.eos);
    EXPECT_EQ(features[e].input_ids, want) << e;
  }
  EXPECT_TRUE(contains_all(log.str(), {"train-en.tsv: 2 text field(s) longer than 1024 bytes (64 "
                                       "bytes per token of max_len 16)",
                                       "the first at train-en.tsv:4"}));
  // A tagging word cut to the bound still has more pieces than a chunk: one <unk>, as uncut.
  const TaggedSentence sentence{{"Haus", std::string(5000, 'x')}, {"NOUN", "X"}, {"t.tsv", 9}};
  TaggingOptions options;
  options.max_len = 16;
  log.str("");
  spdlog::default_logger()->sinks().push_back(sink);
  const auto tagged = featurize_tagging({sentence}, {"O", "NOUN", "X"}, *tok_, options);
  spdlog::default_logger()->sinks().pop_back();
  ASSERT_EQ(tagged.size(), 1u);
  EXPECT_EQ(tagged[0].input_ids[tagged[0].input_ids.size() - 3], sp.unk);
  EXPECT_TRUE(contains_all(log.str(), {"t.tsv: 1 text field(s)", "the first at t.tsv:9"}));
}

TEST_F(FinetuneFeatures, TaggingLabelsTheFirstSubTokenOfEachWord) {
  // Hand-checked pieces: "城市" starts with a bare ▁ (the label sits on it, as in XTREME), U+200B
  // has no pieces at all (-> <unk>), "grüner" is three pieces. "." is a bare ▁ and "." with
  // SentencePiece 0.1 and 0.2.0, one "▁." with 0.2.2: taken from the tokenizer.
  ASSERT_EQ(encode("城市"), (std::vector<int64_t>{id("▁"), id("城"), id("市")}));
  ASSERT_TRUE(encode("\u200b").empty());
  const std::vector<std::string> labels = {"ADJ", "NOUN", "PUNCT", "X"};
  const std::vector<TaggedSentence> sentences = {
      {{"Haus", "城市", "\u200b", "grüner", "."}, {"NOUN", "NOUN", "X", "ADJ", "PUNCT"}, {"t", 1}},
      {{"Wasser", "Licht"}, {}, {"t", 8}}};
  const auto features = featurize_tagging(sentences, labels, *tok_);
  ASSERT_EQ(features.size(), 2u);
  const auto& sp = tok_->special_ids();
  const int64_t I = kIgnoreLabel;
  std::vector<int64_t> ids = {sp.bos, id("▁Haus"), id("▁"), id("城"), id("市"),
                              sp.unk, id("▁grün"), id("e"), id("r")};
  std::vector<int64_t> want_labels = {I, 1, 1, I, I, 3, 0, I, I};
  std::vector<int64_t> want_words = {-1, 0, 1, -1, -1, 2, 3, -1, -1};
  const auto dot = encode(".");
  ASSERT_FALSE(dot.empty());
  for (size_t i = 0; i < dot.size(); ++i) {
    ids.push_back(dot[i]);
    want_labels.push_back(i == 0 ? 2 : I);
    want_words.push_back(i == 0 ? 4 : -1);
  }
  ids.insert(ids.end(), {sp.eos, sp.eos});
  want_labels.insert(want_labels.end(), {I, I});
  want_words.insert(want_words.end(), {-1, -1});
  EXPECT_EQ(features[0].input_ids, ids);
  EXPECT_EQ(features[0].labels, want_labels);
  EXPECT_EQ(features[0].word_index, want_words);
  EXPECT_EQ(features[0].sentence, 0);
  EXPECT_EQ(features[0].first_word, 0);
  // Untagged (test) sentences: no labels, predictions are still read at word_index.
  EXPECT_EQ(features[1].labels, (std::vector<int64_t>(5, I)));
  EXPECT_EQ(features[1].word_index, (std::vector<int64_t>{-1, 0, 1, -1, -1}));
  // Single </s> on request.
  const auto single = featurize_tagging(sentences, labels, *tok_, {128, false});
  EXPECT_EQ(single[1].input_ids,
            (std::vector<int64_t>{sp.bos, id("▁Wasser"), id("▁Licht"), sp.eos}));

  auto bad = sentences;
  bad[1].tags = {"NOUN", "VERB"};
  EXPECT_TRUE(contains_all(error_message([&] { featurize_tagging(bad, labels, *tok_); }),
                           {"t:8: label 'VERB' is not in the label set: ADJ NOUN PUNCT X"}));
  bad[1].tags = {"NOUN"};
  EXPECT_TRUE(contains_all(error_message([&] { featurize_tagging(bad, labels, *tok_); }),
                           {"t:8: a sentence of 2 words has 1 tags"}));
}

TEST_F(FinetuneFeatures, TaggingSplitsAtWordBoundariesAndStitchesBack) {
  const std::vector<std::string> labels = {"A", "B", "C", "D", "E"};
  std::vector<TaggedSentence> sentences;
  for (unsigned s = 0; s < 4; ++s) {
    TaggedSentence sentence;
    sentence.words = feat_random_words(s == 0 ? 150 : 3 + 17 * static_cast<int>(s), 100 + s);
    for (size_t w = 0; w < sentence.words.size(); ++w)
      sentence.tags.push_back(labels[(w * 7 + s) % 5]);
    sentence.source = {"train-en.tsv", 1 + s};
    sentences.push_back(sentence);
  }
  sentences[1].words[2] = "grüner";  // 3 pieces: <unk> when a chunk holds fewer
  for (const bool double_eos : {true, false}) {
    for (const int64_t max_len : {5, 6, 8, 13, 32, 128}) {
      const int64_t limit = max_len - (double_eos ? 3 : 2);
      const auto features = featurize_tagging(sentences, labels, *tok_, {max_len, double_eos});
      std::vector<std::vector<int64_t>> predictions;
      std::vector<int64_t> next_word(sentences.size(), 0);
      for (size_t f = 0; f < features.size(); ++f) {
        const TaggingFeature& feature = features[f];
        const auto& words = sentences[static_cast<size_t>(feature.sentence)].words;
        // Every chunk fits, nothing is dropped, and the chunks follow each other.
        EXPECT_LE(static_cast<int64_t>(feature.input_ids.size()), max_len);
        EXPECT_EQ(feature.first_word, next_word[static_cast<size_t>(feature.sentence)]);
        int64_t count = 0;
        for (size_t t = 0; t < feature.word_index.size(); ++t) {
          const int64_t w = feature.word_index[t];
          if (w < 0) continue;
          EXPECT_EQ(w, next_word[static_cast<size_t>(feature.sentence)]++);
          auto pieces = encode(words[static_cast<size_t>(w)]);
          if (static_cast<int64_t>(pieces.size()) > limit) pieces = {tok_->special_ids().unk};
          EXPECT_TRUE(std::equal(pieces.begin(), pieces.end(), feature.input_ids.begin() + t)) << w;
          count += static_cast<int64_t>(pieces.size());
        }
        EXPECT_EQ(count + 1 + (double_eos ? 2 : 1), static_cast<int64_t>(feature.input_ids.size()));
        // Greedy: the next chunk's first word would not have fitted.
        if (f + 1 < features.size() && features[f + 1].sentence == feature.sentence) {
          const auto& first = words[static_cast<size_t>(features[f + 1].first_word)];
          const auto next = std::min<int64_t>(static_cast<int64_t>(encode(first).size()), limit);
          EXPECT_GT(count + std::max<int64_t>(next, 1), limit);
        }
        // The model predicts the gold label at first sub-tokens and noise elsewhere.
        std::vector<int64_t> row(feature.input_ids.size() + 3, 4);
        for (size_t t = 0; t < feature.labels.size(); ++t) {
          if (feature.labels[t] != kIgnoreLabel) row[t] = feature.labels[t];
        }
        predictions.push_back(row);
      }
      const auto stitched = stitch_tags(features, predictions, sentences);
      ASSERT_EQ(stitched.size(), sentences.size());
      for (size_t s = 0; s < sentences.size(); ++s) {
        EXPECT_EQ(next_word[s], static_cast<int64_t>(sentences[s].words.size()));
        std::vector<int64_t> gold;
        for (const auto& tag : sentences[s].tags) {
          gold.push_back(std::find(labels.begin(), labels.end(), tag) - labels.begin());
        }
        EXPECT_EQ(stitched[s], gold) << max_len << " " << s;
      }
      if (max_len == 8) {
        EXPECT_GT(features.size(), 20u);
      }
      if (max_len == 128) {
        EXPECT_EQ(features.size(), 5u);  // the 150-word sentence needs two chunks
      }
      if (max_len == 5 && double_eos) {
        EXPECT_EQ(features[0].input_ids.size(), 5u);
        auto missing = features;
        missing.erase(missing.begin() + 1);
        predictions.erase(predictions.begin() + 1);
        EXPECT_TRUE(
            contains_all(error_message([&] { stitch_tags(missing, predictions, sentences); }),
                         {"stitch_tags: train-en.tsv:1: word", "has no prediction"}));
      }
    }
  }
}

TEST(FinetuneFeaturesQa, ContextWordsSplitOnRunSquadWhitespaceOnly) {
  // U+202F separates, U+00A0 and U+3000 do not; offsets are bytes.
  const std::string context = " ab\u202fcd\u00a0e \t\nдом\u3000x";
  std::vector<int64_t> byte_to_word;
  const auto words = split_context_words(context, &byte_to_word);
  EXPECT_EQ(words, (std::vector<std::string>{"ab", "cd\u00a0e", "дом\u3000x"}));
  ASSERT_EQ(byte_to_word.size(), context.size());
  EXPECT_EQ(byte_to_word[0], -1);
  EXPECT_EQ(byte_to_word[1], 0);
  EXPECT_EQ(byte_to_word[3], 0);  // the first byte of U+202F: the word before it
  EXPECT_EQ(byte_to_word[6], 1);
  EXPECT_EQ(byte_to_word[context.find("дом") + 1], 2);
  EXPECT_EQ(byte_to_word.back(), 2);
}

TEST_F(FinetuneFeatures, QaWindowsAndAnswersRoundTrip) {
  const QaOptions options{40, 8, 6};
  std::vector<QaExample> examples;
  std::vector<std::string> answers;
  for (unsigned e = 0; e < 12; ++e) {
    const auto words = feat_random_words(60 + 5 * static_cast<int>(e), 300 + e);
    QaExample example;
    example.id = "q" + std::to_string(e);
    example.question = feat_join(feat_random_words(4 + static_cast<int>(e % 5), 900 + e), 0,
                                 4 + e % 5);  // up to 8 words: sometimes truncated to 6 pieces
    example.context = "  " + feat_join(words, 0, words.size()) + " \n";
    // The answer: one to three whole words from somewhere in the context (XTREME's answers are
    // word-granular), or a non-CJK word without its period (trimmed by get_final_text).
    const size_t first = (e * 13) % (words.size() - 3), count = 1 + e % 3;
    std::string answer = feat_join(words, first, first + count);
    if (count == 1 && answer.back() == '.' && static_cast<unsigned char>(answer[0]) < 0xe0) {
      answer.pop_back();
    }
    std::string before = "  " + feat_join(words, 0, first) + (first > 0 ? " " : "");
    example.answers = {{answer, static_cast<int64_t>(before.size())}};
    ASSERT_EQ(example.context.compare(before.size(), answer.size(), answer), 0);
    examples.push_back(example);
    answers.push_back(answer);
  }
  // Skipped and counted: an answer that is not in its words, one past the context.
  examples.push_back({"bad1", "Wasser", "das Haus am Fluss", {{"Brücke", 4}}, {"x.json", 0}});
  examples.push_back({"bad2", "Wasser", "das Haus", {{"Haus", 50}}, {"x.json", 0}});

  const auto featurized = featurize_qa(examples, *tok_, options, /*training=*/true);
  EXPECT_EQ(featurized.skipped, (std::vector<int64_t>{12, 13}));
  const auto& sp = tok_->special_ids();
  for (size_t e = 0; e < 12; ++e) {
    const auto words = split_context_words(examples[e].context);
    std::vector<int64_t> doc;
    for (const auto& w : words) {
      const auto ids = encode(w);
      doc.insert(doc.end(), ids.begin(), ids.end());
    }
    auto query = encode(examples[e].question);
    if (query.size() > 6) query.resize(6);
    const auto offset = static_cast<int64_t>(query.size()) + 3;
    std::vector<int> windows_of_token(doc.size(), 0), max_context_of_token(doc.size(), 0);
    int64_t expected_offset = 0, windows_with_answer = 0;
    std::vector<int64_t> window_ends;
    for (const QaFeature& f : featurized.features) {
      if (f.example != static_cast<int64_t>(e)) continue;
      EXPECT_EQ(f.context_offset, expected_offset);
      expected_offset += options.doc_stride;
      EXPECT_LE(static_cast<int64_t>(f.input_ids.size()), options.max_len);
      const auto length = static_cast<int64_t>(f.input_ids.size()) - offset - 1;
      std::vector<int64_t> want;
      want.reserve(f.input_ids.size());  // (GCC 16 misreads the growth from one element)
      want.push_back(sp.bos);
      want.insert(want.end(), query.begin(), query.end());
      want.insert(want.end(), {sp.eos, sp.eos});
      want.insert(want.end(), doc.begin() + f.context_offset,
                  doc.begin() + f.context_offset + length);
      want.push_back(sp.eos);
      EXPECT_EQ(f.input_ids, want);
      window_ends.push_back(f.context_offset + length);
      for (int64_t j = 0; j < length; ++j) {
        ++windows_of_token[static_cast<size_t>(f.context_offset + j)];
        max_context_of_token[static_cast<size_t>(f.context_offset + j)] +=
            f.max_context[static_cast<size_t>(offset + j)];
        EXPECT_GE(f.token_to_word[static_cast<size_t>(offset + j)], 0);
      }
      for (int64_t t = 0; t < offset; ++t) EXPECT_EQ(f.token_to_word[static_cast<size_t>(t)], -1);
      EXPECT_EQ(f.token_to_word.back(), -1);
      if (f.start == 0) {
        EXPECT_EQ(f.end, 0);
        continue;
      }
      // The training targets map back to the answer through token_to_word and get_final_text:
      // decode a window whose logits peak there.
      ++windows_with_answer;
      EXPECT_GE(f.start, offset);
      EXPECT_LE(f.start, f.end);
      QaFeatures one{{f}, {}};
      one.features[0].max_context.assign(f.input_ids.size(), 1);
      one.features[0].example = 0;
      QaLogits logits{std::vector<float>(f.input_ids.size(), 0.0f),
                      std::vector<float>(f.input_ids.size(), 0.0f)};
      logits.start[static_cast<size_t>(f.start)] = 10;
      logits.end[static_cast<size_t>(f.end)] = 10;
      const auto decoded = decode_qa({examples[e]}, one, {logits}, *tok_);
      EXPECT_EQ(decoded.text.at(examples[e].id), answers[e]) << examples[e].context;
    }
    EXPECT_GE(windows_with_answer, 1) << e;
    for (size_t t = 0; t < doc.size(); ++t) {
      EXPECT_GE(windows_of_token[t], 1) << "token " << t << " of example " << e;
      EXPECT_EQ(max_context_of_token[t], 1) << "token " << t << " of example " << e;
    }
    // Windows until one reaches the context's end, no more.
    ASSERT_FALSE(window_ends.empty());
    EXPECT_EQ(window_ends.back(), static_cast<int64_t>(doc.size()));
    for (size_t k = 0; k + 1 < window_ends.size(); ++k) {
      EXPECT_LT(window_ends[k], static_cast<int64_t>(doc.size()));
    }
  }

  // Evaluation keeps every example and has no targets.
  const auto eval = featurize_qa(examples, *tok_, options, /*training=*/false);
  EXPECT_TRUE(eval.skipped.empty());
  for (const auto& f : eval.features) EXPECT_EQ(f.start + f.end, 0);

  // Questions on the same paragraph reuse its sub-tokens: same features as on their own.
  QaExample second = examples[0];
  second.question = "Licht und Wasser";
  const auto shared = featurize_qa({examples[0], second}, *tok_, options, true);
  const auto alone = featurize_qa({second}, *tok_, options, true);
  ASSERT_EQ(shared.features.size(), 2 * alone.features.size());
  for (size_t k = 0; k < alone.features.size(); ++k) {
    const QaFeature& a = alone.features[k];
    const QaFeature& b = shared.features[alone.features.size() + k];
    EXPECT_EQ(b.example, 1);
    EXPECT_EQ(a.input_ids, b.input_ids);
    EXPECT_EQ(std::make_pair(a.start, a.end), std::make_pair(b.start, b.end));
    EXPECT_EQ(a.token_to_word, b.token_to_word);
    EXPECT_EQ(a.max_context, b.max_context);
  }

  const QaOptions tight{16, 8, 64};
  EXPECT_TRUE(contains_all(error_message([&] { featurize_qa(examples, *tok_, tight, false); }),
                           {"question 'q0' leaves", "fewer than doc_stride 8"}));
}

TEST(FinetuneFeaturesQa, GetFinalTextTrimsAtPunctuationOrFallsBack) {
  EXPECT_EQ(bert_basic_tokenize("Hello, 世界! a\u00a0b\u200bc \u00abHaus\u00bb"),
            (std::vector<std::string>{"Hello", ",", "世", "界", "!", "a", "bc", "\u00ab", "Haus",
                                      "\u00bb"}));
  // BERT's own example: the prediction drops the possessive.
  EXPECT_EQ(get_final_text("Steve Smith", "Steve Smith's"), "Steve Smith");
  EXPECT_EQ(get_final_text("Haus", "Haus."), "Haus");
  EXPECT_EQ(get_final_text("Haus", "\u00abHaus\u00bb,"), "Haus");
  EXPECT_EQ(get_final_text("1990", "(1990)"), "1990");
  // CJK ideographs are tokens of their own: single characters align, runs do not (the pieces'
  // text has no spaces between them), so a run falls back to the whole words.
  EXPECT_EQ(get_final_text("水", "大桥水河"), "水");
  EXPECT_EQ(get_final_text("水 河", "大桥水河"), "水河");
  EXPECT_EQ(get_final_text("水河", "大桥水河"), "大桥水河");
  // Fallbacks: not found (NFKC-normalized pieces), lengths differ after cleaning (a dropped
  // format character), empty prediction.
  EXPECT_EQ(get_final_text("Haus", "\uff28\uff41\uff55\uff53."), "\uff28\uff41\uff55\uff53.");
  EXPECT_EQ(get_final_text("Haus", "Haus\u200b."), "Haus\u200b.");
  EXPECT_EQ(get_final_text("", "Haus."), "Haus.");
  EXPECT_EQ(get_final_text("Hausboot", "Haus"), "Haus");
}

TEST_F(FinetuneFeatures, QaDecodingFollowsComputePredictionsLogits) {
  // 50 words of one piece each but "Licht." (▁Licht .): 51 context sub-tokens, word w at
  // sub-token w up to 20 and w + 1 after. Windows of 24 context sub-tokens every 12.
  ASSERT_EQ(encode("Fluss").size(), 1u);
  ASSERT_EQ(encode("Licht.").size(), 2u);
  std::vector<std::string> words;
  for (int i = 0; i < 50; ++i) words.push_back(i % 2 ? "Wasser" : "Haus");
  words[20] = "Licht.";
  words[40] = "Brücke";
  QaExample example{"q", "Fluss", feat_join(words, 0, words.size()), {}, {"d.json", 0}};
  const QaExample empty_context{"e", "Fluss", " ", {}, {"d.json", 0}};
  const QaOptions options{29, 12, 64};
  const auto featurized = featurize_qa({example, empty_context}, *tok_, options, false);
  ASSERT_EQ(featurized.features.size(), 4u);  // offsets 0, 12, 24, 36; none for " "
  const int64_t q = 4;                        // <s> ▁Fluss </s></s>
  ASSERT_EQ(featurized.features[0].token_to_word[q], 0);
  ASSERT_EQ(featurized.features[3].context_offset, 36);
  // The position in window k of context sub-token c.
  const auto at = [&](size_t k, int64_t c) {
    return static_cast<size_t>(q + c - featurized.features[k].context_offset);
  };
  const auto decode = [&](const std::function<void(std::vector<QaLogits>&)>& set,
                          const QaDecodeOptions& decode_options = {}) {
    std::vector<QaLogits> logits;
    for (const auto& f : featurized.features) {
      logits.push_back({std::vector<float>(f.input_ids.size(), -50.0f),
                        std::vector<float>(f.input_ids.size(), -50.0f)});
    }
    set(logits);
    return decode_qa({example, empty_context}, featurized, logits, *tok_, decode_options);
  };

  // Cross-window ranking: window 2's best pair (word 40) beats window 1's (words 27-28); the
  // example without features says "empty".
  auto out = decode([&](std::vector<QaLogits>& l) {
    l[1].start[at(1, 28)] = 3, l[1].end[at(1, 29)] = 3;
    l[2].start[at(2, 41)] = 4, l[2].end[at(2, 41)] = 4;
  });
  EXPECT_EQ(out.text.at("q"), "Brücke");
  EXPECT_EQ(out.nbest.at("q")[1].text, "Wasser Haus");
  EXPECT_EQ(out.text.at("e"), "empty");
  double total = 0;
  for (const auto& c : out.nbest.at("q")) total += c.probability;
  EXPECT_NEAR(total, 1.0, 1e-9);
  EXPECT_EQ(out.nbest.at("q").size(), 20u);
  for (size_t i = 1; i < out.nbest.at("q").size(); ++i) {
    const auto& a = out.nbest.at("q")[i - 1];
    const auto& b = out.nbest.at("q")[i];
    EXPECT_GE(a.start_logit + a.end_logit, b.start_logit + b.end_logit);
    EXPECT_GE(a.probability, b.probability);
    EXPECT_NE(a.text, b.text);  // repeated texts are dropped
  }

  // end < start is rejected; the next best pair wins, and get_final_text trims "Licht.".
  out = decode([&](std::vector<QaLogits>& l) {
    l[0].start[at(0, 10)] = 9, l[0].end[at(0, 5)] = 9;
    l[1].start[at(1, 20)] = 2, l[1].end[at(1, 20)] = 2;
  });
  EXPECT_EQ(out.text.at("q"), "Licht");

  // A start that is not max-context is rejected: sub-token 22 has more context in window 1.
  ASSERT_FALSE(featurized.features[0].max_context[at(0, 22)]);
  ASSERT_TRUE(featurized.features[1].max_context[at(1, 22)]);
  out = decode(
      [&](std::vector<QaLogits>& l) {
        l[0].start[at(0, 22)] = 9, l[0].end[at(0, 22)] = 9;
        l[0].start[at(0, 2)] = 1, l[0].end[at(0, 2)] = 1;
      },
      {20, 3});
  EXPECT_EQ(out.text.at("q"), "Haus");
  EXPECT_EQ(out.nbest.at("q")[0].start_logit, 1);

  // Longer than max_answer_len is rejected (5 sub-tokens here; 30 by default, below).
  out = decode(
      [&](std::vector<QaLogits>& l) {
        l[0].start[at(0, 1)] = 9, l[0].end[at(0, 6)] = 9;
        l[0].end[at(0, 5)] = 8;
      },
      {20, 5});
  EXPECT_EQ(out.text.at("q"), "Wasser Haus Wasser Haus Wasser");
  EXPECT_EQ(out.nbest.at("q")[0].end_logit, 8);

  // "empty" when every top start lies outside the context.
  out = decode(
      [&](std::vector<QaLogits>& l) {
        for (auto& row : l) row.start[0] = 9, row.start[1] = 8, row.start[2] = 7;
      },
      {3, 30});
  EXPECT_EQ(out.text.at("q"), "empty");
  ASSERT_EQ(out.nbest.at("q").size(), 1u);
  EXPECT_EQ(out.nbest.at("q")[0].probability, 1.0);

  std::vector<QaLogits> short_logits(4);
  EXPECT_TRUE(
      contains_all(error_message([&] { decode_qa({example}, featurized, short_logits, *tok_); }),
                   {"decode_qa: feature 0 has 29 tokens but 0 start and 0 end logits"}));
}

TEST_F(FinetuneFeatures, QaDefaultMaxAnswerLengthIs30) {
  std::vector<std::string> words(40, "Haus");
  QaExample example{"q", "Fluss", feat_join(words, 0, words.size()), {}, {"d.json", 0}};
  const auto featurized = featurize_qa({example}, *tok_, QaOptions{}, false);
  ASSERT_EQ(featurized.features.size(), 1u);
  const auto& f = featurized.features[0];
  QaLogits logits{std::vector<float>(f.input_ids.size(), 0.0f),
                  std::vector<float>(f.input_ids.size(), 0.0f)};
  logits.start[4] = 9;
  logits.end[4 + 30] = 9;  // 31 sub-tokens
  logits.end[4 + 29] = 8;  // 30 sub-tokens
  auto out = decode_qa({example}, featurized, {logits}, *tok_);
  EXPECT_EQ(out.nbest.at("q")[0].end_logit, 8);
  EXPECT_EQ(out.text.at("q"), feat_join(words, 0, 30));
}

TEST_F(FinetuneFeatures, CollatePadsToTheLongestFeature) {
  const int64_t pad = tok_->special_ids().pad;
  std::vector<ClassificationFeature> pairs = {{{0, 5, 2}, 1, 0}, {{0, 5, 6, 7, 2}, 2, 1}};
  auto batch = collate(pairs, {1, 0, 1}, pad);
  EXPECT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(batch.input_ids[1].equal(torch::tensor(std::vector<int64_t>{0, 5, 2, pad, pad})));
  EXPECT_TRUE(batch.padding[1].equal(torch::tensor({false, false, false, true, true})));
  EXPECT_EQ(batch.padding.sum().item<int64_t>(), 2);
  EXPECT_TRUE(batch.positions[2].equal(torch::arange(5, torch::kInt64)));
  EXPECT_TRUE(batch.labels.equal(torch::tensor(std::vector<int64_t>{2, 1, 2})));

  std::vector<TaggingFeature> tags = {{{0, 8, 2, 2}, {-100, 3, -100, -100}, {-1, 0, -1, -1}, 0, 0},
                                      {{0, 8, 9, 2, 2}, {-100, 1, 4, -100, -100}, {}, 1, 0}};
  batch = collate(tags, {0, 1}, pad);
  EXPECT_EQ(batch.labels.sizes(), (std::vector<int64_t>{2, 5}));
  EXPECT_TRUE(
      batch.labels[0].equal(torch::tensor(std::vector<int64_t>{-100, 3, -100, -100, -100})));
  EXPECT_EQ(batch.input_ids[0][4].item<int64_t>(), pad);

  std::vector<QaFeature> qa(2);
  qa[0].input_ids = {0, 4, 2, 2, 9, 2};
  qa[0].start = 4, qa[0].end = 4;
  qa[1].input_ids = {0, 4, 2};
  batch = collate(qa, {0, 1}, pad);
  EXPECT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{2, 6}));
  EXPECT_TRUE(batch.labels.equal(torch::tensor(std::vector<int64_t>{4, 4, 0, 0}).view({2, 2})));
  EXPECT_EQ(batch.padding.dtype(), torch::kBool);
  EXPECT_EQ(batch.positions.dtype(), torch::kInt64);

  EXPECT_TRUE(contains_all(error_message([&] { collate(qa, {2}, pad); }),
                           {"feature index 2 is out of range (there are 2 features)"}));
}

}  // namespace
}  // namespace xlme::finetune
