#include "xlme/finetune/probes.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/task_registry.h"
#include "xlme/eval/retrieval.h"
#include "xlme/finetune/metrics.h"
#include "xlme/finetune/retrieval_io.h"
#include "xlme/finetune/tasks.h"
#include "xlme/finetune/xtreme_io.h"
#include "xtreme_files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

namespace xlme::finetune {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// The hidden states a probe reads: finetune.layer, or 0..L with sweep_layers.
std::vector<int64_t> probe_layers(const config::FinetuneConfig& settings,
                                  const model::Encoder& encoder) {
  const int64_t layers = encoder->args().layers;
  XLME_CHECK(settings.layer <= layers,
             "finetune.layer is {}, but the model has {} layers (0 = embeddings, 1..{}); set "
             "finetune.layer",
             settings.layer, layers, layers);
  if (!settings.sweep_layers) return {settings.layer};
  std::vector<int64_t> all(static_cast<size_t>(layers) + 1);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

// One [N, H] tensor per probe layer.
std::vector<torch::Tensor> embed(model::Encoder& encoder, const data::Tokenizer& tokenizer,
                                 const std::vector<std::string>& sentences,
                                 const std::vector<int64_t>& layers,
                                 const config::FinetuneConfig& settings,
                                 const torch::Device& device) {
  eval::EmbeddingOptions options;
  options.layers = layers;
  options.batch_size = settings.eval_batch_size;
  options.pad_id = tokenizer.special_ids().pad;
  options.device = device;
  const int64_t max_len = std::min(settings.retrieval_max_len, encoder->args().max_positions);
  return eval::sentence_embeddings(encoder, eval::sentence_ids(tokenizer, sentences, max_len),
                                   options);
}

std::string layer_name(int64_t layer) {
  return fmt::format("layer {}", layer);
}

// A table with one row per language (pair) and the mean, one column per layer.
std::string score_table(const Json& by_layer, const std::string& score, const std::string& title) {
  std::string out = title + "\n" + fmt::format("  {:<14}", "");
  std::vector<std::string> rows;
  for (const auto& [layer, languages] : by_layer.items()) {
    out += fmt::format(" {:>8}", layer);
    if (rows.empty()) {
      for (const auto& [language, unused] : languages.items()) rows.push_back(language);
    }
  }
  out += "\n";
  for (const auto& language : rows) {
    out += fmt::format("  {:<14}", language);
    for (const auto& [layer, languages] : by_layer.items()) {
      out += fmt::format(" {:>8.2f}", languages.at(language).at(score).get<double>());
    }
    out += "\n";
  }
  return out;
}

// Adds "mean" over the languages of every score.
void add_means(Json& languages) {
  std::map<std::string, std::vector<double>> values;
  for (const auto& [language, scores] : languages.items()) {
    for (const auto& [key, value] : scores.items()) values[key].push_back(value.get<double>());
  }
  Json mean = Json::object();
  for (const auto& [key, list] : values) {
    mean[key] = std::accumulate(list.begin(), list.end(), 0.0) / static_cast<double>(list.size());
  }
  languages["mean"] = mean;
}

// Keeps the first finetune.max_eval_examples of `items` (0 = all); a cut is logged and recorded in
// `subset` ({pair: {scored, of, unit}}) for results.json and the console.
template <class T>
void keep_first_scored(std::vector<T>& items, const config::FinetuneConfig& settings,
                       const std::string& pair, const std::string& unit, Json& subset) {
  const auto total = static_cast<int64_t>(items.size());
  if (settings.max_eval_examples <= 0 || total <= settings.max_eval_examples) return;
  items.resize(static_cast<size_t>(settings.max_eval_examples));
  spdlog::info("{} {}: scored {} of {} {}s (the first; finetune.max_eval_examples)", settings.task,
               pair, settings.max_eval_examples, total, unit);
  subset[pair] = {{"scored", settings.max_eval_examples}, {"of", total}, {"unit", unit}};
}

// `report` with the sets keep_first_scored cut, in results.json and under the console's table.
void note_subset(ProbeReport& report, const config::FinetuneConfig& settings, const Json& subset) {
  if (subset.empty()) return;
  report.results["subset"] = {{"max_eval_examples", settings.max_eval_examples},
                              {"languages", subset}};
  std::vector<std::string> cut;
  for (const auto& [pair, c] : subset.items()) {
    cut.push_back(fmt::format("{} {} of {} {}s", pair, c.at("scored").get<int64_t>(),
                              c.at("of").get<int64_t>(), c.at("unit").get<std::string>()));
  }
  report.table += fmt::format(
      "scored on subsets (finetune.max_eval_examples: {}), not comparable to full-set scores\n",
      fmt::join(cut, "; "));
}

// Records what every per-layer "mean" covers, as the fine-tuned tasks' averages do: the languages
// (pairs) scored, those of `requested` that were not (too few sentences, no test gold) and how
// many were asked for; every layer scores the same ones. A mean over fewer than were asked for
// says so under the table.
void note_coverage(ProbeReport& report, const Json& by_layer,
                   const std::vector<std::string>& requested) {
  if (by_layer.empty()) return;
  std::vector<std::string> covers, lacks;
  const Json& scored = by_layer.begin().value();
  for (const auto& [name, unused] : scored.items()) {
    if (name != "mean") covers.push_back(name);
  }
  for (const auto& name : requested) {
    if (!scored.contains(name)) lacks.push_back(name);
  }
  report.results["coverage"] = {
      {"covers", covers}, {"lacks", lacks}, {"of", covers.size() + lacks.size()}};
  if (!lacks.empty()) {
    report.table += fmt::format("mean over {} of {}; not scored: {}\n", covers.size(),
                                covers.size() + lacks.size(), fmt::join(lacks, ", "));
  }
}

// ---- Line-aligned pairs (retrieval, and Tatoeba with the LASER originals) --------------------

Json score_aligned(const SentencePairs& pairs, model::Encoder& encoder,
                   const data::Tokenizer& tokenizer, const std::vector<int64_t>& layers,
                   const config::FinetuneConfig& settings, const torch::Device& device,
                   std::vector<torch::Tensor>* source_to_target) {
  auto a = embed(encoder, tokenizer, pairs.source, layers, settings, device);
  auto b = embed(encoder, tokenizer, pairs.target, layers, settings, device);
  Json by_layer = Json::object();
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto accuracy = eval::retrieval_accuracy(a[l], b[l]);
    // Keys name the direction: "de_to_en" retrieves English sentences for German queries.
    by_layer[layer_name(layers[l])] = {
        {pairs.source_language + "_to_" + pairs.target_language, 100.0 * accuracy.a_to_b},
        {pairs.target_language + "_to_" + pairs.source_language, 100.0 * accuracy.b_to_a},
        {"accuracy", 100.0 * accuracy.mean}};
    if (source_to_target) source_to_target->push_back(eval::nearest_neighbours(b[l], a[l]));
  }
  return by_layer;
}

ProbeReport run_retrieval(const config::FinetuneConfig& settings, model::Encoder& encoder,
                          const data::Tokenizer& tokenizer, const torch::Device& device) {
  const auto layers = probe_layers(settings, encoder);
  Json by_layer = Json::object();
  Json subset = Json::object();
  const auto pairs = find_language_pairs(settings.data_dir, settings.pairs);
  for (const auto& pair : pairs) {
    const auto dash = pair.find('-');
    const auto a = pair.substr(0, dash), b = pair.substr(dash + 1);
    auto sentences =
        read_line_pairs(path_under(settings.data_dir, pair + "." + a),
                        path_under(settings.data_dir, pair + "." + b), a, b,
                        /*aligned=*/true, io::data_remedy(settings.task, settings.data_dir));
    if (static_cast<int64_t>(sentences.source.size()) < settings.min_sentences) continue;
    keep_first_scored(sentences.source, settings, pair, "pair", subset);
    sentences.target.resize(sentences.source.size());
    const auto scores =
        score_aligned(sentences, encoder, tokenizer, layers, settings, device, nullptr);
    for (const auto& [layer, value] : scores.items()) by_layer[layer][pair] = value;
  }
  XLME_CHECK(!by_layer.empty(),
             "no language pair in {} has finetune.min_sentences ({}) sentence pairs",
             settings.data_dir, settings.min_sentences);
  for (auto& [layer, languages] : by_layer.items()) add_means(languages);
  ProbeReport report;
  report.results = {{"main", "accuracy"}, {"layers", by_layer}};
  report.table = score_table(by_layer, "accuracy",
                             "retrieval accuracy@1 (mean of both directions) per language pair "
                             "and layer:");
  note_coverage(report, by_layer, pairs);
  note_subset(report, settings, subset);
  return report;
}

ProbeReport run_tatoeba(const config::FinetuneConfig& settings, model::Encoder& encoder,
                        const data::Tokenizer& tokenizer, const torch::Device& device,
                        const std::string& predictions_dir) {
  const auto layers = probe_layers(settings, encoder);
  Json by_layer = Json::object();
  const auto languages = evaluated_languages(settings);
  for (const auto& language : languages) {
    // Gold needs LASER's line-aligned originals; XTREME's copy has its English side sorted.
    const bool gold = !settings.gold_dir.empty();
    const auto test = read_tatoeba(settings.gold_dir, settings.data_dir, language);
    const auto& pairs = test.pairs;
    spdlog::info("tatoeba test {}: {} pairs {}", language, pairs.source.size(), test.from);
    std::vector<torch::Tensor> english_to_xx;
    if (gold) {
      // source = xx, target = en. XTREME's headline is en -> xx (each English sentence retrieves
      // its translation); xx -> en is kept beside it.
      const auto scores =
          score_aligned(pairs, encoder, tokenizer, layers, settings, device, &english_to_xx);
      for (const auto& [layer, value] : scores.items()) {
        by_layer[layer][language] = {{"accuracy", value.at("en_to_" + language)},
                                     {"en_to_xx", value.at("en_to_" + language)},
                                     {"xx_to_en", value.at(language + "_to_en")}};
      }
    } else {
      auto xx = embed(encoder, tokenizer, pairs.source, layers, settings, device);
      auto en = embed(encoder, tokenizer, pairs.target, layers, settings, device);
      for (size_t l = 0; l < layers.size(); ++l) {
        english_to_xx.push_back(eval::nearest_neighbours(en[l], xx[l]));
      }
    }
    // XTREME's submission: for each line of the sorted English file (the leaderboard's order,
    // whatever order the English side was read in), the index of the retrieved xx sentence.
    auto chosen = english_to_xx[static_cast<size_t>(
        std::find(layers.begin(), layers.end(), settings.layer) - layers.begin())];
    const int64_t* retrieved = chosen.data_ptr<int64_t>();
    std::vector<int64_t> indices;
    for (const int64_t line : tatoeba_sorted_order(pairs.target)) {
      indices.push_back(retrieved[line]);
    }
    if (!predictions_dir.empty()) {
      write_index_predictions(prediction_path(predictions_dir, settings.task, language), indices);
    }
  }
  ProbeReport report;
  if (by_layer.empty()) {
    report.table = "tatoeba: predictions written; no finetune.gold_dir (LASER's files) to score\n";
    return report;
  }
  for (auto& [layer, languages] : by_layer.items()) add_means(languages);
  report.results = {{"main", "accuracy"}, {"layers", by_layer}};
  report.table = score_table(by_layer, "accuracy",
                             "tatoeba accuracy@1 en->xx (XTREME's; xx->en in results.json), per "
                             "layer:");
  note_coverage(report, by_layer, languages);
  return report;
}

ProbeReport run_bucc(const config::FinetuneConfig& settings, model::Encoder& encoder,
                     const data::Tokenizer& tokenizer, const torch::Device& device,
                     const std::string& predictions_dir) {
  const auto layers = probe_layers(settings, encoder);
  Json by_layer = Json::object();
  const auto languages = evaluated_languages(settings);
  for (const auto& language : languages) {
    const auto dev = read_bucc(settings.data_dir, language, "dev", /*require_gold=*/true);
    const auto test = read_bucc(settings.gold_dir.empty() ? settings.data_dir : settings.gold_dir,
                                language, "test", /*require_gold=*/false);
    auto texts = [](const auto& rows) {
      std::vector<std::string> out;
      for (const auto& row : rows) out.push_back(row.second);
      return out;
    };
    auto dev_source = embed(encoder, tokenizer, texts(dev.source), layers, settings, device);
    auto dev_english = embed(encoder, tokenizer, texts(dev.english), layers, settings, device);
    auto test_source = embed(encoder, tokenizer, texts(test.source), layers, settings, device);
    auto test_english = embed(encoder, tokenizer, texts(test.english), layers, settings, device);
    for (size_t l = 0; l < layers.size(); ++l) {
      const double threshold =
          bucc_optimize_threshold(bucc_candidates(dev, dev_source[l], dev_english[l]), dev.gold);
      const auto mined =
          bucc_extract(bucc_candidates(test, test_source[l], test_english[l]), threshold);
      if (layers[l] == settings.layer && !predictions_dir.empty()) {
        write_pair_predictions(prediction_path(predictions_dir, settings.task, language), mined);
      }
      if (test.gold.empty()) continue;
      const auto scores = pair_scores(mined, test.gold);
      by_layer[layer_name(layers[l])][language] = {{"f1", scores.f1},
                                                   {"precision", scores.precision},
                                                   {"recall", scores.recall},
                                                   {"threshold", threshold}};
    }
  }
  ProbeReport report;
  if (by_layer.empty()) {
    report.table =
        "bucc: predictions written; the test gold is not in XTREME's download (set "
        "finetune.gold_dir to BUCC's files)\n";
    return report;
  }
  for (auto& [layer, languages] : by_layer.items()) add_means(languages);
  report.results = {{"main", "f1"}, {"layers", by_layer}};
  report.table = score_table(by_layer, "f1", "bucc F1 (threshold tuned on dev), per layer:");
  note_coverage(report, by_layer, languages);
  return report;
}

ProbeReport run_alignment(const config::FinetuneConfig& settings, model::Encoder& encoder,
                          const data::Tokenizer& tokenizer, const torch::Device& device) {
  const auto layers = probe_layers(settings, encoder);
  Json by_layer = Json::object();
  Json subset = Json::object();
  const auto pairs = find_language_pairs(settings.data_dir, settings.pairs);
  for (const auto& pair : pairs) {
    const auto dash = pair.find('-');
    auto gold =
        read_aligned_pairs(path_under(settings.data_dir, pair + "." + pair.substr(0, dash)),
                           path_under(settings.data_dir, pair + "." + pair.substr(dash + 1)),
                           path_under(settings.data_dir, pair + ".gold"));
    keep_first_scored(gold, settings, pair, "sentence pair", subset);
    for (int64_t layer : layers) {
      std::vector<std::vector<Link>> predicted;
      for (const auto& sentence : gold) {
        auto s = word_vectors(encoder, tokenizer, sentence.source_words, layer, device);
        auto t = word_vectors(encoder, tokenizer, sentence.target_words, layer, device);
        auto similarity = torch::matmul(torch::nn::functional::normalize(s),
                                        torch::nn::functional::normalize(t).t());
        predicted.push_back(settings.alignment_method == "ot" ? align_optimal_transport(similarity)
                                                              : align_argmax(similarity));
      }
      const auto scores = alignment_error_rate(gold, predicted);
      by_layer[layer_name(layer)][pair] = {
          {"aer", scores.aer}, {"precision", scores.precision}, {"recall", scores.recall}};
    }
  }
  for (auto& [layer, languages] : by_layer.items()) add_means(languages);
  ProbeReport report;
  report.results = {{"main", "aer"}, {"method", settings.alignment_method}, {"layers", by_layer}};
  report.table = score_table(by_layer, "aer",
                             fmt::format("alignment error rate ({}), per layer (lower is better):",
                                         settings.alignment_method));
  note_coverage(report, by_layer, pairs);
  note_subset(report, settings, subset);
  return report;
}

}  // namespace

std::vector<std::string> find_language_pairs(const std::string& dir,
                                             const std::vector<std::string>& pairs) {
  XLME_CHECK(fs::is_directory(dir), "finetune.data_dir {} is not a folder", dir);
  auto has_both = [&](const std::string& pair) {
    const auto dash = pair.find('-');
    if (dash == std::string::npos || dash == 0 || dash + 1 == pair.size()) return false;
    return fs::is_regular_file(path_under(dir, pair + "." + pair.substr(0, dash))) &&
           fs::is_regular_file(path_under(dir, pair + "." + pair.substr(dash + 1)));
  };
  if (!pairs.empty()) {
    for (const auto& pair : pairs) {
      XLME_CHECK(has_both(pair),
                 "finetune.pairs names {}, but {} lacks {}/{}.<a> and .<b> files (pair as "
                 "<a>-<b>, e.g. en-de)",
                 pair, dir, dir, pair);
    }
    return pairs;
  }
  std::set<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto stem = entry.path().stem().string();
    if (has_both(stem)) found.insert(stem);
  }
  XLME_CHECK(!found.empty(),
             "{} holds no language pairs: expected files like en-de.en and en-de.de (the demo "
             "corpus's heldout/test folder has them)",
             dir);
  return {found.begin(), found.end()};
}

torch::Tensor word_vectors(model::Encoder& encoder, const data::Tokenizer& tokenizer,
                           const std::vector<std::string>& words, int64_t layer,
                           const torch::Device& device) {
  const auto& special = tokenizer.special_ids();
  std::vector<int64_t> ids = {special.bos};
  std::vector<int64_t> owner = {-1};
  for (size_t w = 0; w < words.size(); ++w) {
    auto pieces = tokenizer.encode(words[w]);
    if (pieces.empty()) pieces.push_back(static_cast<int32_t>(special.unk));
    for (int32_t id : pieces) {
      ids.push_back(id);
      owner.push_back(static_cast<int64_t>(w));
    }
  }
  ids.push_back(special.eos);
  owner.push_back(-1);
  XLME_CHECK(static_cast<int64_t>(ids.size()) <= encoder->args().max_positions,
             "a sentence of {} words has {} tokens, more than model.max_positions ({})",
             words.size(), ids.size(), encoder->args().max_positions);
  torch::NoGradGuard no_grad;
  const bool was_training = encoder->is_training();
  encoder->eval();
  auto input = torch::tensor(ids).unsqueeze(0).to(device);
  auto positions = torch::arange(input.size(1), torch::kInt64).unsqueeze(0).to(device);
  auto padding = torch::zeros_like(input, torch::kBool);
  auto hidden = encoder->hidden_states(input, positions, padding, layer).back()[0].cpu();
  encoder->train(was_training);
  // Average each word's pieces: a [words, T] matrix of 1 / pieces.
  auto weights = torch::zeros({static_cast<int64_t>(words.size()), input.size(1)});
  for (size_t t = 0; t < owner.size(); ++t) {
    if (owner[t] >= 0) weights[owner[t]][static_cast<int64_t>(t)] = 1.0;
  }
  weights = weights / weights.sum(1, true);
  return torch::matmul(weights, hidden.to(torch::kFloat));
}

ProbeReport run_probe(const config::FinetuneConfig& settings, model::Encoder& encoder,
                      const data::Tokenizer& tokenizer, const torch::Device& device,
                      const std::string& predictions_dir) {
  // A probe is what it scores (task_registry.h).
  switch (task_info(settings.task).metric) {
    case TaskMetric::kPairAccuracy:
      return run_retrieval(settings, encoder, tokenizer, device);
    case TaskMetric::kTatoebaAccuracy:
      return run_tatoeba(settings, encoder, tokenizer, device, predictions_dir);
    case TaskMetric::kBuccF1:
      return run_bucc(settings, encoder, tokenizer, device, predictions_dir);
    case TaskMetric::kAlignmentErrorRate:
      return run_alignment(settings, encoder, tokenizer, device);
    case TaskMetric::kAccuracy:
    case TaskMetric::kSeqevalF1:
    case TaskMetric::kSquadF1:
    case TaskMetric::kMlqaF1:
      break;
  }
  std::vector<std::string> probes;
  for (const auto& task : task_table()) {
    if (!task.trains) probes.push_back(task.name);
  }
  XLME_FAIL("finetune.task {} is not a probe ({})", settings.task, fmt::join(probes, ", "));
}

}  // namespace xlme::finetune
