#include "xlme/finetune/finetune.h"

#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/task_registry.h"
#include "xlme/data/tokenizer.h"
#include "xlme/dist/launch.h"
#include "xlme/finetune/probes.h"
#include "xlme/finetune/runner.h"
#include "xlme/finetune/tasks.h"
#include "xlme/model/discriminator.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace xlme::finetune {

namespace fs = std::filesystem;

namespace {

// A fresh copy of the pre-trained discriminator (or, untrained, the same architecture with new
// weights), with fine-tuning's dropout.
model::DiscriminatorModel fresh_discriminator(const checkpoint::Pretrained& pretrained,
                                              double dropout, bool untrained) {
  auto config = pretrained.model;
  config.dropout = dropout;
  model::DiscriminatorModel copy(config, /*with_head=*/false);
  if (untrained) return copy;
  const auto weights = checkpoint::named_weights(*pretrained.discriminator);
  const auto match = checkpoint::match_weights(*copy, weights);
  XLME_CHECK(match.missing.empty(), "pre-trained weights lack {} ({})", match.missing.front(),
             pretrained.path);
  XLME_CHECK(match.mismatched.empty(),
             "pre-trained weight {} has another shape than the model's ({})",
             match.mismatched.front().name, pretrained.path);
  checkpoint::copy_weights(*copy, weights, match);
  return copy;
}

std::string seed_folder(const std::string& out_dir, size_t seeds, int64_t seed) {
  return seeds == 1 ? (fs::path(out_dir) / "predictions").string()
                    : (fs::path(out_dir) / fmt::format("seed{}", seed) / "predictions").string();
}

}  // namespace

std::string resolve_init(const std::string& init) {
  XLME_CHECK(!init.empty(),
             "finetune.init is empty: set it to a pre-training run folder (e.g. runs/demo), a "
             "checkpoint folder or an xlme-export folder");
  XLME_CHECK(fs::exists(init), "finetune.init {} does not exist", init);
  return checkpoint::resolve_pretrained_folder(init);
}

int run_finetune(const config::Config& config) {
  const auto& settings = config.finetune;
  checkpoint::PretrainedOptions load;
  load.cross_attention = settings.cross_attention == "plug-in";
  XLME_CHECK(!load.cross_attention || task_info(settings.task).family == TaskFamily::kSentencePair,
             "finetune.cross_attention=plug-in runs the two sentences of a sentence-pair task "
             "(xnli, pawsx) with cross-attention to each other; finetune.task={} has no sentence "
             "pairs; use finetune.cross_attention=plug-out",
             settings.task);
  resolve_init(settings.init);  // the checks of finetune.init
  auto pretrained = checkpoint::load_pretrained_resolved(settings.init, load);
  const std::string init = pretrained.path;  // the checkpoint or export folder read
  XLME_CHECK(!pretrained.tokenizer_path.empty(),
             "{} holds no SentencePiece model; fine-tuning needs the tokenizer of pre-training",
             init);
  const data::Tokenizer tokenizer(pretrained.tokenizer_file,
                                  data::parse_vocab_layout(pretrained.vocab_layout));
  // One process: the first visible GPU (or the CPU), made current.
  const auto device = dist::use_device(config.run.device, dist::LaunchInfo{});
  spdlog::info("{}: {} (step {}, {} tokens seen){}, on {}", settings.task, init, pretrained.step,
               pretrained.tokens_seen, settings.untrained ? ", untrained weights" : "",
               device.str());
  // results.json records the model that was loaded, not the config's model section.
  config::Config recorded = config;
  recorded.model = pretrained.model;
  nlohmann::ordered_json results;
  std::string table;

  if (!task_info(settings.task).trains) {
    torch::manual_seed(static_cast<uint64_t>(config.run.seed));
    auto model = fresh_discriminator(pretrained, 0.0, settings.untrained);
    model->to(device);
    const auto predictions = (fs::path(config.run.out_dir) / "predictions").string();
    auto report = run_probe(settings, model->discriminator, tokenizer, device, predictions);
    results = {{"task", settings.task}, {"init", init}, {"step", pretrained.step}};
    results[settings.untrained ? "untrained" : "trained"] = report.results;
    table = fmt::format("{} ({}):\n{}", settings.untrained ? "untrained" : "pre-trained", init,
                        report.table);
    if (settings.compare_untrained && !settings.untrained) {
      torch::manual_seed(static_cast<uint64_t>(config.run.seed));
      auto fresh = fresh_discriminator(pretrained, 0.0, /*untrained=*/true);
      fresh->to(device);
      auto baseline = run_probe(settings, fresh->discriminator, tokenizer, device, "");
      results["untrained"] = baseline.results;
      table += fmt::format("\nthe same architecture untrained (seed {}):\n{}", config.run.seed,
                           baseline.table);
    }
    results["config"] = config::to_yaml(recorded, /*docs=*/false);
    write_file_atomic((fs::path(config.run.out_dir) / "results.json").string(),
                      results.dump(2) + "\n");
  } else {
    auto task = make_task(settings, tokenizer);
    const ModelFactory factory = [&](HeadKind kind, int64_t classes) {
      auto backbone = fresh_discriminator(pretrained, settings.dropout, settings.untrained);
      return FinetuneModel(backbone->embeddings, backbone->discriminator, kind, classes,
                           settings.dropout);
    };
    std::vector<SeedResult> seeds;
    for (int64_t seed : settings.seeds) {
      seeds.push_back(
          train_and_evaluate(settings, *task, factory, seed, device,
                             seed_folder(config.run.out_dir, settings.seeds.size(), seed)));
    }
    const auto languages = evaluated_languages(settings);
    write_file_atomic((fs::path(config.run.out_dir) / "results.json").string(),
                      results_json(recorded, seeds, languages));
    // Every run prints a test section: scores, or which predictions were not scored and why.
    const std::string written =
        fmt::format("the files are in {}",
                    seed_folder(config.run.out_dir, seeds.size(), settings.seeds.front()));
    const std::string why =
        settings.gold_dir.empty()
            ? "XTREME's test files carry no labels and finetune.gold_dir is not set (point it at "
              "the upstream files with the gold: docs/finetuning.md#where-gold-comes-from); " +
                  written
            : "their gold files carry no labels; " + written;
    table = results_table(seeds, Split::kTest, languages, why);
    if (table.empty())
      table = "test: no language had a test set (the log names what each lacked)\n";
    table += results_table(seeds, Split::kDev, languages, "the dev files carry no labels");
  }
  spdlog::info("{} results ({}):\n{}", settings.task,
               (fs::path(config.run.out_dir) / "results.json").string(), table);
  return 0;
}

}  // namespace xlme::finetune
