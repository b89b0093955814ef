// xlme-finetune end to end on fixtures in each task's on-disk format (XTREME's processed layout
// and the upstream gold files), from a tiny pre-training checkpoint: every task trains or
// probes, scores with its official metric and writes its submission files.
#include "xlme/finetune/finetune.h"
#include "xlme/finetune/retrieval_io.h"

#include "export_fixtures.h"
#include "test_util.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

namespace xlme::finetune {
namespace {

namespace fs = std::filesystem;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// One tiny checkpoint for the whole suite (training a tokenizer takes a moment).
class FinetuneTasks : public xlme::testing::TinyCheckpointSuite<FinetuneTasks> {
 protected:
  // A config for `task` reading fixtures under the test's folder.
  config::Config config_for(const std::string& task, std::vector<std::string> sets) {
    sets.insert(sets.begin(),
                {"finetune.task=" + task, "finetune.init=" + checkpoint(),
                 "finetune.data_dir=" + (data_.path() / "download").string(),
                 "finetune.gold_dir=" + (data_.path() / "gold").string(),
                 "run.out_dir=" + (data_.path() / "out").string(), "run.device=cpu",
                 "finetune.max_len=64", "finetune.dropout=0", "finetune.eval_batch_size=16"});
    return config::load_config("", sets);
  }

  nlohmann::json run(const config::Config& c) {
    EXPECT_EQ(run_finetune(c), 0);
    return nlohmann::json::parse(read_file(data_.path() / "out" / "results.json"));
  }

  std::string file(const std::string& relative) const { return (data_.path() / relative).string(); }

  // run_finetune(c) that must fail: its error message and everything it logged.
  static std::pair<std::string, std::string> failed_run(const config::Config& c) {
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    const auto error = error_message([&] { run_finetune(c); });
    spdlog::default_logger()->sinks().pop_back();
    return {error, log.str()};
  }

  // run_finetune(c), which must succeed: everything it logged.
  static std::string logged_run(const config::Config& c) {
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    int code = -1;
    try {
      code = run_finetune(c);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
    spdlog::default_logger()->sinks().pop_back();
    EXPECT_EQ(code, 0);
    return log.str();
  }

  TempDir data_;
};

// Sentences of random lowercase words, reproducible.
std::vector<std::string> random_words(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out(count);
  for (auto& word : out) {
    for (unsigned n = 3 + rng() % 4; n > 0; --n) word += static_cast<char>('a' + rng() % 26);
  }
  return out;
}

std::string join(const std::vector<std::string>& words, size_t first, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) out += (i ? " " : "") + words[(first + i) % words.size()];
  return out;
}

// XNLI with a learnable rule: the hypothesis's last word names the label. CRLF lines and one
// field with doubled quotes, as XTREME's csv.writer writes them.
std::string xnli_rows(size_t count, unsigned seed, bool labels) {
  const auto words = random_words(40, seed);
  const char* cue[] = {"zzno", "zzyes", "zzmaybe"};
  const char* label[] = {"contradiction", "entailment", "neutral"};
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    std::string premise = join(words, i * 3, 5);
    if (i == 0) premise = "\"\"\"" + premise + "\"\" said\"";
    out += premise + "\t" + join(words, i * 7, 3) + " " + cue[i % 3];
    if (labels) out += std::string("\t") + label[i % 3];
    out += "\r\n";
  }
  return out;
}

TEST_F(FinetuneTasks, XnliTrainsSelectsOnEnglishDevAndScoresUpstreamGold) {
  write_file(file("download/xnli/train-en.tsv"), xnli_rows(60, 1, true));
  write_file(file("download/xnli/dev-en.tsv"), xnli_rows(30, 2, true));
  write_file(file("download/xnli/dev-de.tsv"), xnli_rows(30, 3, true));
  // XTREME's test files are the gold's pairs without labels (written with csv.writer's quoting).
  write_file(file("download/xnli/test-de.tsv"), xnli_rows(30, 6, false));
  write_file(file("download/xnli/test-en.tsv"), xnli_rows(30, 6, false));
  // Upstream XNLI-1.0: header; 0 language, 1 gold_label, 6 sentence1, 7 sentence2; no quoting.
  auto unquoted = [](std::string field) {
    if (field.size() < 2 || field.front() != '"') return field;
    field = field.substr(1, field.size() - 2);
    for (size_t q = field.find("\"\""); q != std::string::npos; q = field.find("\"\"", q + 1)) {
      field.erase(q, 1);
    }
    return field;
  };
  std::string gold = "language\tgold_label\ta\tb\tc\td\tsentence1\tsentence2\n";
  for (const char* language : {"de", "en"}) {
    std::istringstream rows(xnli_rows(30, 6, true));
    for (std::string row; std::getline(rows, row);) {
      row.pop_back();  // \r
      const auto a = row.find('\t'), b = row.find('\t', a + 1);
      gold += std::string(language) + "\t" + row.substr(b + 1) + "\t.\t.\t.\t.\t" +
              unquoted(row.substr(0, a)) + "\t" + row.substr(a + 1, b - a - 1) + "\n";
    }
  }
  write_file(file("gold/XNLI-1.0/xnli.test.tsv"), gold);
  auto json = run(config_for(
      "xnli", {"finetune.languages=[en, de]", "finetune.epochs=25", "finetune.batch_size=8",
               "finetune.lr=2e-3", "finetune.eval_every=30", "finetune.seeds=[1, 2]"}));
  EXPECT_EQ(json["seeds"], nlohmann::json::parse("[1, 2]"));
  EXPECT_EQ(json["test"]["main"], "accuracy");
  // The rule is learnt: well above chance (33) on held-out English dev and on the gold test.
  EXPECT_GT(json["dev"]["languages"]["en"]["accuracy"]["mean"].get<double>(), 60.0) << json.dump();
  EXPECT_GT(json["test"]["languages"]["de"]["accuracy"]["mean"].get<double>(), 60.0) << json.dump();
  // Dev is checked every 30 steps and at the last one; the kept step is one of those.
  ASSERT_EQ(json["selection"].size(), 2u);
  const auto kept = json["selection"][0]["kept_step"].get<int64_t>();
  EXPECT_TRUE(kept % 30 == 0 || kept == json["selection"][0]["steps"].get<int64_t>())
      << json["selection"].dump();
  // Submission layout per seed: one label per line.
  const auto predictions = read_file(data_.path() / "out/seed1/predictions/xnli/test-de.tsv");
  std::istringstream lines(predictions);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    EXPECT_TRUE(line == "entailment" || line == "contradiction" || line == "neutral") << line;
  }
  EXPECT_EQ(count, 30);
}

TEST_F(FinetuneTasks, TaggingTasksScoreSeqevalOnProcessedAndUpstreamGold) {
  // Each word has a fixed tag; sentences of 6 words.
  const auto words = random_words(30, 9);
  const char* pos[] = {"NOUN", "VERB", "DET"};
  auto conll = [&](size_t sentences, unsigned seed, bool tags, const std::string& prefix) {
    std::mt19937 rng(seed);
    std::string out;
    for (size_t s = 0; s < sentences; ++s) {
      for (int w = 0; w < 6; ++w) {
        const size_t k = rng() % words.size();
        out += prefix + words[k] + (tags ? std::string("\t") + pos[k % 3] : "") + "\n";
      }
      out += "\n";
    }
    return out;
  };
  write_file(file("download/udpos/train-en.tsv"), conll(40, 1, true, ""));
  write_file(file("download/udpos/dev-en.tsv"), conll(10, 2, true, ""));
  // UD gold: a CoNLL-U file of the same sentences' kind; XTREME's test file holds its words.
  std::string conllu, test_words;
  std::mt19937 rng(4);
  for (int s = 0; s < 10; ++s) {
    conllu += "# sent_id = " + std::to_string(s) + "\n";
    test_words += s ? "\n" : "";
    for (int w = 0; w < 6; ++w) {
      const size_t k = rng() % words.size();
      conllu += std::to_string(w + 1) + "\t" + words[k] + "\t_\t" + pos[k % 3] + "\t_\t_\t" +
                (w ? "1" : "0") + "\t" + (w ? "dep" : "root") + "\t_\t_\n";
      test_words += words[k] + "\n";
    }
    conllu += "\n";
  }
  write_file(file("gold/UD_English-X/en_x-ud-test.conllu"), conllu);
  write_file(file("download/udpos/test-en.tsv"), test_words);
  auto json = run(config_for("udpos", {"finetune.languages=[en]", "finetune.epochs=60",
                                       "finetune.batch_size=8", "finetune.lr=5e-3"}));
  EXPECT_EQ(json["test"]["main"], "f1");
  // Chance is 1/3 (10 words per tag). Tags are predicted at each word's first piece, which the
  // tiny tokenizer shares between several of the random words, so even a perfect tagger stays
  // well below 100%: 48 and 55 on two tiny checkpoints that differ only in random draws, above
  // 60 on an earlier one.
  EXPECT_GT(json["dev"]["languages"]["en"]["token_accuracy"]["mean"].get<double>(), 42.0)
      << json.dump();
  EXPECT_TRUE(json["test"]["languages"]["en"].contains("f1"));
  const auto tags = read_file(data_.path() / "out/predictions/udpos/test-en.tsv");
  EXPECT_EQ(std::count(tags.begin(), tags.end(), '\n'), 10 * 7 - 1);  // blank line between

  // PAN-X: processed train/dev, the raw `lang:token` test gold.
  const char* ner[] = {"B-PER", "O", "B-LOC"};
  auto panx = [&](size_t sentences, unsigned seed, const std::string& prefix) {
    std::mt19937 r(seed);
    std::string out;
    for (size_t s = 0; s < sentences; ++s) {
      for (int w = 0; w < 5; ++w) {
        const size_t k = r() % words.size();
        out += prefix + words[k] + "\t" + ner[k % 3] + "\n";
      }
      out += "\n";
    }
    return out;
  };
  write_file(file("download/panx/train-en.tsv"), panx(40, 5, ""));
  write_file(file("download/panx/dev-en.tsv"), panx(10, 6, ""));
  write_file(file("gold/en/test"), panx(10, 7, "en:"));
  json = run(config_for("panx", {"finetune.languages=[en]", "finetune.epochs=60",
                                 "finetune.batch_size=8", "finetune.lr=5e-3"}));
  EXPECT_GT(json["dev"]["languages"]["en"]["f1"]["mean"].get<double>(), 50.0) << json.dump();
  EXPECT_TRUE(json["test"]["languages"]["en"].contains("precision"));
}

// SQuAD-format JSON: each context holds the answer word after "zzans".
std::string squad_json(size_t questions, unsigned seed, bool blank) {
  const auto words = random_words(50, seed);
  nlohmann::json data = {{"version", "1.1"}, {"data", nlohmann::json::array()}};
  nlohmann::json paragraphs = nlohmann::json::array();
  for (size_t i = 0; i < questions; ++i) {
    const std::string before = join(words, i * 5, 4) + " zzans ";
    const std::string answer = words[(i * 11 + 3) % words.size()];
    const std::string context = before + answer + " " + join(words, i * 13, 5);
    nlohmann::json answers = nlohmann::json::array();
    answers.push_back(blank ? nlohmann::json{{"text", ""}, {"answer_start", 0}}
                            : nlohmann::json{{"text", answer}, {"answer_start", before.size()}});
    paragraphs.push_back({{"context", context},
                          {"qas",
                           {{{"id", "q" + std::to_string(seed) + "_" + std::to_string(i)},
                             {"question", "what follows " + join(words, i, 2)},
                             {"answers", answers}}}}});
  }
  data["data"].push_back({{"title", "t"}, {"paragraphs", paragraphs}});
  return data.dump();
}

TEST_F(FinetuneTasks, QaTrainsOnSquadAndScoresBlankedTestsFromGold) {
  write_file(file("download/squad/train-v1.1.json"), squad_json(60, 1, false));
  write_file(file("download/xquad/xquad.de.json"), squad_json(20, 2, true));
  write_file(file("gold/xquad.de.json"), squad_json(20, 2, false));
  auto json = run(
      config_for("xquad", {"finetune.languages=[de]", "finetune.epochs=20", "finetune.batch_size=8",
                           "finetune.lr=3e-3", "finetune.warmup_steps=10", "finetune.doc_stride=16",
                           "finetune.max_query_len=16", "finetune.select=last"}));
  EXPECT_EQ(json["test"]["main"], "f1");
  const double f1 = json["test"]["languages"]["de"]["f1"]["mean"].get<double>();
  // A random span of these 10-word contexts scores ~5; the cue word is learnt in part.
  EXPECT_GT(f1, 20.0) << json.dump();
  EXPECT_GE(f1, json["test"]["languages"]["de"]["exact_match"]["mean"].get<double>());
  const auto text = read_file(data_.path() / "out/predictions/xquad/test-de.json");
  auto predictions = nlohmann::json::parse(text);
  EXPECT_EQ(predictions.size(), 20u);
  EXPECT_TRUE(predictions.contains("q2_0"));
  // The bytes of write_qa_predictions: sorted keys, indented by 2, a final newline.
  EXPECT_EQ(text, predictions.dump(2) + "\n");
}

TEST_F(FinetuneTasks, RetrievalComparesTrainedAndUntrainedOnEveryLayer) {
  const auto a = random_words(60, 1), b = random_words(60, 2);
  std::string en, de;
  for (size_t i = 0; i < 30; ++i) {
    en += join(a, i * 2, 5) + "\n";
    de += join(b, i * 2, 5) + "\n";
  }
  write_file(file("pairs/en-de.en"), en);
  write_file(file("pairs/en-de.de"), de);
  write_file(file("pairs/en-fr.en"), en);
  write_file(file("pairs/en-fr.fr"), en);  // identical sides: retrieval is exact
  // Fewer than finetune.min_sentences: not scored, and the means say they lack it.
  write_file(file("pairs/en-es.en"), join(a, 0, 5) + "\n" + join(a, 2, 5) + "\n");
  write_file(file("pairs/en-es.es"), join(b, 0, 5) + "\n" + join(b, 2, 5) + "\n");
  auto c = config_for("retrieval", {"finetune.sweep_layers=true", "finetune.compare_untrained=true",
                                    "finetune.layer=1", "finetune.min_sentences=5"});
  c.finetune.data_dir = file("pairs");
  auto json = run(c);
  for (const char* model : {"trained", "untrained"}) {
    const auto& layers = json[model]["layers"];
    EXPECT_EQ(layers.size(), 3u);  // embeddings, layer 1, layer 2
    EXPECT_DOUBLE_EQ(layers["layer 2"]["en-fr"]["accuracy"].get<double>(), 100.0);
    EXPECT_TRUE(layers["layer 1"]["en-de"].contains("en_to_de"));
    EXPECT_TRUE(layers["layer 1"].contains("mean"));
    EXPECT_FALSE(layers["layer 1"].contains("en-es"));
    EXPECT_EQ(json[model]["coverage"],
              nlohmann::json::parse(R"({"covers": ["en-de", "en-fr"], "lacks": ["en-es"],
                                        "of": 3})"))
        << json[model].dump();
  }
  EXPECT_FALSE(json["trained"].contains("subset"));
  // finetune.max_eval_examples: the log, the console and results.json say the pairs were cut.
  c.finetune.max_eval_examples = 10;
  c.finetune.compare_untrained = false;
  const auto log = logged_run(c);
  EXPECT_TRUE(contains_all(log, {"retrieval en-de: scored 10 of 30 pairs (the first; "
                                 "finetune.max_eval_examples)",
                                 "scored on subsets (finetune.max_eval_examples: en-de 10 of 30 "
                                 "pairs; en-fr 10 of 30 pairs), not comparable",
                                 "mean over 2 of 3; not scored: en-es"}))
      << log;
  json = nlohmann::json::parse(read_file(data_.path() / "out" / "results.json"));
  EXPECT_EQ(json["trained"]["subset"]["languages"]["en-de"],
            nlohmann::json::parse(R"({"scored": 10, "of": 30, "unit": "pair"})"))
      << json["trained"].dump();
  c.finetune.max_eval_examples = 0;
  c.finetune.pairs = {"en-xx"};
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(c); }),
                           {"finetune.pairs names en-xx", "en-xx.<a> and .<b> files"}));
}

TEST_F(FinetuneTasks, TatoebaAndBuccReadXtremesFilesAndScoreUpstreamGold) {
  const auto words = random_words(80, 3);
  std::vector<std::string> lines;
  for (size_t i = 0; i < 20; ++i) lines.push_back(join(words, i * 3, 4));
  std::string xx, en_sorted;
  for (const auto& l : lines) xx += l + "\n";
  auto sorted = lines;
  std::sort(sorted.begin(), sorted.end());
  for (const auto& l : sorted) en_sorted += l + "\n";
  // The same sentences on both sides: nearest neighbours are exact.
  write_file(file("download/tatoeba/de-en.de"), xx);
  write_file(file("download/tatoeba/de-en.en"), en_sorted);
  write_file(file("gold/tatoeba.deu-eng.deu"), xx);
  write_file(file("gold/tatoeba.deu-eng.eng"), xx);
  const auto log =
      logged_run(config_for("tatoeba", {"finetune.languages=[de]", "finetune.layer=2"}));
  EXPECT_TRUE(contains_all(
      log,
      {"tatoeba test de: 20 pairs from the gold '" + file("gold/tatoeba.deu-eng.deu") + "' and '" +
       file("gold/tatoeba.deu-eng.eng") + "', the same as XTREME's test files '" +
       file("download/tatoeba/de-en.de") + "' and '" + file("download/tatoeba/de-en.en") + "'"}))
      << log;
  auto json = nlohmann::json::parse(read_file(data_.path() / "out" / "results.json"));
  const auto& de = json["trained"]["layers"]["layer 2"]["de"];
  EXPECT_DOUBLE_EQ(de["accuracy"].get<double>(), 100.0);
  EXPECT_TRUE(de.contains("en_to_xx") && de.contains("xx_to_en")) << de.dump();
  // The leaderboard's order: line k answers the k-th line of the sorted English file, here
  // LASER's line order[k], whose translation is xx line order[k].
  std::string leaderboard;
  for (const int64_t line : tatoeba_sorted_order(lines)) leaderboard += std::to_string(line) + "\n";
  EXPECT_EQ(read_file(data_.path() / "out/predictions/tatoeba/test-de.tsv"), leaderboard);
  // The gold cut by a line: an error naming both files and where they part, not a shorter
  // submission that XTREME's evaluate.py refuses.
  std::string cut;
  for (size_t i = 0; i + 1 < lines.size(); ++i) cut += lines[i] + "\n";
  write_file(file("gold/tatoeba.deu-eng.deu"), cut);
  write_file(file("gold/tatoeba.deu-eng.eng"), cut);
  const auto error =
      failed_run(config_for("tatoeba", {"finetune.languages=[de]", "finetune.layer=2"})).first;
  EXPECT_TRUE(
      contains_all(error, {"tatoeba test set of de: the test file '" +
                               file("download/tatoeba/de-en.de") + "' (20 lines)",
                           "the gold '" + file("gold/tatoeba.deu-eng.deu") + "' (19 lines) differ",
                           "after 19 lines the gold ends; the test file goes on at " +
                               file("download/tatoeba/de-en.de") + ":20"}))
      << error;
  write_file(file("gold/tatoeba.deu-eng.deu"), xx);
  write_file(file("gold/tatoeba.deu-eng.eng"), xx);
  // XTREME's copy (English sorted, no gold) gives the same submission.
  auto copy = config_for("tatoeba", {"finetune.languages=[de]", "finetune.layer=2"});
  copy.finetune.gold_dir.clear();
  run(copy);
  EXPECT_EQ(read_file(data_.path() / "out/predictions/tatoeba/test-de.tsv"), leaderboard);
  // The recorded config is the model loaded (32 wide), not the config's default (768).
  EXPECT_NE(json["config"].get<std::string>().find("hidden_size: 32"), std::string::npos)
      << json["config"];

  // XTREME's headline is en -> xx, not the mean of both directions. Three planted pairs make the
  // directions differ: English i = W (4 new words), English i+1 = W + w5, German i = W + w5 + w6,
  // German i+1 = 4 unrelated words. English i finds German i (the only German line sharing W),
  // German i finds English i+1 (sharing one more word): en -> xx gains what xx -> en loses.
  const auto other = random_words(60, 17);
  auto en_side = lines, xx_side = lines;
  for (size_t k = 0; k < 3; ++k) {
    const size_t i = 6 * k + 1, first = 20 * k;
    en_side[i] = join(other, first, 4);
    en_side[i + 1] = join(other, first, 5);
    xx_side[i] = join(other, first, 6);
    xx_side[i + 1] = join(other, first + 10, 4);
  }
  std::string en_text, xx_text;
  for (size_t i = 0; i < lines.size(); ++i) {
    en_text += en_side[i] + "\n";
    xx_text += xx_side[i] + "\n";
  }
  write_file(file("gold/tatoeba.deu-eng.eng"), en_text);
  write_file(file("gold/tatoeba.deu-eng.deu"), xx_text);
  // The gold alone (XTREME's copy holds the other sentences).
  fs::remove_all(data_.path() / "download/tatoeba");
  json = run(config_for("tatoeba", {"finetune.languages=[de]", "finetune.layer=2"}));
  const auto& asymmetric = json["trained"]["layers"]["layer 2"]["de"];
  EXPECT_GT(asymmetric["en_to_xx"].get<double>(), asymmetric["xx_to_en"].get<double>())
      << asymmetric.dump();
  EXPECT_DOUBLE_EQ(asymmetric["accuracy"].get<double>(), asymmetric["en_to_xx"].get<double>());

  // BUCC: ids, the dev gold to tune the threshold, the test gold from upstream.
  for (const char* split : {"dev", "test"}) {
    std::string de_side, en_side, gold;
    for (size_t i = 0; i < 12; ++i) {
      const auto id = std::to_string(i);
      de_side += std::string("de-") + split + id + "\t" + lines[i] + "\n";
      en_side += std::string("en-") + split + id + "\t" + lines[i] + "\n";
      if (i < 6) gold += std::string("de-") + split + id + "\ten-" + split + id + "\n";
    }
    const std::string dir = std::string(split) == "dev" ? "download/bucc2018/" : "gold/bucc2018/";
    write_file(file(dir + "de-en." + split + ".de"), de_side);
    write_file(file(dir + "de-en." + split + ".en"), en_side);
    write_file(file(dir + "de-en." + split + ".gold"), gold);
  }
  json = run(config_for("bucc", {"finetune.languages=[de]", "finetune.layer=2"}));
  const auto& scores = json["trained"]["layers"]["layer 2"]["de"];
  EXPECT_TRUE(scores.contains("f1") && scores.contains("threshold")) << json.dump();
  EXPECT_GT(scores["recall"].get<double>(), 0.0);
  EXPECT_TRUE(fs::exists(data_.path() / "out/predictions/bucc/test-de.tsv"));
}

TEST_F(FinetuneTasks, AlignmentProbeReportsAer) {
  // Identical sentences: the diagonal is the argmax in both directions, so AER is 0.
  write_file(file("align/en-de.en"), "abc defg hij\nklm nop\n");
  write_file(file("align/en-de.de"), "abc defg hij\nklm nop\n");
  write_file(file("align/en-de.gold"), "0-0 1-1 2p2\n0-0 1-1\n");
  auto c = config_for("alignment", {"finetune.layer=0"});
  c.finetune.data_dir = file("align");
  auto json = run(c);
  EXPECT_DOUBLE_EQ(json["trained"]["layers"]["layer 0"]["en-de"]["aer"].get<double>(), 0.0);
}

// Every configured dev, test and gold file is read before the first step: a damaged or missing one
// stops the run at once (no "step" line was logged), naming the file.
TEST_F(FinetuneTasks, EvaluationFilesAreReadBeforeTraining) {
  const std::string tagged = "a\tNOUN\nb\tVERB\n\nc\tDET\n";
  write_file(file("download/udpos/train-en.tsv"), tagged);
  write_file(file("download/udpos/dev-en.tsv"), tagged);
  write_file(
      file("gold/UD_German-X/de_x-ud-test.conllu"),
      "# sent_id = 1\n1\tJa\tja\tINTJ\t_\t_\t0\troot\t_\t_\n2\tnein\tnein\tINTJX\t_\t_\t1\t_\t_"
      "\t_\n\n");
  auto [error, log] = failed_run(config_for(
      "udpos", {"finetune.languages=[de]", "finetune.max_steps=1", "finetune.select=last"}));
  EXPECT_TRUE(
      contains_all(error, {file("gold/UD_German-X/de_x-ud-test.conllu") + ":3", "'INTJX'"}));
  EXPECT_EQ(log.find("step 1/1"), std::string::npos) << log;

  // QA: a truncated gold JSON; with finetune.gold_dir the answer-stripped copy is not needed.
  write_file(file("download/squad/train-v1.1.json"), squad_json(8, 1, false));
  const auto gold = squad_json(6, 2, false);
  write_file(file("gold/xquad.de.json"), gold.substr(0, gold.size() / 2));
  auto qa = config_for("xquad",
                       {"finetune.languages=[de]", "finetune.max_steps=1", "finetune.select=last",
                        "finetune.doc_stride=16", "finetune.max_query_len=16"});
  std::tie(error, log) = failed_run(qa);
  EXPECT_TRUE(contains_all(error, {"SQuAD-format file '" + file("gold/xquad.de.json") + "'",
                                   "is not valid JSON", "line 1"}));
  EXPECT_EQ(log.find("step 1/1"), std::string::npos) << log;
  write_file(file("gold/xquad.de.json"), gold);
  EXPECT_FALSE(fs::exists(file("download/xquad/xquad.de.json")));
  EXPECT_TRUE(run(qa)["test"]["languages"]["de"].contains("f1"));
  // Without gold_dir the answer-stripped copy is the test set: missing, it stops the run first.
  qa.finetune.gold_dir.clear();
  std::tie(error, log) = failed_run(qa);
  EXPECT_TRUE(contains_all(
      error, {"finetune.languages names de", file("download/xquad/xquad.de.json"), "not found"}));
  EXPECT_EQ(log.find("step 1/1"), std::string::npos) << log;
}

// Model selection reads the train language's dev set only when it is evaluated.
TEST_F(FinetuneTasks, SelectionNamesTheMissingTrainLanguage) {
  const std::string tagged = "a\tNOUN\nb\tVERB\n";
  for (const char* name : {"train-en", "dev-en", "test-en", "dev-de", "test-de"}) {
    write_file(file(std::string("download/udpos/") + name + ".tsv"), tagged);
  }
  auto c = config_for("udpos", {"finetune.languages=[de]", "finetune.max_steps=1"});
  c.finetune.gold_dir.clear();
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(c); }),
                           {"finetune.languages [de] does not name en",
                            "add en to finetune.languages or set finetune.select: last"}));
  c.finetune.languages = {"de", "en"};
  EXPECT_EQ(run_finetune(c), 0);
}

// xlme-data xtreme writes the layout xlme-finetune reads.
TEST_F(FinetuneTasks, XtremeCommandConvertsUdReleases) {
  write_file(file("ud/UD_English-A/en_a-ud-train.conllu"),
             "# text = We're here\n1-2\tWe're\t_\t_\t_\t_\t_\t_\t_\t_\n"
             "1\tWe\twe\tPRON\t_\t_\t3\tnsubj\t_\t_\n2\t're\tbe\tAUX\t_\t_\t3\tcop\t_\t_\n"
             "3\there\there\tADV\t_\t_\t0\troot\t_\t_\n\n");
  const auto r =
      xlme::testing::run_tool("xlme-data", {"xtreme", "--task", "udpos", "--input", file("ud"),
                                            "--out", file("download"), "--languages", "en,de"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(file("download/udpos/train-en.tsv")), "We're\tPRON\nhere\tADV\n");
  EXPECT_TRUE(contains_all(r.out + r.err, {"1 sentences -> " + file("download/udpos/train-en.tsv"),
                                           "finetune.data_dir=" + file("download")}));
  const auto bad = xlme::testing::run_tool(
      "xlme-data", {"xtreme", "--task", "panx", "--input", file("nowhere"), "--out", file("o")});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains_all(bad.out + bad.err, {file("nowhere"), "does not exist"}));
}

// VECO plug-in: a VECO checkpoint fine-tunes on sentence pairs with each sentence cross-attending
// to the other; plug-in is refused for a task without sentence pairs and for a model without
// cross-attention.
TEST_F(FinetuneTasks, VecoPlugInTrainsSentencePairsAndIsRefusedElsewhere) {
  write_file(file("download/xnli/train-en.tsv"), xnli_rows(60, 1, true));
  write_file(file("download/xnli/dev-en.tsv"), xnli_rows(30, 2, true));
  write_file(file("download/xnli/test-en.tsv"), xnli_rows(30, 5, true));
  const auto veco = xlme::testing::make_tiny_checkpoint(
      xlme::testing::tiny_export_config(tokenizer(),
                                        {"objectives.set=veco", "model.cross_attention=true"}),
      file("veco"));
  auto c = config_for(
      "xnli", {"finetune.languages=[en]", "finetune.epochs=25", "finetune.batch_size=8",
               "finetune.lr=2e-3", "finetune.eval_every=30", "finetune.cross_attention=plug-in"});
  c.finetune.init = veco.path;
  c.finetune.gold_dir = "";
  const auto json = run(c);
  EXPECT_GT(json["dev"]["languages"]["en"]["accuracy"]["mean"].get<double>(), 50.0) << json.dump();
  EXPECT_GT(json["test"]["languages"]["en"]["accuracy"]["mean"].get<double>(), 50.0) << json.dump();
  // results.json records the model as loaded: with its cross-attention.
  EXPECT_NE(json["config"].get<std::string>().find("cross_attention: true"), std::string::npos);

  auto tagging = config_for("udpos", {"finetune.cross_attention=plug-in"});
  tagging.finetune.init = veco.path;
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(tagging); }),
                           {"finetune.cross_attention=plug-in",
                            "finetune.task=udpos has no "
                            "sentence pairs",
                            "use finetune.cross_attention=plug-out"}));
  auto plain = config_for("xnli", {"finetune.cross_attention=plug-in"});
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(plain); }),
                           {checkpoint(), "has no cross-attention to plug in",
                            "objectives.set=xlme", "finetune.cross_attention=plug-out"}));
}

TEST_F(FinetuneTasks, InitMustNameAModel) {
  auto c = config_for("xnli", {});
  c.finetune.init = "";
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(c); }),
                           {"finetune.init is empty", "run folder"}));
  c.finetune.init = file("nowhere");
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(c); }), {"nowhere", "does not exist"}));
}

// A CoNLL-U file of `sentences` (words of one sentence separated by spaces) tagged NOUN.
std::string conllu_of(const std::vector<std::string>& sentences) {
  std::string out;
  for (const auto& sentence : sentences) {
    std::istringstream words(sentence);
    int id = 0;
    for (std::string w; words >> w;) {
      ++id;
      out += std::to_string(id) + "\t" + w + "\t_\tNOUN\t_\t_\t" + (id > 1 ? "1" : "0") +
             "\t_\t_\t_\n";
    }
    out += "\n";
  }
  return out;
}

// With finetune.gold_dir the test set comes from the gold; XTREME's test file, when there, must
// hold the same examples (a gold cut short is not scored as a subset without a word); a
// gold file alone is allowed; the log says which file(s) each set came from.
TEST_F(FinetuneTasks, TestFileAndGoldAreMatchedAndTheSourceIsLogged) {
  const std::string tagged = "a\tNOUN\nb\tVERB\n\nc\tDET\n";
  write_file(file("download/udpos/train-en.tsv"), tagged);
  write_file(file("download/udpos/dev-en.tsv"), tagged);
  const std::string test = file("download/udpos/test-en.tsv");
  const std::string gold = file("gold/UD_English-X/en_x-ud-test.conllu");
  write_file(test, "Ich\nbin\n\nda\n\nJa\n");
  write_file(gold, conllu_of({"Ich bin", "da", "Ja"}));
  auto c = config_for("udpos",
                      {"finetune.languages=[en]", "finetune.max_steps=1", "finetune.select=last"});
  auto log = logged_run(c);
  EXPECT_TRUE(
      contains_all(log, {"udpos test en: 3 sentences from the gold '" + gold +
                             "', the same words as the test file '" + test +
                             "'; the tags' release not checked: the gold folder has no dev set "
                             "of en to compare",
                         "udpos dev en: 2 sentences from '" + file("download/udpos/dev-en.tsv")}))
      << log;
  // The gold cut at a sentence boundary: an error naming both files and where they part.
  write_file(gold, conllu_of({"Ich bin", "da"}));
  auto [error, failed_log] = failed_run(c);
  EXPECT_TRUE(contains_all(
      error, {"udpos test set of en: the test file '" + test + "' (3 sentences) and the gold '" +
                  gold + "' (2 sentences) differ",
              "after 2 sentences the gold ends; the test file goes on at " + test + ":6"}))
      << error;
  EXPECT_EQ(failed_log.find("step 1/1"), std::string::npos) << failed_log;
  // A word that differs.
  write_file(gold, conllu_of({"Ich bin", "do", "Ja"}));
  std::tie(error, failed_log) = failed_run(c);
  EXPECT_TRUE(contains_all(error, {"sentence 2 (" + test + ":4; gold " + gold + ":4)",
                                   "word 1 is 'da' in the test file and 'do' in the gold"}))
      << error;
  // The gold alone is used, and said.
  std::filesystem::remove(test);
  log = logged_run(c);
  EXPECT_TRUE(contains_all(log, {"udpos test en: 3 sentences from the gold '" + gold + "' alone"}))
      << log;

  // QA: the gold lacks a question of XTREME's answer-stripped test file.
  write_file(file("download/squad/train-v1.1.json"), squad_json(8, 1, false));
  write_file(file("download/xquad/xquad.de.json"), squad_json(6, 2, true));
  write_file(file("gold/xquad.de.json"), squad_json(5, 2, false));
  auto qa = config_for("xquad",
                       {"finetune.languages=[de]", "finetune.max_steps=1", "finetune.select=last",
                        "finetune.doc_stride=16", "finetune.max_query_len=16"});
  std::tie(error, failed_log) = failed_run(qa);
  EXPECT_TRUE(contains_all(error, {"xquad test set of de: the test file '" +
                                       file("download/xquad/xquad.de.json") + "' (6 questions)",
                                   "the gold '" + file("gold/xquad.de.json") + "' (5 questions)",
                                   "after 5 questions the gold ends"}))
      << error;
  write_file(file("gold/xquad.de.json"), squad_json(6, 2, false));
  log = logged_run(qa);
  EXPECT_TRUE(
      contains_all(log, {"xquad test de: 6 questions from the gold", "the same as the test file"}))
      << log;
}

// Without finetune.languages, the languages without data are skipped at info level with
// the file each lacked; the summary says what its average covers; a test set without gold is
// said to be predicted but not scored, and why.
TEST_F(FinetuneTasks, SummarySaysWhatTheAverageCoversAndWhatWasNotScored) {
  const std::string tagged = "a\tNOUN\nb\tVERB\n\nc\tDET\n";
  write_file(file("download/udpos/train-en.tsv"), tagged);
  write_file(file("download/udpos/dev-en.tsv"), tagged);
  write_file(file("download/udpos/test-en.tsv"), "a\nb\n");
  write_file(file("download/udpos/test-de.tsv"), "a\nb\n");
  auto c = config_for("udpos", {"finetune.max_steps=1", "finetune.select=last"});
  c.finetune.gold_dir.clear();
  const auto log = logged_run(c);
  EXPECT_TRUE(contains_all(
      log, {"[info] udpos test af: skipped, no data: udpos test split for language 'af': '" +
                file("download/udpos/test-af.tsv") + "' does not exist",
            "[info] udpos dev de: skipped, no data:",
            "test: predictions for de en written but not scored: XTREME's test files carry no "
            "labels and finetune.gold_dir is not set",
            file("out/predictions"), "over 1 of 33 languages; no data for: af ar bg de el es"}))
      << log;
  // The skipped language's remedy is not repeated 31 times.
  EXPECT_EQ(log.find("xlme-data xtreme"), std::string::npos) << log;

  // With gold for en only: the test average covers 1 of 33 languages, and says so.
  write_file(file("gold/UD_English-X/en_x-ud-test.conllu"), conllu_of({"a b"}));
  const auto scored =
      logged_run(config_for("udpos", {"finetune.max_steps=1", "finetune.select=last"}));
  EXPECT_TRUE(
      contains_all(scored, {"test f1 per language:", "over 1 of 33 languages; no data for: af"}))
      << scored;
  // results.json records what each average covers and lacks.
  auto json = nlohmann::json::parse(read_file(data_.path() / "out" / "results.json"));
  const auto& average = json["test"]["average"];
  EXPECT_EQ(average["covers"], nlohmann::json::parse(R"(["en"])")) << average.dump();
  EXPECT_EQ(average["of"], 33) << average.dump();
  ASSERT_EQ(average["lacks"].size(), 32u) << average.dump();
  EXPECT_EQ(average["lacks"][0], "af");
  EXPECT_EQ(json["dev"]["average"]["covers"], nlohmann::json::parse(R"(["en"])"));
  EXPECT_FALSE(json["test"].contains("subset")) << json["test"].dump();

  // finetune.max_eval_examples: the log, the summary and results.json say what was scored.
  const auto subset = logged_run(config_for(
      "udpos", {"finetune.max_steps=1", "finetune.select=last", "finetune.max_eval_examples=1"}));
  EXPECT_TRUE(contains_all(subset, {"udpos dev en: scored 1 of 2 sentences (the first; "
                                    "finetune.max_eval_examples)",
                                    "dev f1 per language:", " (scored 1 of 2 sentences)\n",
                                    "on subsets (finetune.max_eval_examples), not comparable"}))
      << subset;
  json = nlohmann::json::parse(read_file(data_.path() / "out" / "results.json"));
  EXPECT_EQ(json["dev"]["subset"], nlohmann::json::parse(R"({"max_eval_examples": 1,
      "languages": {"en": {"scored": 1, "of": 2, "unit": "sentence"}}})"))
      << json["dev"].dump();
  EXPECT_FALSE(json["test"].contains("subset")) << json["test"].dump();
}

// A UD gold of another release with the same words but other tags passes the test-file check
// (XTREME's test file holds words only); the release is checked on the dev set, words and tags.
TEST_F(FinetuneTasks, UdGoldOfAnotherReleaseIsRefusedByItsDevTags) {
  write_file(file("download/udpos/train-en.tsv"), "a\tNOUN\nb\tVERB\n\nc\tDET\n");
  const std::string dev = file("download/udpos/dev-en.tsv");
  write_file(dev, "Ich\tPRON\nbin\tAUX\n\nda\tADV\n");
  write_file(file("download/udpos/test-en.tsv"), "Ja\n");
  const std::string gold_dev = file("gold/UD_English-X/en_x-ud-dev.conllu");
  write_file(file("gold/UD_English-X/en_x-ud-test.conllu"), conllu_of({"Ja"}));
  auto conllu = [](const std::vector<std::pair<std::string, std::string>>& words) {
    std::string out;
    for (size_t i = 0; i < words.size(); ++i) {
      out += std::to_string(i + 1) + "\t" + words[i].first + "\t_\t" + words[i].second +
             "\t_\t_\t" + (i ? "1" : "0") + "\t_\t_\t_\n";
    }
    return out + "\n";
  };
  // The same release: accepted, and the log says what was compared.
  write_file(gold_dev, conllu({{"Ich", "PRON"}, {"bin", "AUX"}}) + conllu({{"da", "ADV"}}));
  auto c = config_for("udpos",
                      {"finetune.languages=[en]", "finetune.max_steps=1", "finetune.select=last"});
  const auto log = logged_run(c);
  EXPECT_TRUE(contains_all(log, {"the same words as the test file",
                                 "; the gold's release checked: its dev set '" + gold_dev +
                                     "' (words and tags) is '" + dev + "'"}))
      << log;
  // Another release: the words agree, one tag changed (AUX -> VERB).
  write_file(gold_dev, conllu({{"Ich", "PRON"}, {"bin", "VERB"}}) + conllu({{"da", "ADV"}}));
  const auto [error, failed_log] = failed_run(c);
  EXPECT_TRUE(contains_all(
      error, {"udpos test set of en: the gold's release, checked on its dev set: the dev file '" +
                  dev + "' (2 sentences) and the gold '" + gold_dev + "' (2 sentences) differ",
              "sentence 1 (" + dev + ":1; gold " + gold_dev + ":1)",
              "word/tag 2 is 'bin/AUX' in the dev file and 'bin/VERB' in the gold",
              "of the same release"}))
      << error;
  EXPECT_EQ(failed_log.find("step 1/1"), std::string::npos) << failed_log;
}

// xlme-data xtreme refuses an empty download instead of writing the other files, and
// fine-tuning's message for the missing training file says how to write it.
TEST_F(FinetuneTasks, XtremeCommandRefusesEmptyInputsAndMessagesSayWhatToDo) {
  write_file(file("ud/UD_English-A/en_a-ud-train.conllu"), "");
  write_file(file("ud/UD_English-A/en_a-ud-dev.conllu"),
             "1\there\there\tADV\t_\t_\t0\troot\t_\t_\n\n");
  const auto r = xlme::testing::run_tool(
      "xlme-data", {"xtreme", "--task", "udpos", "--input", file("ud"), "--out", file("download")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.out + r.err,
                           {file("ud/UD_English-A/en_a-ud-train.conllu"), "is empty (0 bytes)"}))
      << r.out << r.err;
  EXPECT_EQ((r.out + r.err).find("wrote"), std::string::npos) << r.out << r.err;
  auto c = config_for("udpos", {"finetune.languages=[en]"});
  const auto error = failed_run(c).first;
  EXPECT_TRUE(
      contains_all(error, {file("download/udpos/train-en.tsv"),
                           "xlme-data xtreme --task udpos --input", "--out " + file("download")}))
      << error;
  EXPECT_EQ(error.find("drop"), std::string::npos) << error;
}

// The QA training and dev files are config keys (XTREME's paths when empty), and a
// warm-up longer than the run is a warning with both numbers.
TEST_F(FinetuneTasks, QaTrainAndDevFilesAreConfigKeys) {
  write_file(file("download/mine/train.json"), squad_json(8, 1, false));
  write_file(file("download/mine/dev.json"), squad_json(6, 3, false));
  write_file(file("gold/xquad.de.json"), squad_json(6, 2, false));
  auto c = config_for(
      "xquad", {"finetune.languages=[de]", "finetune.max_steps=2", "finetune.doc_stride=16",
                "finetune.max_query_len=16", "finetune.select=last", "finetune.warmup_steps=500",
                "finetune.train_file=mine/train.json",
                "finetune.dev_file=" + file("download/mine/dev.json")});
  const auto log = logged_run(c);
  const auto json = nlohmann::json::parse(read_file(data_.path() / "out/results.json"));
  EXPECT_TRUE(json["dev"]["languages"]["en"].contains("f1")) << json.dump();
  EXPECT_TRUE(json["test"]["languages"]["de"].contains("f1")) << json.dump();
  EXPECT_TRUE(contains_all(
      log, {"xquad train: " + file("download/mine/train.json"),
            "xquad dev: en from finetune.dev_file '" + file("download/mine/dev.json") + "'",
            "[warning] the warm-up (500 steps, finetune.warmup_steps 500) is not shorter than "
            "the run (2 steps)",
            // XTREME's schedule keeps the warm-up: the last step runs at 2e-5 * 1 / 500.
            "step 2/2 lr 4e-08"}))
      << log;
  // Without the keys xquad has XTREME's layout: SQuAD's train file, no dev set.
  c.finetune.train_file.clear();
  EXPECT_TRUE(
      contains_all(failed_run(c).first, {file("download/squad/train-v1.1.json"), "not found"}));
  c.finetune.train_file = "nope.json";
  EXPECT_TRUE(contains_all(failed_run(c).first,
                           {"finetune.train_file 'nope.json'", file("download/nope.json"),
                            "does not exist", "under finetune.data_dir",
                            "empty finetune.train_file means XTREME's 'squad/train-v1.1.json'",
                            "fix finetune.train_file, or leave it empty for XTREME's "
                            "'squad/train-v1.1.json'"}));
  // xquad.yaml's own value, XTREME's SQuAD file, missing: the message says it is the default and
  // where SQuAD v1.1 comes from, not to fix the key.
  c.finetune.train_file = "squad/train-v1.1.json";
  auto error = failed_run(c).first;
  EXPECT_TRUE(contains_all(
      error, {"finetune.train_file 'squad/train-v1.1.json'", file("download/squad/train-v1.1.json"),
              "does not exist", "that is finetune.train_file's default, XTREME's file",
              "SQuAD v1.1's train set", "scripts/download_data.sh",
              "https://rajpurkar.github.io/SQuAD-explorer/", "'" + file("download/squad") + "'"}))
      << error;
  EXPECT_EQ(error.find("fix finetune.train_file"), std::string::npos) << error;
  // paper/xquad.yaml's dev_file: SQuAD's dev set (xquad has no dev file of its own).
  c.finetune.train_file = "mine/train.json";
  c.finetune.dev_file = "squad/dev-v1.1.json";
  error = failed_run(c).first;
  EXPECT_TRUE(contains_all(
      error, {"finetune.dev_file 'squad/dev-v1.1.json'", "empty finetune.dev_file means no file",
              "SQuAD v1.1's dev set", "scripts/download_data.sh"}))
      << error;
  EXPECT_EQ(error.find("fix finetune.dev_file"), std::string::npos) << error;
  c.finetune.dev_file.clear();
  auto tagging = config_for("udpos", {"finetune.train_file=x.json"});
  EXPECT_TRUE(contains_all(failed_run(tagging).first,
                           {"finetune.train_file and finetune.dev_file", "udpos reads XTREME's"}));
}

}  // namespace
}  // namespace xlme::finetune
