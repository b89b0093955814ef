// finetune/metrics: each official XTREME metric against hand-computed cases, including the traps
// of docs/finetuning.md#xtremes-metric-quirks (POS chunk merging, lenient IOB, MLQA's Arabic
// articles and Chinese segmentation, unanswered questions, BUCC's threshold midpoint).
#include "xlme/finetune/metrics.h"

#include "xlme/eval/retrieval.h"

#include "test_util.h"

#include <torch/torch.h>

namespace xlme::finetune {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using Sentences = std::vector<std::vector<std::string>>;

TEST(Accuracy, CountsExactMatchesAndRejectsSizeMismatch) {
  EXPECT_DOUBLE_EQ(accuracy({"a", "b", "c", "d"}, {"a", "x", "c", "d"}), 75.0);
  EXPECT_TRUE(contains_all(error_message([] {
                             accuracy({"a"}, {"a", "b"});
                           }),
                           {"1 gold labels", "2 predictions"}));
}

TEST(Seqeval, PosTagsAreTheirOwnTypesSoRunsMergeAndSconjSymIntjFollowTheirFirstLetter) {
  const auto chunks = seqeval_chunks({{"NOUN", "INTJ", "INTJ", "SYM", "SYM", "O", "ADJ", "ADJ"}});
  const std::vector<Chunk> expected = {
      {"NOUN", 0, 0}, {"INTJ", 1, 2}, {"SYM", 3, 3}, {"SYM", 4, 4}, {"ADJ", 6, 7}};
  EXPECT_EQ(chunks, expected);
  // The 'O' appended after each sentence separates runs across sentences.
  const std::vector<Chunk> two = {{"NOUN", 0, 0}, {"NOUN", 2, 2}};
  EXPECT_EQ(seqeval_chunks({{"NOUN"}, {"NOUN"}}), two);
}

TEST(Seqeval, PosF1DiffersFromTokenAccuracy) {
  // gold chunks (NOUN 0-1) (VERB 2) (SCONJ 3) (SCONJ 4); predicted (NOUN 0) (VERB 1-2) and the
  // two SCONJ: 2 of 4 correct each way, while 4 of 5 tokens are right.
  const auto s = seqeval_scores({{"NOUN", "NOUN", "VERB", "SCONJ", "SCONJ"}},
                                {{"NOUN", "VERB", "VERB", "SCONJ", "SCONJ"}});
  EXPECT_EQ(s.gold_chunks, 4);
  EXPECT_EQ(s.predicted_chunks, 4);
  EXPECT_EQ(s.correct_chunks, 2);
  EXPECT_DOUBLE_EQ(s.precision, 50.0);
  EXPECT_DOUBLE_EQ(s.recall, 50.0);
  EXPECT_DOUBLE_EQ(s.f1, 50.0);
  EXPECT_DOUBLE_EQ(s.accuracy, 80.0);
}

TEST(Seqeval, LenientIobStartsAnEntityAtIAfterOOrAnotherType) {
  // I-PER I-PER is one PER entity, I-LOC after O a LOC entity: the same as the IOB2 gold.
  EXPECT_DOUBLE_EQ(
      seqeval_scores({{"B-PER", "I-PER", "O", "B-LOC"}}, {{"I-PER", "I-PER", "O", "I-LOC"}}).f1,
      100.0);
  // B-PER I-ORG: the type change splits into (PER 0) and (ORG 1); neither matches (PER 0-1).
  const std::vector<Chunk> split = {{"PER", 0, 0}, {"ORG", 1, 1}};
  EXPECT_EQ(seqeval_chunks({{"B-PER", "I-ORG"}}), split);
  // Over a corpus: gold (PER 0-1) (LOC 3) (ORG 5); predicted (PER 0-1) (ORG 3) (ORG 5).
  const auto s = seqeval_scores({{"B-PER", "I-PER", "O", "B-LOC"}, {"B-ORG"}},
                                {{"B-PER", "I-PER", "O", "B-ORG"}, {"I-ORG"}});
  EXPECT_EQ(s.correct_chunks, 2);
  EXPECT_NEAR(s.precision, 200.0 / 3, 1e-9);
  EXPECT_NEAR(s.recall, 200.0 / 3, 1e-9);
  EXPECT_NEAR(s.f1, 200.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(s.accuracy, 60.0);
}

TEST(Seqeval, NothingPredictedScoresZeroAndLengthMismatchNamesTheSentence) {
  EXPECT_DOUBLE_EQ(seqeval_scores({{"B-PER"}}, {{"O"}}).f1, 0.0);
  EXPECT_TRUE(contains_all(error_message([] {
                             seqeval_scores({{"O"}, {"O", "O"}}, {{"O"}, {"O"}});
                           }),
                           {"sentence 1", "2 gold tags", "1 predicted"}));
}

TEST(Squad, NormalizeLowersDropsAsciiPunctuationArticlesAndExtraSpace) {
  EXPECT_EQ(squad_normalize("The Cat's  hat!"), "cats hat");
  EXPECT_EQ(squad_normalize("Anna and an apple"), "anna and apple");  // whole words only
  EXPECT_EQ(squad_normalize("ÉCOLE Ünd"), "école ünd");               // Python's Unicode lower
  EXPECT_EQ(squad_normalize("ΟΔΟΣ ΣΑ"), "οδος σα");                   // final sigma
  EXPECT_EQ(squad_normalize("¿Qué?"), "¿qué");                        // only ASCII punctuation goes
  EXPECT_EQ(squad_normalize("a\u00a0b\u3000c"), "b c");  // Unicode whitespace splits, "a" goes
}

TEST(Squad, ExactMatchAndTokenF1) {
  EXPECT_DOUBLE_EQ(qa_exact_match("The Eiffel tower.", "eiffel Tower"), 1.0);
  EXPECT_DOUBLE_EQ(qa_f1("the cat sat", "a cat sat down"), 0.8);  // p 1, r 2/3
  EXPECT_DOUBLE_EQ(qa_f1("dog", "cat"), 0.0);
  EXPECT_DOUBLE_EQ(qa_f1("cat cat", "cat"), 2.0 / 3);  // multiset overlap: p 1/2, r 1
}

QaExample qa_gold_question(const std::string& id, std::vector<std::string> answers) {
  QaExample ex;
  ex.id = id;
  ex.source = {"gold.json", 0};
  for (auto& a : answers) ex.answers.push_back({std::move(a), 0});
  return ex;
}

TEST(Squad, ScoresTakeTheBestGoldAndCountUnansweredQuestionsAsZero) {
  const std::vector<QaExample> gold = {qa_gold_question("q1", {"Paris", "the city of Paris"}),
                                       qa_gold_question("q2", {"42"}),
                                       qa_gold_question("q3", {"x"})};
  // q1: F1 max(2/3 vs "paris", 0.4 vs "city of paris"), EM 0; q2: 1, 1; q3 unanswered: 0, 0.
  const auto s = qa_scores(gold, {{"q1", "Paris France"}, {"q2", "42"}});
  EXPECT_EQ(s.questions, 3);
  EXPECT_EQ(s.answered, 2);
  EXPECT_NEAR(s.exact_match, 100.0 / 3, 1e-9);
  EXPECT_NEAR(s.f1, 100.0 * (2.0 / 3 + 1) / 3, 1e-9);
}

TEST(Squad, BlankedGoldIsRefused) {
  const std::vector<QaExample> blanked = {qa_gold_question("q1", {""})};
  EXPECT_TRUE(contains_all(error_message([&] {
                             qa_scores(blanked, {{"q1", "x"}});
                           }),
                           {"gold.json", "blanked", "upstream"}));
}

TEST(Mlqa, ArabicArticleIsRemovedEvenInsideWords) {
  EXPECT_EQ(mlqa_normalize("الكتاب", "ar"), "كتاب");
  EXPECT_EQ(mlqa_normalize("بالقلم", "ar"), "ب قلم");
  EXPECT_EQ(squad_normalize("بالقلم"), "بالقلم");
  EXPECT_DOUBLE_EQ(qa_exact_match("القلم", "قلم", "ar"), 1.0);
}

TEST(Mlqa, ChineseMixedSegmentationSplitsHanCharacters) {
  EXPECT_EQ(mlqa_normalize("北京大学 ABC def", "zh"), "北 京 大 学 abc def");
  EXPECT_EQ(mlqa_normalize("北京，大学", "zh"), "北 京 大 学");  // U+FF0C is P*: removed
  EXPECT_NEAR(qa_f1("北京", "北京大学", "zh"), 2.0 / 3, 1e-12);  // p 1, r 1/2
  EXPECT_DOUBLE_EQ(qa_f1("北京", "北京大学"), 0.0);              // SQuAD: one token each
}

TEST(Mlqa, UnicodePunctuationAndPerLanguageArticles) {
  EXPECT_EQ(mlqa_normalize("¿Qué?", "es"), "qué");
  EXPECT_EQ(mlqa_normalize("«El gato» y la casa", "es"), "gato y casa");
  EXPECT_EQ(mlqa_normalize("Der Hund, des Mannes", "de"), "hund mannes");
  EXPECT_EQ(mlqa_normalize("những con mèo", "vi"), "con mèo");
  EXPECT_EQ(mlqa_normalize("a cat", "hi"), "a cat");  // Hindi: no articles
  EXPECT_EQ(mlqa_normalize("A cat $5", "en"), "cat 5");
  EXPECT_TRUE(contains_all(error_message([] { mlqa_normalize("x", "fr"); }),
                           {"'fr'", "en es de ar hi vi zh"}));
  const std::vector<QaExample> gold = {qa_gold_question("q", {"北京大学"})};
  EXPECT_NEAR(qa_scores(gold, {{"q", "北京"}}, "zh").f1, 200.0 / 3, 1e-9);
}

// Expected values computed by the official normalize_answer functions (SQuAD v1.1's, and
// mlqa_evaluation_v1.py's for the rows with a language) under Python 3.11.2 / Unicode 14.0.0:
// Unicode lowercasing (İ, final sigma), \w word boundaries (a combining mark is not a word
// character), P* punctuation of many scripts, Arabic ال, Chinese segmentation.
TEST(QaNormalize, MatchesThePythonScriptsOnTrickyText) {
  struct Case {
    const char *text, *lang, *expected;
  };
  const Case cases[] = {
      {"İstanbul'da ÇAĞ", "", "i̇stanbulda çağ"},
      {"STRASSE Straße", "", "strasse straße"},
      {"ΣΊΣΥΦΟΣ, ὈΔΥΣΣΕΎΣ.", "", "σίσυφος ὀδυσσεύς"},
      {"Ａ Ｂ the\u2003end", "", "ａ ｂ end"},
      {"O'Neil — the «best»", "", "oneil — «best»"},
      {"an_a the1 a-b", "", "ana the1 ab"},
      {"«La» casa, ¡el niño!", "es", "casa niño"},
      {"Él dijo: los años", "es", "él dijo años"},
      {"unas 5 unidades…", "es", "5 unidades"},
      {"Die Brücke des „Kaisers“", "de", "brücke kaisers"},
      {"einer von dem", "de", "von"},
      {"Của những chiếc xe là cái", "vi", "xe"},
      {"những\u0301 con", "vi", "\u0301 con"},
      {"المكتبة الوطنية، في القاهرة.", "ar", "مكتبة وطنية في قاهرة"},
      {"بالإسكندرية والقاهرة", "ar", "ب إسكندرية و قاهرة"},
      {"भारत की राजधानी। नई दिल्ली", "hi", "भारत की राजधानी नई दिल्ली"},
      {"《红楼梦》是曹雪芹写的 Dream of the Red Chamber", "zh",
       "红 楼 梦 是 曹 雪 芹 写 的 dream of the red chamber"},
      {"１９４９年10月1日，中华人民共和国", "zh", "１９４９ 年 10 月 1 日 中 华 人 民 共 和 国"},
      {"『東京』タワー", "zh", "東 京 タワー"},
  };
  for (const auto& c : cases) {
    const std::string lang = c.lang;
    EXPECT_EQ(lang.empty() ? squad_normalize(c.text) : mlqa_normalize(c.text, lang), c.expected)
        << c.text;
  }
}

TEST(Retrieval, AccuracyAgainstIdentityOrGivenGold) {
  EXPECT_DOUBLE_EQ(retrieval_accuracy({0, 2, 1, 3}), 50.0);
  EXPECT_DOUBLE_EQ(retrieval_accuracy({1, 0}, {1, 0}), 100.0);
  const auto q = torch::tensor({1.0f, 0.0f, 0.0f, 1.0f}).view({2, 2});
  const auto k = torch::tensor({0.0f, 2.0f, 3.0f, 0.1f}).view({2, 2});
  const auto found = eval::nearest_neighbours(q, k);
  EXPECT_EQ(std::vector<int64_t>(found.data_ptr<int64_t>(), found.data_ptr<int64_t>() + 2),
            (std::vector<int64_t>{1, 0}));
}

TEST(Bucc, RatioMarginScoresMatchTheHandComputation) {
  // cos: x0·y0 1, x0·y1 0, x1·y0 .6, x1·y1 .8; kNN means (k = 2): x .5 .7, y .8 .4.
  // score(x0, y0) = 1 / ((.5 + .8) / 2); score(x1, y1) = .8 / ((.7 + .4) / 2).
  const auto x = torch::tensor({1.0f, 0.0f, 0.6f, 0.8f}).view({2, 2});
  const auto y = torch::tensor({2.0f, 0.0f, 0.0f, 3.0f}).view({2, 2});  // normalized inside
  const auto mined = margin_mine(x, y, 4);
  ASSERT_EQ(mined.size(), 2u);
  EXPECT_EQ(mined[0].source, 0);
  EXPECT_EQ(mined[0].target, 0);
  EXPECT_NEAR(mined[0].score, 1 / 0.65, 1e-5);
  EXPECT_EQ(mined[1].source, 1);
  EXPECT_EQ(mined[1].target, 1);
  EXPECT_NEAR(mined[1].score, 0.8 / 0.55, 1e-5);
}

TEST(Bucc, CandidatesMapBackByTextDroppingSentencesWithSeveralIds) {
  BuccCorpus corpus;
  corpus.language = "de";
  corpus.source = {{"de-1", "Hallo Welt"}, {"de-2", "Guten Tag"}, {"de-3", "Hallo Welt"}};
  corpus.english = {{"en-1", "Hello world"}, {"en-2", "Good day"}};
  const auto src = torch::tensor({1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f}).view({3, 2});
  const auto en = torch::tensor({1.0f, 0.0f, 0.0f, 1.0f}).view({2, 2});
  const auto c = bucc_candidates(corpus, src, en);
  ASSERT_EQ(c.size(), 1u);  // "Hallo Welt" has two ids: its pair is dropped
  EXPECT_EQ(c[0].source_id, "de-2");
  EXPECT_EQ(c[0].english_id, "en-2");
  EXPECT_NEAR(c[0].score, 2.0, 1e-6);  // cos 1 over mean kNN cos 0.5
}

TEST(Bucc, ThresholdIsTheMidpointAfterTheBestF1Cut) {
  // Sorted: .9 gold, .8 gold, .7, .6 gold, .5; 4 gold pairs. F1 after each cut: .4, .667,
  // .571, .75, .667: the best cut is after .6, so the threshold is (.6 + .5) / 2.
  const std::vector<BuccCandidate> candidates = {{"s3", "e3", 0.7},
                                                 {"s1", "e1", 0.9},
                                                 {"s5", "e5", 0.5},
                                                 {"s2", "e2", 0.8},
                                                 {"s4", "e4", 0.6}};
  const std::vector<std::pair<std::string, std::string>> gold = {
      {"s1", "e1"}, {"s2", "e2"}, {"s4", "e4"}, {"s9", "e9"}};
  const double threshold = bucc_optimize_threshold(candidates, gold);
  EXPECT_NEAR(threshold, 0.55, 1e-12);
  const auto predicted = bucc_extract(candidates, threshold);
  EXPECT_EQ(predicted.size(), 4u);
  const auto s = pair_scores(predicted, gold);
  EXPECT_EQ(s.correct, 3);
  EXPECT_DOUBLE_EQ(s.precision, 75.0);
  EXPECT_DOUBLE_EQ(s.recall, 75.0);
  EXPECT_DOUBLE_EQ(s.f1, 75.0);
  // Best cut after the last candidate: its own score (LASER would index past the end).
  EXPECT_DOUBLE_EQ(
      bucc_optimize_threshold({{"a", "a", 0.9}, {"b", "b", 0.5}}, {{"a", "a"}, {"b", "b"}}), 0.5);
}

TEST(Alignment, ArgmaxIntersectsBothDirections) {
  // Rows pick columns 0, 1, 1; columns pick rows 0, 1, 1: (2, 1) is one-sided.
  const auto sim =
      torch::tensor({0.9, 0.1, 0.0, 0.2, 0.8, 0.7, 0.1, 0.75, 0.3}, torch::kDouble).view({3, 3});
  const std::vector<Link> expected = {{0, 0}, {1, 1}};
  EXPECT_EQ(align_argmax(sim), expected);
}

TEST(Alignment, OptimalTransportSpreadsMassOverTiedTargets) {
  const std::vector<Link> diag = {{0, 0}, {1, 1}, {2, 2}};
  EXPECT_EQ(align_optimal_transport(torch::eye(3)), diag);
  // Source 0 matches targets 0 and 1 equally, source 1 targets 2 and 3: argmax keeps one link
  // each, the transport plan all four.
  const auto sim = torch::tensor({1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0}).view({2, 4});
  EXPECT_EQ(align_argmax(sim), (std::vector<Link>{{0, 0}, {1, 2}}));
  EXPECT_EQ(align_optimal_transport(sim), (std::vector<Link>{{0, 0}, {0, 1}, {1, 2}, {1, 3}}));
}

TEST(Alignment, AerOnAHandExample) {
  // S = {0-0, 1-1}, P = S ∪ {1-2}; A = {0-0, 1-2, 2-2}: |A∩S| 1, |A∩P| 2,
  // AER = 1 - (1 + 2) / (3 + 2) = 0.4; precision 2/3, recall 1/2.
  AlignedPair gold;
  gold.sure = {{0, 0}, {1, 1}};
  gold.possible = {{1, 2}};
  const auto s = alignment_error_rate({gold}, {{{0, 0}, {1, 2}, {2, 2}}});
  EXPECT_NEAR(s.aer, 40.0, 1e-9);
  EXPECT_NEAR(s.precision, 200.0 / 3, 1e-9);
  EXPECT_NEAR(s.recall, 50.0, 1e-9);
  EXPECT_NEAR(alignment_error_rate({gold}, {{{0, 0}, {1, 1}}}).aer, 0.0, 1e-9);
}

}  // namespace
}  // namespace xlme::finetune
