// finetune/xtreme_io: every reader on fixtures in the exact on-disk formats (CRLF TSV with
// doubled quotes, CoNLL with and without tags, raw PAN-X, CoNLL-U, SQuAD JSON with non-ASCII
// contexts, LASER/XTREME Tatoeba, BUCC, Pharaoh), the error messages, and the writers.
#include "xlme/finetune/pair_io.h"
#include "xlme/finetune/qa_io.h"
#include "xlme/finetune/retrieval_io.h"
#include "xlme/finetune/tagging_io.h"
#include "xlme/finetune/xtreme_io.h"

#include "memory_fixtures.h"
#include "test_util.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace xlme::finetune {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// A PAWS-X row as Python's csv.writer (excel dialect, TAB) writes it: CRLF, quotes doubled.
const char* kIoQuotedTsv =
    "\"\"\"Angel Eyes\"\" ist gut\"\tzweiter Satz\t1\r\n"
    "plain a\tplain b\t0\r\n"
    "\"line one\r\nline two\"\tb\t0\r\n";

TEST(Tsv, FaithfulKeepsQuotesLiterallyAsXtremesReader) {
  TempDir dir;
  write_file(dir / "t.tsv", kIoQuotedTsv);
  const auto rows = read_tsv(dir / "t.tsv", TsvQuoting::kFaithful);
  ASSERT_EQ(rows.size(), 4u);  // the quoted newline splits the last record, as csv QUOTE_NONE
  EXPECT_EQ(rows[0].fields,
            (std::vector<std::string>{"\"\"\"Angel Eyes\"\" ist gut\"", "zweiter Satz", "1"}));
  EXPECT_EQ(rows[1].fields[2], "0");  // no '\r' left
  EXPECT_EQ(rows[2].fields, (std::vector<std::string>{"\"line one"}));
  EXPECT_EQ(rows[3].line, 4);
}

TEST(Tsv, UnquotedUndoesExcelQuoting) {
  TempDir dir;
  write_file(dir / "t.tsv", kIoQuotedTsv);
  const auto rows = read_tsv(dir / "t.tsv", TsvQuoting::kUnquoted);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].fields[0], "\"Angel Eyes\" ist gut");
  EXPECT_EQ(rows[2].fields, (std::vector<std::string>{"line one\nline two", "b", "0"}));
  EXPECT_EQ(rows[2].line, 3);
  write_file(dir / "bad.tsv", "a\tb\r\n\"never closed\tx\r\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_tsv(dir / "bad.tsv", TsvQuoting::kUnquoted); }),
                           {dir / "bad.tsv:2", "never closed", "faithful"}));
  EXPECT_EQ(parse_tsv_quoting("unquoted"), TsvQuoting::kUnquoted);
  EXPECT_TRUE(contains_all(error_message([] { parse_tsv_quoting("csv"); }),
                           {"'csv'", "faithful", "unquoted"}));
}

TEST(Tsv, InvalidUtf8IsWarnedWithFileAndLine) {
  TempDir dir;
  write_file(dir / "t.tsv", "gut\tgood\t1\nLatin-1 caf\xe9\tcafe\t0\nok\tok\t1\n");
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  const auto rows = read_tsv(dir / "t.tsv", TsvQuoting::kFaithful);
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(rows.size(), 3u);
  EXPECT_TRUE(
      contains_all(log.str(), {dir / "t.tsv:2: invalid UTF-8", "'" + (dir / "t.tsv") +
                                                                   "': 1 of 3 lines are not valid "
                                                                   "UTF-8"}));
}

TEST(PairTsv, ReadsLabelledAndTestFilesWithTheOriginalNamingAsFallback) {
  TempDir dir;
  write_file(dir / "pawsx/de-dev.tsv", kIoQuotedTsv);  // the original release's naming
  const auto dev =
      read_pair_split(dir.path().string(), "pawsx", "dev", "de", TsvQuoting::kUnquoted);
  ASSERT_EQ(dev.size(), 3u);
  EXPECT_EQ(dev[0].text_a, "\"Angel Eyes\" ist gut");
  EXPECT_EQ(dev[0].label, "1");
  EXPECT_EQ(dev[1].source.file, dir / "pawsx/de-dev.tsv");
  EXPECT_EQ(dev[1].source.line, 2);
  write_file(dir / "xnli/test-fr.tsv", "prémisse\thypothèse\r\nun\tdeux\r\n");
  const auto test = read_pair_split(dir.path().string(), "xnli", "test", "fr");
  ASSERT_EQ(test.size(), 2u);
  EXPECT_EQ(test[1].text_b, "deux");
  EXPECT_EQ(test[1].label, "");
  write_file(dir / "xnli/train-en.tsv", "a\tb\tcontradictory\r\n");
  EXPECT_EQ(read_pair_split(dir.path().string(), "xnli", "train", "en")[0].label, "contradiction");
}

TEST(PairTsv, ErrorsNameFileLineLabelSetAndMissingLanguage) {
  TempDir dir;
  write_file(dir / "xnli/dev-de.tsv", "a\tb\tneutral\r\na\tb\r\n");
  EXPECT_TRUE(contains_all(
      error_message([&] { read_pair_split(dir.path().string(), "xnli", "dev", "de"); }),
      {dir / "xnli/dev-de.tsv:2", "expected 3", "found 2"}));
  write_file(dir / "xnli/dev-es.tsv", "a\tb\tneutral\r\na\tb\tmaybe\r\n");
  EXPECT_TRUE(contains_all(
      error_message([&] { read_pair_split(dir.path().string(), "xnli", "dev", "es"); }),
      {dir / "xnli/dev-es.tsv:2", "'maybe'", "[contradiction entailment neutral]"}));
  EXPECT_TRUE(contains_all(
      error_message([&] { read_pair_split(dir.path().string(), "xnli", "test", "sw"); }),
      {"xnli test split", "'sw'", dir / "xnli/test-sw.tsv", dir / "xnli/sw-test.tsv"}));
}

TEST(PairGold, ReadsUpstreamXnliAndPawsxFiles) {
  TempDir dir;
  write_file(dir / "xnli.test.tsv",
             "language\tgold_label\ts1_binary\ts2_binary\ts1_parse\ts2_parse\tsentence1\t"
             "sentence2\tpromptID\tpairID\n"
             "de\tcontradictory\t_\t_\t_\t_\t Er geht. \tEr bleibt.\t1\t1\n"
             "fr\tneutral\t_\t_\t_\t_\tIl va.\tIl reste.\t1\t2\n");
  const auto de = read_xnli_gold(dir / "xnli.test.tsv", "de");
  ASSERT_EQ(de.size(), 1u);
  EXPECT_EQ(de[0].label, "contradiction");
  EXPECT_EQ(de[0].text_a, "Er geht.");
  EXPECT_EQ(de[0].source.line, 2);
  EXPECT_TRUE(contains_all(error_message([&] { read_xnli_gold(dir / "xnli.test.tsv", "sw"); }),
                           {"no pairs", "'sw'"}));
  write_file(dir / "x-final/ja/test_2k.tsv", "id\tsentence1\tsentence2\tlabel\n7\t東京\t京都\t0\n");
  const auto ja = read_pawsx_gold(dir / "x-final/ja/test_2k.tsv");
  ASSERT_EQ(ja.size(), 1u);
  EXPECT_EQ(ja[0].text_b, "京都");
  EXPECT_EQ(ja[0].label, "0");
}

TEST(PairGold, SkipsEmptyLinesAndNamesTheFileAndLineOfABadRow) {
  TempDir dir;
  const std::string xnli = dir / "xnli.test.tsv";
  write_file(xnli, "header\n\nde\tneutral\t_\t_\t_\t_\ta\tb\nde\tneutral\tshort\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_xnli_gold(xnli, "de"); }),
                           {xnli + ":4: expected XNLI-1.0's columns", "found 3 columns"}));
  write_file(xnli, "header\n\nde\tneutral\t_\t_\t_\t_\ta\tb\nde\tmaybe\t_\t_\t_\t_\ta\tb\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_xnli_gold(xnli, "de"); }),
                           {xnli + ":4", "'maybe'", "xnli label set"}));
  const std::string pawsx = dir / "test_2k.tsv";
  write_file(pawsx, "id\tsentence1\tsentence2\tlabel\n\n1\t a \tb\t1\n\n2\tc\td\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_pawsx_gold(pawsx); }),
                           {pawsx + ":5: expected 4 columns", "found 3"}));
  write_file(pawsx, "id\tsentence1\tsentence2\tlabel\n\n1\t a \tb\t1\n\n2\tc\td\t0\n");
  const auto pairs = read_pawsx_gold(pawsx);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].text_a, "a");
  EXPECT_EQ(pairs[0].source.line, 3);
  EXPECT_EQ(pairs[1].source.line, 5);
  EXPECT_EQ(pairs[1].source.file, pawsx);
  EXPECT_TRUE(contains_all(error_message([&] { read_pawsx_gold(dir / "missing.tsv"); }),
                           {"PAWS-X gold", dir / "missing.tsv", "not found"}));
}

TEST(Conll, ReadsTaggedAndUntaggedFiles) {
  TempDir dir;
  write_file(dir / "udpos/dev-en.tsv", "The\tDET\ncat\tNOUN\n\n\nsat\tVERB");
  const auto dev = read_conll_tsv(tagging_file(dir.path().string(), "udpos", "dev", "en"), "udpos");
  ASSERT_EQ(dev.size(), 2u);
  EXPECT_EQ(dev[0].words, (std::vector<std::string>{"The", "cat"}));
  EXPECT_EQ(dev[0].tags, (std::vector<std::string>{"DET", "NOUN"}));
  EXPECT_EQ(dev[1].source.line, 5);
  write_file(dir / "panx/test-de.tsv", "Berlin\nist\n\nschön\n");
  const auto test = read_conll_tsv(dir / "panx/test-de.tsv", "panx");
  ASSERT_EQ(test.size(), 2u);
  EXPECT_EQ(test[0].words.size(), 2u);
  EXPECT_TRUE(test[0].tags.empty());
}

TEST(Conll, ErrorsNameFileLineAndLabelSet) {
  TempDir dir;
  write_file(dir / "bad.tsv", "Berlin\tB-LOC\nist\tB-MISC\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { read_conll_tsv(dir / "bad.tsv", "panx"); }),
                   {dir / "bad.tsv:2", "'B-MISC'", "[B-LOC B-ORG B-PER I-LOC I-ORG I-PER O]"}));
  write_file(dir / "mixed.tsv", "Berlin\tB-LOC\nist\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_conll_tsv(dir / "mixed.tsv", "panx"); }),
                           {dir / "mixed.tsv:2", "no tag"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { tagging_file(dir.path().string(), "panx", "test", "yo"); }),
                   {"panx test split", "'yo'", dir / "panx/test-yo.tsv"}));
}

TEST(Conll, RawPanxDropsTheLanguagePrefixUpToTheFirstColon) {
  TempDir dir;
  write_file(dir / "en-train", "en:Atlantic\tB-LOC\nen:a:b\tO\n\nen:R.H.\tB-ORG\n");
  const auto s = read_panx_raw(dir / "en-train");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].words, (std::vector<std::string>{"Atlantic", "a:b"}));
  EXPECT_EQ(s[1].words[0], "R.H.");
  EXPECT_EQ(s[1].tags[0], "B-ORG");
  write_file(dir / "bad", "Atlantic\tB-LOC\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_panx_raw(dir / "bad"); }),
                           {dir / "bad:1", "'lang:' prefix"}));
}

TEST(Conllu, FusesMultiWordTokensAsTheConversionToolAndCleansForms) {
  TempDir dir;
  write_file(dir / "es_test-ud-test.conllu",
             "# text = Voy al mercado\n"
             "1\tVoy\tir\tVERB\t_\t_\t0\troot\t_\t_\n"
             "2-3\tal\t_\t_\t_\t_\t_\t_\t_\t_\n"
             "2\ta\ta\tADP\t_\t_\t4\tcase\t_\t_\n"
             "3\tel\tel\tDET\t_\t_\t4\tdet\t_\t_\n"
             "4\tmercado\tmercado\tNOUN\t_\t_\t1\tobl\t_\t_\n"
             "4.1\tx\t_\tNOUN\t_\t_\t_\t_\t1:dep\t_\n"
             "\n"
             "1-2\tvámonos\t_\t_\t_\t_\t_\t_\t_\t_\n"
             "1\tvamos\tir\tVERB\t_\t_\t0\troot\t_\t_\n"
             "2\tnos\tnos\tPRON\t_\t_\t1\tobj\t_\t_\n"
             "3\thọc sinh\t_\tNOUN\t_\t_\t1\tobj\t_\t_\n"
             "4\tha\xE2\x80\x8Clo\t_\tINTJ\t_\t_\t1\tdiscourse\t_\t_\n"
             "\n"
             "1\t_\t_\tX\t_\t_\t0\troot\t_\t_\n"
             "\n");
  const auto s = read_conllu(dir / "es_test-ud-test.conllu", "es");
  ASSERT_EQ(s.size(), 2u);  // the all-'_' sentence is dropped
  // Tie between ADP and DET (same depth): es precedence ranks ADP first.
  EXPECT_EQ(s[0].words, (std::vector<std::string>{"Voy", "al", "mercado"}));
  EXPECT_EQ(s[0].tags, (std::vector<std::string>{"VERB", "ADP", "NOUN"}));
  EXPECT_EQ(s[0].source.line, 2);
  // A single highest node heads the span; spaces and ZWNJ are deleted.
  EXPECT_EQ(s[1].words, (std::vector<std::string>{"vámonos", "họcsinh", "halo"}));
  EXPECT_EQ(s[1].tags, (std::vector<std::string>{"VERB", "NOUN", "INTJ"}));
  write_file(dir / "bad.conllu", "1\tx\tx\tNOUNS\t_\t_\t0\troot\t_\t_\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_conllu(dir / "bad.conllu", "en"); }),
                           {dir / "bad.conllu:1", "'NOUNS'", "ADJ ADP"}));
  EXPECT_EQ(ud_conllu_files(dir.path().string(), "es", "test"),
            (std::vector<std::string>{dir / "es_test-ud-test.conllu"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { ud_conllu_files(dir.path().string(), "de", "test"); }),
                   {"'de'", "de_*test*.conllu"}));
}

// "Café au lait: " is 14 code points but 15 bytes: Zürich starts at code point 14, byte 15.
const char* kIoSquadJson = R"({"version": "1.1", "data": [{"title": "t", "paragraphs": [{
  "context": "Café au lait: Zürich ist schön.",
  "qas": [
    {"id": "q1", "question": "Wo?", "answers": [{"text": "Zürich", "answer_start": 14},
                                                  {"text": "schön", "answer_start": 25}]},
    {"id": "q2", "question": "Wo?", "answers": [{"text": "Zurich", "answer_start": 14}]},
    {"id": "q3", "question": "Was?", "answers": [{"text": "", "answer_start": 0}]}
  ]}]}]})";

TEST(SquadJson, ConvertsCodePointOffsetsToBytesAndSkipsMismatchedAnswers) {
  TempDir dir;
  write_file(dir / "xquad/xquad.de.json", kIoSquadJson);
  const std::string path = qa_file(dir.path().string(), "xquad", "test", "de");
  const auto data = read_squad_json(path);
  EXPECT_EQ(data.skipped, 1);
  ASSERT_EQ(data.examples.size(), 2u);
  const auto& q1 = data.examples[0];
  EXPECT_EQ(q1.id, "q1");
  EXPECT_EQ(q1.answers[0].start, 15);
  EXPECT_EQ(q1.context.substr(15, q1.answers[0].text.size()), "Zürich");
  EXPECT_EQ(q1.answers[1].start, 27);
  EXPECT_EQ(data.examples[1].answers[0].start, 0);  // a blanked answer
  const auto gold = read_squad_json(path, /*skip_mismatched=*/false);
  EXPECT_EQ(gold.skipped, 0);
  ASSERT_EQ(gold.examples.size(), 3u);
  EXPECT_EQ(gold.examples[1].answers[0].start, -1);
}

TEST(SquadJson, ErrorsNameTheLineOrTheJsonPath) {
  TempDir dir;
  write_file(dir / "bad.json", "{\"data\": [\n{\"paragraphs\": [\n{\"context\": \"x\",, }]}]}");
  EXPECT_TRUE(contains_all(
      error_message([&] { read_squad_json(dir / "bad.json"); }),
      {"SQuAD-format file '" + (dir / "bad.json") + "'", "is not valid JSON", "line 3"}));
  write_file(
      dir / "noq.json",
      R"({"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "a", "answers": []}]}]}]})");
  EXPECT_TRUE(contains_all(error_message([&] { read_squad_json(dir / "noq.json"); }),
                           {dir / "noq.json", "data[0].paragraphs[0].qas[0].question"}));
  // A mistyped value is shown (describe_json), not only its type.
  write_file(dir / "id.json",
             R"({"data": [{"paragraphs": [{"context": "x", "qas": [{"id": [7, 8]}]}]}]})");
  EXPECT_TRUE(contains_all(
      error_message([&] { read_squad_json(dir / "id.json"); }),
      {dir / "id.json", "data[0].paragraphs[0].qas[0].id is a list [7, 8]", "expected a string"}));
  write_file(dir / "para.json", R"({"data": [{"paragraphs": ["x"]}]})");
  EXPECT_TRUE(contains_all(error_message([&] { read_squad_json(dir / "para.json"); }),
                           {dir / "para.json", "data[0].paragraphs[0] is a string \"x\"",
                            "expected an object with 'context'"}));
  EXPECT_TRUE(contains_all(
      error_message([&] { qa_file(dir.path().string(), "tydiqa", "test", "sw"); }),
      {"tydiqa test split", "'sw'", "tydiqa.goldp.sw.dev.json", "tydiqa-goldp-dev-swahili.json"}));
}

// Gold questions are scored by id: two with one id would both be scored with one answer.
TEST(SquadJson, RepeatedQuestionIdsAreRefusedInGold) {
  TempDir dir;
  std::string json = kIoSquadJson;
  json.replace(json.find("\"q2\""), 4, "\"q1\"");
  write_file(dir / "dup.json", json);
  EXPECT_TRUE(contains_all(
      error_message([&] { read_squad_json(dir / "dup.json", /*skip_mismatched=*/false); }),
      {dir / "dup.json", "the question id 'q1' of data[0].paragraphs[0].qas[1]",
       "is also the id of data[0].paragraphs[0].qas[0]", "give every question its own id"}));
  EXPECT_EQ(read_squad_json(dir / "dup.json").examples.size(), 2u);  // training: kept, logged
}

// The project's JSON reader (common/json.h) refuses nesting past kMaxJsonDepth before anything
// walks the value; nlohmann's own parser took the 100000 levels and left them to the reader.
TEST(SquadJson, DeepNestingIsRefused) {
  TempDir dir;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_file(dir / "deep.json",
             R"({"data": [{"paragraphs": [{"context": "x", "qas": [{"id": )" + deep + "}]}]}]}");
  EXPECT_TRUE(contains_all(error_message([&] { read_squad_json(dir / "deep.json"); }),
                           {"'" + (dir / "deep.json") + "'", "nested too deeply"}));
}

TEST(QaFiles, FollowXtremesNaming) {
  TempDir dir;
  write_file(dir / "mlqa/MLQA_V1/test/test-context-ar-question-ar.json", "{}");
  write_file(dir / "tydiqa/tydiqa-goldp-v1.1-train/tydiqa.en.train.json", "{}");
  write_file(dir / "squad/train-v1.1.json", "{}");
  EXPECT_EQ(qa_file(dir.path().string(), "mlqa", "test", "ar"),
            dir / "mlqa/MLQA_V1/test/test-context-ar-question-ar.json");
  EXPECT_EQ(qa_file(dir.path().string(), "tydiqa", "train", "en"),
            dir / "tydiqa/tydiqa-goldp-v1.1-train/tydiqa.en.train.json");
  EXPECT_EQ(qa_file(dir.path().string(), "squad", "train", "en"), dir / "squad/train-v1.1.json");
  // A split XTREME does not have lists the layout table.
  EXPECT_TRUE(contains_all(
      error_message([&] { qa_file(dir.path().string(), "xquad", "dev", "de"); }),
      {"QA dataset 'xquad' has no 'dev' split",
       "squad train, squad dev, xquad test, mlqa dev, mlqa test, tydiqa train, tydiqa test"}));
}

TEST(Tatoeba, ReadsLaserOriginalsAndXtremesSortedCopy) {
  TempDir dir;
  write_file(dir / "laser/tatoeba.pes-eng.pes", "سلام\nخداحافظ\n");
  write_file(dir / "laser/tatoeba.pes-eng.eng", "hello\ngoodbye\n");
  const auto laser = read_tatoeba_laser(dir / "laser", "fa");
  EXPECT_TRUE(laser.aligned);
  EXPECT_EQ(laser.source_language, "fa");
  EXPECT_EQ(laser.target, (std::vector<std::string>{"hello", "goodbye"}));
  write_file(dir / "download/tatoeba/fa-en.fa", "سلام\nخداحافظ\n");
  write_file(dir / "download/tatoeba/fa-en.en", "goodbye\nhello\n");
  EXPECT_FALSE(read_tatoeba_xtreme(dir / "download", "fa").aligned);
  EXPECT_EQ(tatoeba_sorted_order({"b", "a ", "c", "a"}), (std::vector<int64_t>{1, 3, 0, 2}));
  EXPECT_EQ(tatoeba_iso3("zh"), "cmn");
  write_file(dir / "laser/tatoeba.swh-eng.swh", "a\n");
  write_file(dir / "laser/tatoeba.swh-eng.eng", "a\nb\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_tatoeba_laser(dir / "laser", "sw"); }),
                           {"tatoeba.swh-eng.swh' has 1 lines", "has 2"}));
  EXPECT_TRUE(contains_all(error_message([&] { read_tatoeba_laser(dir / "laser", "de"); }),
                           {"tatoeba.deu-eng.deu", "not found"}));
}

// A line of 96 MiB (a damaged or concatenated file) is cut to its first MiB while it is read: it
// used to be read whole (its size and more again in memory) and cut later by the tokenizer. Its
// neighbours are read as they are, and a cut never splits a UTF-8 character.
TEST(Tatoeba, ALongLineIsCutWhileItIsRead) {
  TempDir dir;
  const int64_t long_bytes = int64_t{96} << 20;
  write_file(dir / "laser/tatoeba.deu-eng.eng", "Good day\nlong\nThanks\n");
  {
    std::ofstream out(dir / "laser/tatoeba.deu-eng.deu", std::ios::binary);
    out << "Guten Tag\n";
    std::string block;
    for (int i = 0; i < 1024; ++i) block += "\xE2\x82\xAC";  // the euro sign: 3 bytes
    for (int64_t done = 0; done < long_bytes; done += static_cast<int64_t>(block.size()))
      out << block;
    out << "\nDanke\n";
  }
  const int64_t before = xlme::testing::peak_rss_mib();
  const auto pairs = read_tatoeba_laser(dir / "laser", "de");
  ASSERT_EQ(pairs.source.size(), 3u);
  EXPECT_EQ(pairs.source[0], "Guten Tag");
  EXPECT_EQ(pairs.source[2], "Danke");
  const std::string& cut = pairs.source[1];
  EXPECT_LE(cut.size(), size_t{1} << 20);
  EXPECT_GE(cut.size(), (size_t{1} << 20) - 3);
  EXPECT_EQ(cut.size() % 3, 0u) << "a character was split";
  EXPECT_EQ(cut.substr(cut.size() - 3), "\xE2\x82\xAC");
  // Reading the line whole raised the peak by more than the line.
  EXPECT_LT(xlme::testing::peak_rss_mib() - before, 32);
}

// LASER's originals and XTREME's copy (xx side copied, English lines stripped and sorted) are
// matched as the other tasks' test files and gold: counts, then the first differing line.
TEST(Tatoeba, GoldIsMatchedWithXtremesCopyLineByLine) {
  TempDir dir;
  write_file(dir / "laser/tatoeba.deu-eng.deu", "Guten Tag\nTschüss\nDanke\n");
  write_file(dir / "laser/tatoeba.deu-eng.eng", "hello \ngoodbye\nthanks\n");
  write_file(dir / "download/tatoeba/de-en.de", "Guten Tag\nTschüss\nDanke\n");
  write_file(dir / "download/tatoeba/de-en.en", "goodbye\nhello\nthanks\n");
  const std::string deu = dir / "laser/tatoeba.deu-eng.deu",
                    eng = dir / "laser/tatoeba.deu-eng.eng";
  const std::string de = dir / "download/tatoeba/de-en.de", en = dir / "download/tatoeba/de-en.en";
  const auto matched = read_tatoeba(dir / "laser", dir / "download", "de");
  EXPECT_TRUE(matched.pairs.aligned);
  EXPECT_EQ(matched.from, "from the gold '" + deu + "' and '" + eng +
                              "', the same as XTREME's test files '" + de + "' and '" + en + "'");
  // An English line of another release: the sorted line and its LASER line are named.
  write_file(dir / "laser/tatoeba.deu-eng.eng", "hello \ngood bye\nthanks\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { read_tatoeba(dir / "laser", dir / "download", "de"); }),
                   {"tatoeba test set of de (English, as XTREME sorts it): the test file '" + en +
                        "' (3 lines) and the gold '" + eng + "' (3 lines) differ",
                    "line 1 (" + en + ":1; gold " + eng +
                        ":2): sentence 1 is 'goodbye' in the test file and "
                        "'good bye' in the gold"}));
  // The gold cut by a line.
  write_file(dir / "laser/tatoeba.deu-eng.deu", "Guten Tag\nTschüss\n");
  write_file(dir / "laser/tatoeba.deu-eng.eng", "hello\ngoodbye\n");
  EXPECT_TRUE(contains_all(
      error_message([&] { read_tatoeba(dir / "laser", dir / "download", "de"); }),
      {"the test file '" + de + "' (3 lines) and the gold '" + deu + "' (2 lines) differ",
       "after 2 lines the gold ends; the test file goes on at " + de + ":3"}));
  // Without XTREME's copy the gold is used alone; without gold, XTREME's copy; both said.
  EXPECT_TRUE(contains_all(read_tatoeba(dir / "laser", dir / "elsewhere", "de").from,
                           {"from the gold '" + deu + "' and '" + eng + "' alone"}));
  EXPECT_EQ(read_tatoeba("", dir / "download", "de").from,
            "from XTREME's '" + de + "' and '" + en + "' (English sorted; no gold)");
}

TEST(BuccFiles, ReadsIdsSentencesAndGold) {
  TempDir dir;
  write_file(dir / "bucc2018/de-en.dev.de", "de-000001\tHallo Welt\nde-000002\tGuten Tag\n");
  write_file(dir / "bucc2018/de-en.dev.en", "en-000001\tGood day\n");
  write_file(dir / "bucc2018/de-en.dev.gold", "de-000002\ten-000001\n");
  const auto c = read_bucc(dir.path().string(), "de", "dev", true);
  ASSERT_EQ(c.source.size(), 2u);
  EXPECT_EQ(c.source[1], (std::pair<std::string, std::string>{"de-000002", "Guten Tag"}));
  EXPECT_EQ(c.gold.size(), 1u);
  write_file(dir / "bucc2018/de-en.dev.gold", "de-000002\ten-000001\nde-000003\ten-000001\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { read_bucc(dir.path().string(), "de", "dev", true); }),
                   {dir / "bucc2018/de-en.dev.gold:2", "de-000003"}));
  write_file(dir / "bucc2018/fr-en.test.fr", "fr-1\tBonjour\n");
  write_file(dir / "bucc2018/fr-en.test.en", "en-1\tHello\n");
  EXPECT_TRUE(read_bucc(dir.path().string(), "fr", "test", false).gold.empty());
  EXPECT_TRUE(
      contains_all(error_message([&] { read_bucc(dir.path().string(), "fr", "test", true); }),
                   {dir / "bucc2018/fr-en.test.gold", "does not exist"}));
}

TEST(Pharaoh, SureAndPossibleLinksWithEitherBase) {
  std::vector<Link> sure, possible;
  parse_pharaoh_line("0-0 1p2 2?1", false, "g:1", sure, possible);
  EXPECT_EQ(sure, (std::vector<Link>{{0, 0}}));
  EXPECT_EQ(possible, (std::vector<Link>{{1, 2}, {2, 1}}));
  sure.clear();
  possible.clear();
  parse_pharaoh_line("7\t1-1 2p3", true, "g:1", sure, possible);
  EXPECT_EQ(sure, (std::vector<Link>{{0, 0}}));
  EXPECT_EQ(possible, (std::vector<Link>{{1, 2}}));
  EXPECT_TRUE(
      contains_all(error_message([&] { parse_pharaoh_line("0-x", false, "g:4", sure, possible); }),
                   {"g:4", "'0-x'"}));
  TempDir dir;
  write_file(dir / "s", "das Haus\nein Buch ist\n");
  write_file(dir / "t", "the house\na book\n");
  write_file(dir / "g", "0-0 1-1\n0-0 1-1 2p1\n");
  const auto pairs = read_aligned_pairs(dir / "s", dir / "t", dir / "g");
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[1].source_words.size(), 3u);
  EXPECT_EQ(pairs[1].possible, (std::vector<Link>{{2, 1}}));
  write_file(dir / "g", "0-0 1-2\n0-0\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { read_aligned_pairs(dir / "s", dir / "t", dir / "g"); }),
                   {dir / "g:1", "link 1-2", "0-based"}));
}

TEST(Writers, SubmissionLayout) {
  TempDir dir;
  const std::string root = dir / "predictions";
  EXPECT_EQ(prediction_path(root, "mlqa", "de"), root + "/mlqa/test-de.json");
  const std::string tags = prediction_path(root, "udpos", "de");
  EXPECT_EQ(tags, root + "/udpos/test-de.tsv");
  write_tag_predictions(tags, {{"NOUN", "VERB"}, {"ADJ"}});
  EXPECT_EQ(read_file(tags), "NOUN\nVERB\n\nADJ\n");
  write_label_predictions(dir / "l.tsv", {"entailment", "neutral"});
  EXPECT_EQ(read_file(dir / "l.tsv"), "entailment\nneutral\n");
  // The bytes the QA tasks wrote inline before they used this writer: keys sorted, indent 2.
  write_qa_predictions(dir / "q.json", {{"q2", ""}, {"q1", "Zürich \"Mitte\""}});
  EXPECT_EQ(read_file(dir / "q.json"),
            "{\n  \"q1\": \"Zürich \\\"Mitte\\\"\",\n  \"q2\": \"\"\n}\n");
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "q.json")).at("q1"), "Zürich \"Mitte\"");
  write_index_predictions(dir / "i.tsv", {2, 0, 1});
  EXPECT_EQ(read_file(dir / "i.tsv"), "2\n0\n1\n");
  write_pair_predictions(dir / "p.tsv", {{"de-1", "en-2"}});
  EXPECT_EQ(read_file(dir / "p.tsv"), "de-1\ten-2\n");
}

TEST(Paths, StayUnderTheirRoot) {
  EXPECT_EQ(path_under("download", "pawsx/train-en.tsv"), "download/pawsx/train-en.tsv");
  EXPECT_EQ(path_under("download/", "pawsx/test-de.tsv"), "download/pawsx/test-de.tsv");
  EXPECT_EQ(path_under("", "x-final/de/test_2k.tsv"), "x-final/de/test_2k.tsv");
  // "test-.." is a folder name, not a step up: still inside.
  EXPECT_EQ(path_under("/data", "pawsx/test-../x.tsv"), "/data/pawsx/test-../x.tsv");
  for (const char* escape :
       {"pawsx/../../x-test.tsv", "../x", "/etc/hostname", "..", ".", "a/../../b"}) {
    EXPECT_TRUE(contains_all(error_message([&] { path_under("runs/out", escape); }),
                             {std::string("'") + escape + "'", "'runs/out'", "leads outside"}))
        << escape;
  }
  // Every reader that builds a name from a language code checks it.
  TempDir dir;
  EXPECT_TRUE(contains_all(
      error_message([&] { pair_file(dir.path().string(), "xnli", "test", "../../x"); }),
      {"'xnli/../../x-test.tsv'", "leads outside"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { prediction_path(dir / "p", "udpos", "../../../../x"); }),
                   {"'udpos/test-../../../../x.tsv'", "leads outside"}));
}

TEST(Prepare, UdposFromConlluAsXtremesConversion) {
  TempDir dir;
  // Two English treebanks (concatenated in file-name order), comments, a multi-word token
  // (its subtokens replaced by the fused form with the head's UPOS), an empty node.
  write_file(dir / "ud/UD_English-B/en_b-ud-train.conllu",
             "# sent_id = b1\n"
             "# text = We're here\n"
             "1-2\tWe're\t_\t_\t_\t_\t_\t_\t_\t_\n"
             "1\tWe\twe\tPRON\t_\t_\t3\tnsubj\t_\t_\n"
             "2\t're\tbe\tAUX\t_\t_\t3\tcop\t_\t_\n"
             "3\there\there\tADV\t_\t_\t0\troot\t_\t_\n"
             "3.1\tis\t_\tAUX\t_\t_\t_\t_\t3:cop\t_\n"
             "\n");
  write_file(dir / "ud/UD_English-A/en_a-ud-train.conllu",
             "# text = Go .\n"
             "1\tGo\tgo\tVERB\t_\t_\t0\troot\t_\t_\n"
             "2\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_\n"
             "\n"
             "1\tNow\tnow\tADV\t_\t_\t0\troot\t_\t_\n"
             "\n");
  write_file(dir / "ud/UD_English-A/en_a-ud-test.conllu",
             "1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n");
  write_file(dir / "ud/UD_German-A/de_a-ud-dev.conllu", "1\tJa\tja\tINTJ\t_\t_\t0\troot\t_\t_\n");
  const auto written = prepare_udpos(dir / "ud", dir / "download", {"en", "de", "fr"});
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written[0].path, dir / "download/udpos/train-en.tsv");
  EXPECT_EQ(written[0].sentences, 3);
  EXPECT_EQ(read_file(dir / "download/udpos/train-en.tsv"),
            "Go\tVERB\n.\tPUNCT\n\nNow\tADV\n\nWe're\tPRON\nhere\tADV\n");
  // Test files carry the words only, as XTREME's (the gold is the .conllu itself).
  EXPECT_EQ(read_file(dir / "download/udpos/test-en.tsv"), "Hi\n");
  EXPECT_EQ(read_file(dir / "download/udpos/dev-de.tsv"), "Ja\tINTJ\n");
  EXPECT_FALSE(std::filesystem::exists(dir / "download/udpos/dev-en.tsv"));
  // What it wrote is what xlme-finetune reads.
  const auto back = read_conll_tsv(dir / "download/udpos/train-en.tsv", "udpos");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[2].words, (std::vector<std::string>{"We're", "here"}));
  EXPECT_TRUE(contains_all(error_message([&] { prepare_udpos(dir / "ud", dir / "o", {"fr"}); }),
                           {dir / "ud", "fr", "conllu"}));
}

TEST(Prepare, PanxFromRawWikiannFolders) {
  TempDir dir;
  write_file(dir / "panx/en/train", "en:Atlantic\tB-LOC\nen:City:X\tI-LOC\n\nen:Bob\tB-PER\n");
  write_file(dir / "panx/en/test", "en:Bob\tB-PER\n");
  const auto written = prepare_panx(dir / "panx", dir / "download", {"en", "de"});
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(read_file(dir / "download/panx/train-en.tsv"),
            "Atlantic\tB-LOC\nCity:X\tI-LOC\n\nBob\tB-PER\n");
  EXPECT_EQ(read_file(dir / "download/panx/test-en.tsv"), "Bob\n");
  EXPECT_TRUE(contains_all(error_message([&] { prepare_panx(dir / "panx", dir / "o", {"de"}); }),
                           {dir / "panx", "de", "<lang>/{train,dev,test}"}));
}

TEST(Tatoeba, XtremeRLanguagesAndInvalidUtf8NamingFileAndLine) {
  TempDir dir;
  EXPECT_EQ(tatoeba_iso3("uk"), "ukr");
  EXPECT_EQ(tatoeba_iso3("az"), "aze");
  write_file(dir / "laser/tatoeba.ukr-eng.ukr", "привіт\nдо поб\xd0\n");
  write_file(dir / "laser/tatoeba.ukr-eng.eng", "hello\ngoodbye\n");
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  const auto pairs = read_tatoeba_laser(dir / "laser", "uk");
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(pairs.source.size(), 2u);
  EXPECT_TRUE(contains_all(log.str(), {dir / "laser/tatoeba.ukr-eng.ukr:2: invalid UTF-8"}));
  EXPECT_TRUE(contains_all(error_message([] { tatoeba_iso3("xx"); }),
                           {"'xx'", "XTREME-R's az lt pl ro uk"}));
}

TEST(QaFiles, GoldNeedsNoAnswerStrippedCopy) {
  TempDir dir;
  write_file(dir / "gold/xquad.de.json", "{}");
  write_file(dir / "gold/test-context-ar-question-ar.json", "{}");
  EXPECT_EQ(qa_gold_file(dir / "gold", "xquad", "test", "de"), dir / "gold/xquad.de.json");
  EXPECT_EQ(qa_gold_file(dir / "gold", "mlqa", "test", "ar"),
            dir / "gold/test-context-ar-question-ar.json");
  EXPECT_TRUE(
      contains_all(error_message([&] { qa_gold_file(dir / "gold", "xquad", "test", "ru"); }),
                   {dir / "gold/xquad.ru.json", "finetune.gold_dir"}));
}

// A UTF-8 byte-order mark (as Windows editors write one) is dropped by every reader alike, so that
// a .conllu with one is not refused as "10 TAB-separated columns, found 1", a Tatoeba line does not
// keep it in its text and a BUCC id still matches its gold.
TEST(Bom, EveryReaderDropsAByteOrderMarkAlike) {
  TempDir dir;
  auto both = [&](const std::string& name, const std::string& content) {
    write_file(dir / ("plain/" + name), content);
    write_file(dir / ("bom/" + name), "\xEF\xBB\xBF" + content);
  };
  both("t.tsv", "a\tb\t1\r\n");
  both("udpos.tsv", "The\tDET\n");
  both("en/test", "en:Bob\tB-PER\n");
  both("word.conllu", "1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n");
  both("comment.conllu", "# sent_id = 1\n1\tHo\tho\tINTJ\t_\t_\t0\troot\t_\t_\n\n");
  both("xnli.test.tsv",
       "language\tgold_label\n"
       "de\tneutral\t_\t_\t_\t_\ta\tb\n");
  both("test_2k.tsv", "id\tsentence1\tsentence2\tlabel\n1\tc\td\t1\n");
  both("q.json",
       R"({"data": [{"paragraphs": [{"context": "x y", "qas": [{"id": "q1", "question": "w",
       "answers": [{"text": "y", "answer_start": 2}]}]}]}]})");
  both("tatoeba.deu-eng.deu", "Hallo\n");
  both("tatoeba.deu-eng.eng", "Hello\n");
  both("bucc2018/de-en.dev.de", "de-1\tHallo\n");
  both("bucc2018/de-en.dev.en", "en-1\tHello\n");
  both("bucc2018/de-en.dev.gold", "de-1\ten-1\n");
  both("a.en", "x y\n");
  both("a.de", "x y\n");
  both("a.gold", "0-0 1-1\n");
  auto read_all = [&](const std::string& root) {
    const std::string d = dir / root;
    std::string out;
    for (const auto& row : read_tsv(d + "/t.tsv", TsvQuoting::kFaithful)) out += row.fields[0];
    for (const auto& s : read_conll_tsv(d + "/udpos.tsv", "udpos")) out += s.words[0] + s.tags[0];
    for (const auto& s : read_panx_raw(d + "/en/test")) out += s.words[0];
    for (const char* f : {"/word.conllu", "/comment.conllu"}) {
      for (const auto& s : read_conllu(d + f, "en")) out += s.words[0] + s.tags[0];
    }
    for (const auto& e : read_xnli_gold(d + "/xnli.test.tsv", "de")) out += e.text_a + e.label;
    for (const auto& e : read_pawsx_gold(d + "/test_2k.tsv")) out += e.text_a + e.label;
    for (const auto& e : read_squad_json(d + "/q.json").examples) out += e.id + e.answers[0].text;
    const auto tatoeba = read_tatoeba_laser(d, "de");
    out += tatoeba.source[0] + tatoeba.target[0];
    const auto bucc = read_bucc(d, "de", "dev", true);
    out += bucc.source[0].first + bucc.gold[0].first;
    for (const auto& p : read_aligned_pairs(d + "/a.en", d + "/a.de", d + "/a.gold")) {
      out += p.source_words[0] + std::to_string(p.sure.size());
    }
    return out;
  };
  const auto plain = read_all("plain");
  EXPECT_EQ(plain, "aTheDETBobHiINTJHoINTJaneutralc1q1yHalloHellode-1de-1x2");
  EXPECT_EQ(read_all("bom"), plain);
}

// A processed test file and the gold it was made from are compared; the first
// difference names both files and both lines.
TEST(TestAgainstGold, FirstDifferenceNamesBothFilesAndLines) {
  const std::vector<ExampleKey> gold = {{{"g.conllu", 1}, {"Ich", "bin"}},
                                        {{"g.conllu", 5}, {"Ja"}}};
  std::vector<ExampleKey> test = {{{"t.tsv", 1}, {"Ich", "bin"}}, {{"t.tsv", 4}, {"Ja"}}};
  auto check = [&]() -> std::string {
    try {
      check_test_matches_gold("udpos test set of de", test, "t.tsv", gold, "'g.conllu'", "sentence",
                              {"word"});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(check(), "");
  // A gold cut at a sentence boundary.
  test.push_back({{"t.tsv", 6}, {"Nein"}});
  EXPECT_TRUE(contains_all(check(), {"udpos test set of de: the test file 't.tsv' (3 sentences) "
                                     "and the gold 'g.conllu' (2 sentences) differ",
                                     "first difference: after 2 sentences the gold ends; the test "
                                     "file goes on at t.tsv:6",
                                     "same release"}))
      << check();
  test.pop_back();
  test[1].fields = {"Jo"};
  EXPECT_TRUE(contains_all(check(), {"sentence 2 (t.tsv:4; gold g.conllu:5): word 1 is 'Jo' in "
                                     "the test file and 'Ja' in the gold"}))
      << check();
  test[1].fields = {"Ja", "!"};
  EXPECT_TRUE(contains_all(check(), {"sentence 2", "2 words in the test file, 1 in the gold"}));
  // Named fields, a tolerant comparison, long values cut.
  const std::vector<ExampleKey> q_gold = {
      {{"gold/xquad.de.json", 0}, {"q1", std::string(90, 'x')}}};
  const std::vector<ExampleKey> q_test = {{{"xquad.de.json", 0}, {"q1", std::string(90, 'y')}}};
  const auto message = error_message([&] {
    check_test_matches_gold("xquad test set of de", q_test, "xquad.de.json", q_gold,
                            "'gold/xquad.de.json'", "question", {"id", "question"});
  });
  EXPECT_TRUE(contains_all(message, {"question 1 (xquad.de.json; gold gold/xquad.de.json): "
                                     "question is '" +
                                     std::string(60, 'y') + "...'"}))
      << message;
  EXPECT_NO_THROW(
      check_test_matches_gold("x", q_test, "a", q_gold, "b", "question", {"id", "question"},
                              [](const std::string&, const std::string&) { return true; }));
}

// xlme-data xtreme's readers refuse an empty or unparseable download, naming it (a 0-byte
// .conllu is not skipped with "wrote 4 files" after it); a treebank without text (forms all
// '_', as UD_English-ESL) is still no error.
TEST(Prepare, RefusesEmptyAndUnparseableInputsNamingThem) {
  TempDir dir;
  const std::string good = "1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n";
  write_file(dir / "ud/UD_English-A/en_a-ud-dev.conllu", good);
  const std::string train = dir / "ud/UD_English-A/en_a-ud-train.conllu";
  write_file(train, "");
  EXPECT_TRUE(contains_all(error_message([&] { prepare_udpos(dir / "ud", dir / "o", {"en"}); }),
                           {"'" + train + "' is empty (0 bytes)", "failed download"}));
  write_file(train, "# newdoc\n# sent_id = 1\n\n");
  EXPECT_TRUE(contains_all(error_message([&] { prepare_udpos(dir / "ud", dir / "o", {"en"}); }),
                           {"'" + train + "' holds no CoNLL-U word line"}));
  write_file(train, "<!DOCTYPE html>\n<html><body>Not Found</body></html>\n");
  EXPECT_TRUE(contains_all(error_message([&] { prepare_udpos(dir / "ud", dir / "o", {"en"}); }),
                           {train + ":1", "10 TAB-separated columns, found 1"}));
  write_file(train, "1\t_\t_\tNOUN\t_\t_\t0\troot\t_\t_\n\n");         // no text, as ESL
  EXPECT_EQ(prepare_udpos(dir / "ud", dir / "o", {"en"}).size(), 1u);  // dev-en only
  write_file(dir / "panx/en/train", "");
  EXPECT_TRUE(contains_all(error_message([&] { prepare_panx(dir / "panx", dir / "o", {"en"}); }),
                           {"'" + (dir / "panx/en/train") + "' is empty (0 bytes)"}));
  write_file(dir / "panx/en/train", "<html>\n");
  EXPECT_TRUE(contains_all(error_message([&] { prepare_panx(dir / "panx", dir / "o", {"en"}); }),
                           {dir / "panx/en/train", "holds no raw PAN-X line"}));
}

// Every "file not found" says what the user has to do for that file: xlme-data xtreme
// for udpos and panx, XTREME's download_data.sh for what it writes, the upstream archive and
// finetune.gold_dir for gold; none says to drop a language (for the training language that
// cannot help).
TEST(DataMessages, SayWhatTheUserHasToDoForEachFile) {
  TempDir dir;
  const std::string d = dir.path().string();
  auto says = [](const std::string& message, const std::vector<std::string>& parts) {
    EXPECT_EQ(message.find("drop"), std::string::npos) << message;
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << part;
    EXPECT_FALSE(message.empty());
  };
  says(error_message([&] { tagging_file(d, "udpos", "train", "en"); }),
       {dir / "udpos/train-en.tsv", "xlme-data xtreme --task udpos --input",
        "ud-treebanks-v2.5.tgz", "--out " + d});
  says(error_message([&] { tagging_file(d, "panx", "train", "en"); }),
       {"xlme-data xtreme --task panx", "AmazonPhotos.zip"});
  says(error_message([&] { pair_file(d, "xnli", "train", "en"); }),
       {"XTREME's scripts/download_data.sh", "finetune.data_dir ('" + d + "')"});
  says(error_message([&] { qa_file(d, "squad", "train", "en"); }),
       {dir / "squad/train-v1.1.json", "scripts/download_data.sh"});
  says(error_message([&] { read_pair_gold(d, "xnli", "de"); }),
       {dir / "XNLI-1.0/xnli.test.tsv", "finetune.gold_dir", "XNLI-1.0.zip"});
  says(error_message([&] { read_pair_gold(d, "pawsx", "de"); }),
       {dir / "x-final/de/test_2k.tsv", "finetune.gold_dir", "x-final.tar.gz"});
  says(error_message([&] { tagging_gold_files(d, "panx", "de"); }),
       {dir / "de/test", "finetune.gold_dir"});
  says(error_message([&] { read_bucc(d, "de", "dev", true); }),
       {dir / "bucc2018/de-en.dev.de", "download_data.sh", "training-gold archive"});
  says(error_message([&] { read_aligned_pairs(d + "/a.en", d + "/a.de", d + "/a.gold"); }),
       {"finetune.data_dir", "<a>-<b>.gold"});
}

// LASER's data/tatoeba/v1 is finetune.gold_dir; each error points at the right key.
TEST(Tatoeba, ErrorsPointAtTheRightKey) {
  TempDir dir;
  write_file(dir / "v1/tatoeba.deu-eng.deu", "Hallo\n");
  // LASER's folder as finetune.data_dir: not "run download_data.sh", but "it is the gold_dir".
  EXPECT_TRUE(contains_all(error_message([&] { read_tatoeba_xtreme(dir / "v1", "de"); }),
                           {"finetune.data_dir '" + (dir / "v1") + "' holds LASER's Tatoeba files",
                            "set finetune.gold_dir to it"}));
  // A missing .eng file: finetune.gold_dir must hold it.
  EXPECT_TRUE(contains_all(error_message([&] { read_tatoeba_laser(dir / "v1", "de"); }),
                           {dir / "v1/tatoeba.deu-eng.eng", "not found",
                            "finetune.gold_dir must be LASER's data/tatoeba/v1 folder"}));
  // XTREME's download as finetune.gold_dir: that is the data folder.
  write_file(dir / "download/tatoeba/de-en.de", "Hallo\n");
  EXPECT_TRUE(contains_all(error_message([&] { read_tatoeba_laser(dir / "download", "de"); }),
                           {"is XTREME's download folder", "that is finetune.data_dir"}));
  EXPECT_TRUE(contains_all(error_message([&] { read_tatoeba_xtreme(dir / "nowhere", "de"); }),
                           {"tatoeba/de-en.de", "download_data.sh", "finetune.gold_dir"}));
}

}  // namespace
}  // namespace xlme::finetune
