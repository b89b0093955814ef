#include "xlme/finetune/qa_io.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"
#include "xlme/finetune/text.h"
#include "xlme/finetune/xtreme_io.h"
#include "xtreme_files.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string_view>
#include <unordered_map>

namespace xlme::finetune {

namespace fs = std::filesystem;

// ---- QA ----------------------------------------------------------------------------------------

namespace {

// The `key` of JSON object `j` at JSON path `at`, which must have `type`; throws naming the file,
// the path and the value found otherwise.
const nlohmann::json& qa_field(const nlohmann::json& j, const char* key,
                               nlohmann::json::value_t type, const std::string& path,
                               std::string_view at) {
  XLME_CHECK(j.is_object(),
             "{}: {} is {}, expected an object with '{}'; is this a SQuAD v1.1 "
             "JSON file?",
             path, at, describe_json(j), key);
  const auto it = j.find(key);
  XLME_CHECK(it != j.end(), "{}: {}.{} is missing; is this a SQuAD v1.1 JSON file?", path, at, key);
  const bool ok = type == nlohmann::json::value_t::number_integer ? it->is_number_integer()
                                                                  : it->type() == type;
  XLME_CHECK(ok, "{}: {}.{} is {}, expected {}", path, at, key, describe_json(*it),
             type == nlohmann::json::value_t::number_integer ? "an integer"
             : type == nlohmann::json::value_t::string       ? "a string"
                                                             : "a list");
  return *it;
}

// Where XTREME's scripts and preprocessing put the SQuAD-format file of a dataset's split,
// relative to the download folder, most current name first: {lang} is the language code, {name}
// TyDiQA's English name of the language (a pattern with {name} is skipped for a language without
// one). TyDiQA-GoldP's dev set is XTREME's tydiqa test set.
struct QaLayout {
  const char* dataset;
  const char* split;
  std::vector<const char*> patterns;
};

const std::vector<QaLayout>& qa_layouts() {
  static const std::vector<const char*> tydiqa_dev = {
      "tydiqa/tydiqa-goldp-v1.1-dev/tydiqa.goldp.{lang}.dev.json",
      "tydiqa/tydiqa-goldp-v1.1-dev/tydiqa.{lang}.dev.json",
      "tydiqa/tydiqa-goldp-v1.1-dev/tydiqa-goldp-dev-{name}.json"};
  static const std::vector<QaLayout> layouts = {
      {"squad", "train", {"squad/train-v1.1.json"}},
      {"squad", "dev", {"squad/dev-v1.1.json"}},
      {"xquad", "test", {"xquad/xquad.{lang}.json"}},
      {"mlqa", "dev", {"mlqa/MLQA_V1/dev/dev-context-{lang}-question-{lang}.json"}},
      {"mlqa", "test", {"mlqa/MLQA_V1/test/test-context-{lang}-question-{lang}.json"}},
      {"tydiqa",
       "train",
       {"tydiqa/tydiqa-goldp-v1.1-train/tydiqa.goldp.{lang}.train.json",
        "tydiqa/tydiqa-goldp-v1.1-train/tydiqa.{lang}.train.json"}},
      {"tydiqa", "test", tydiqa_dev},
      {"tydiqa", "dev", tydiqa_dev},
  };
  return layouts;
}

// The candidate paths of `dataset`'s `split` for `lang` (qa_layouts); throws listing the QA
// datasets and their splits for a pair that has none.
std::vector<fs::path> qa_candidates(const std::string& dataset, const std::string& split,
                                    const std::string& lang) {
  static const std::map<std::string, std::string> tydiqa_names = {
      {"ar", "arabic"},  {"bn", "bengali"},    {"en", "english"},
      {"fi", "finnish"}, {"id", "indonesian"}, {"ko", "korean"},
      {"ru", "russian"}, {"sw", "swahili"},    {"te", "telugu"}};
  std::vector<std::string> known;
  for (const auto& layout : qa_layouts()) {
    known.push_back(std::string(layout.dataset) + " " + layout.split);
    if (layout.dataset != dataset || layout.split != split) continue;
    const auto name = tydiqa_names.find(lang);
    std::vector<fs::path> candidates;
    for (const std::string_view pattern : layout.patterns) {
      const bool needs_name = pattern.find("{name}") != std::string_view::npos;
      if (needs_name && name == tydiqa_names.end()) continue;
      candidates.emplace_back(
          fmt::format(fmt::runtime(pattern), fmt::arg("lang", lang),
                      fmt::arg("name", name == tydiqa_names.end() ? std::string() : name->second)));
    }
    return candidates;
  }
  XLME_FAIL("QA dataset '{}' has no '{}' split; the QA files are: {}", dataset, split,
            io::join(known, ", "));
}

// The first of `relative` that exists under `root`; throws listing every path tried.
std::string first_qa_file(const std::string& root, const std::vector<fs::path>& relative,
                          const std::string& dataset, const std::string& split,
                          const std::string& lang, const std::string& remedy) {
  std::vector<std::string> tried;
  for (const auto& r : relative) {
    const std::string path = path_under(root, r.string());
    if (fs::is_regular_file(path)) return path;
    tried.push_back("'" + path + "'");
  }
  XLME_FAIL("{} {} split for language '{}': {} not found; {}", dataset, split, lang,
            io::join(tried, " or "), remedy);
}

}  // namespace

std::string qa_file(const std::string& download_dir, const std::string& dataset,
                    const std::string& split, const std::string& lang) {
  return first_qa_file(download_dir, qa_candidates(dataset, split, lang), dataset, split, lang,
                       io::download_remedy(download_dir));
}

std::string qa_gold_file(const std::string& gold_dir, const std::string& dataset,
                         const std::string& split, const std::string& lang) {
  std::vector<fs::path> names;
  for (const auto& c : qa_candidates(dataset, split, lang)) names.push_back(c.filename());
  return first_qa_file(gold_dir, names, dataset, split, lang,
                       io::gold_remedy(TaskGold::kSquadJson));
}

std::string qa_config_file(const std::string& data_dir, const std::string& file,
                           const std::string& key, const std::string& dataset,
                           const std::string& split, const std::string& lang) {
  const std::string default_file =
      dataset.empty() ? "" : qa_candidates(dataset, split, lang).front().generic_string();
  const fs::path named(file);
  const std::string path = named.is_absolute() ? file : (fs::path(data_dir) / named).string();
  if (fs::is_regular_file(path)) return path;
  const std::string dir = data_dir.empty() ? "." : data_dir;
  auto ends_with = [&](const std::string& tail) {
    const std::string normal = named.lexically_normal().generic_string();
    return normal == tail ||
           (normal.size() > tail.size() &&
            normal.compare(normal.size() - tail.size() - 1, std::string::npos, "/" + tail) == 0);
  };
  const bool is_default = !default_file.empty() && ends_with(default_file);
  std::string what;
  for (const std::string squad_split : {"train", "dev"}) {
    const std::string name = squad_split + "-v1.1.json";
    if (!ends_with("squad/" + name)) continue;
    what = fmt::format(
        "it is SQuAD v1.1's {} set, which XTREME's scripts/download_data.sh downloads into "
        "download/squad/: set finetune.data_dir to that download/ folder, or download {} from "
        "https://rajpurkar.github.io/SQuAD-explorer/ into '{}'",
        squad_split, name, (fs::path(dir) / "squad").string());
  }
  if (what.empty() && is_default) what = "it is XTREME's file: " + io::download_remedy(data_dir);
  if (what.empty()) {
    what = default_file.empty()
               ? fmt::format("fix {}, or leave it empty (no file)", key)
               : fmt::format("fix {}, or leave it empty for XTREME's '{}'", key, default_file);
  }
  const std::string default_note =
      default_file.empty() ? fmt::format("empty {} means no file", key)
      : is_default         ? fmt::format("that is {}'s default, XTREME's file", key)
                           : fmt::format("empty {} means XTREME's '{}'", key, default_file);
  XLME_FAIL(
      "{} '{}': '{}' does not exist (a relative path is under finetune.data_dir '{}'; {}); {}", key,
      file, path, dir, default_note, what);
}

QaData read_squad_json(const std::string& path, bool skip_mismatched) {
  io::require_file(path, "SQuAD-format QA data",
                   "check finetune.data_dir, finetune.gold_dir, finetune.train_file and "
                   "finetune.dev_file");
  const auto root = parse_json<nlohmann::json>(read_file(path, "SQuAD-format QA data"),
                                               fmt::format("SQuAD-format file '{}'", path));
  using T = nlohmann::json::value_t;
  XLME_CHECK(root.is_object(), "{}: the top level is {}, not a JSON object with a 'data' list",
             path, describe_json(root));
  QaData out;
  // Predictions are keyed by question id (predictions.json, the official scorer), so in a file
  // scored as gold two questions with one id would both be scored with one answer.
  std::unordered_map<std::string, std::string> first_with_id;
  int64_t repeated_ids = 0;
  const auto& data = qa_field(root, "data", T::array, path, "<root>");
  for (size_t d = 0; d < data.size(); ++d) {
    const std::string at_d = fmt::format("data[{}]", d);
    const auto& paragraphs = qa_field(data[d], "paragraphs", T::array, path, at_d);
    for (size_t p = 0; p < paragraphs.size(); ++p) {
      const std::string at_p = fmt::format("{}.paragraphs[{}]", at_d, p);
      const auto& context = qa_field(paragraphs[p], "context", T::string, path, at_p);
      const auto& qas = qa_field(paragraphs[p], "qas", T::array, path, at_p);
      for (size_t q = 0; q < qas.size(); ++q) {
        const std::string at_q = fmt::format("{}.qas[{}]", at_p, q);
        QaExample ex;
        ex.id = qa_field(qas[q], "id", T::string, path, at_q).get<std::string>();
        const auto [first, fresh] = first_with_id.emplace(ex.id, at_q);
        if (!fresh) {
          XLME_CHECK(skip_mismatched,
                     "{}: the question id '{}' of {} is also the id of {}: predictions are keyed "
                     "by id, so both would be scored with one answer; give every question its "
                     "own id",
                     path, ex.id, at_q, first->second);
          ++repeated_ids;
        }
        ex.question = qa_field(qas[q], "question", T::string, path, at_q).get<std::string>();
        ex.context = context.get<std::string>();
        ex.source = {path, 0};
        bool mismatch = false;
        const auto& answers = qa_field(qas[q], "answers", T::array, path, at_q);
        for (size_t a = 0; a < answers.size(); ++a) {
          const std::string at_a = fmt::format("{}.answers[{}]", at_q, a);
          QaAnswer ans;
          ans.text = qa_field(answers[a], "text", T::string, path, at_a).get<std::string>();
          const int64_t cp =
              qa_field(answers[a], "answer_start", T::number_integer, path, at_a).get<int64_t>();
          ans.start = text::byte_offset_of_code_point(ex.context, cp);
          if (ans.start < 0 ||
              ex.context.compare(static_cast<size_t>(ans.start), ans.text.size(), ans.text) != 0) {
            mismatch = true;
            ans.start = -1;
          }
          ex.answers.push_back(std::move(ans));
        }
        if (mismatch && skip_mismatched) {
          ++out.skipped;
          continue;
        }
        out.examples.push_back(std::move(ex));
      }
    }
  }
  io::require_content(!out.examples.empty() || out.skipped > 0, path,
                      "question (data[].paragraphs[].qas[])");
  if (repeated_ids > 0) {
    spdlog::warn("{}: {} question(s) repeat an earlier question's id (trained on all the same)",
                 path, repeated_ids);
  }
  if (out.skipped > 0) {
    spdlog::warn(
        "{}: skipped {} question(s) whose answer text does not match the context at "
        "answer_start",
        path, out.skipped);
  }
  return out;
}

}  // namespace xlme::finetune
