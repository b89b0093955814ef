// xlme-data: build corpora into training data: demo corpus, SentencePiece, memory-mapped shards
#include "xlme/common/app.h"
#include "xlme/data/demo_corpus.h"
#include "xlme/data/spm_trainer.h"

#include <spdlog/spdlog.h>

#include <thread>

namespace {

int demo_corpus(const xlme::data::DemoCorpusOptions& options) {
  const auto report = xlme::data::build_demo_corpus(options);
  int64_t big_pairs = 0, full_heldout = 0;
  for (const auto& c : report.languages) {
    spdlog::info("{:<12} mono {:>8} lines {:>5} docs | pairs {:>7} train {:>5} dev {:>5} test",
                 c.language, c.mono_lines, c.mono_documents, c.train_pairs, c.dev_pairs,
                 c.test_pairs);
    big_pairs += c.train_pairs >= 5000;
    full_heldout += c.dev_pairs >= options.heldout_pairs && c.test_pairs >= options.heldout_pairs;
  }
  spdlog::info(
      "{}: {} languages; {} pairs with >= 5000 training pairs; {} pairs with {}-pair dev and "
      "test sets ({} catalogs, {} skipped, {} man pages; table in counts.tsv)",
      options.out_dir, report.languages.size(), big_pairs, full_heldout, options.heldout_pairs,
      report.catalogs, report.bad_catalogs, report.man_pages);
  return xlme::kExitOk;
}

int64_t threads_of(const xlme::config::Config& cfg) {
  return cfg.run.threads > 0 ? cfg.run.threads
                             : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

int train_spm(const xlme::config::Config& cfg, xlme::data::SpmTrainingOptions options) {
  options.languages = cfg.data.mono.languages;
  options.spm = cfg.data.spm;
  options.seed = cfg.run.seed;
  options.threads = threads_of(cfg);
  const auto report = xlme::data::train_sentencepiece(options);
  spdlog::info(
      "wrote {} ({} ids in the XLM-R layout, <mask> = {}); use it with --set "
      "data.tokenizer={}",
      options.out_model, report.vocab_size, report.vocab_size - 1, options.out_model);
  return xlme::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-data",
      "build corpora into training data: demo corpus, SentencePiece, memory-mapped shards",
      /*run_logs=*/false};
  CLI::App* demo = nullptr;
  xlme::data::DemoCorpusOptions demo_options;
  CLI::App* spm = nullptr;
  xlme::data::SpmTrainingOptions spm_options;
  auto add_options = [&](CLI::App& cli) {
    // No subcommand is fine with --print-config; otherwise the body asks for one.
    cli.require_subcommand(0, 1);
    cli.fallthrough();
    demo = cli.add_subcommand("demo-corpus",
                              "build the offline demo corpus from Debian's translation catalogs "
                              "and man pages (scripts/prepare_demo_corpus.sh)");
    demo->add_option("--out", demo_options.out_dir, "output folder (mono/, para/, heldout/)")
        ->required();
    demo->add_option("--locale-dir", demo_options.locale_dir, "folder of <lang>/LC_MESSAGES/*.mo")
        ->capture_default_str();
    demo->add_option("--man-dir", demo_options.man_dir,
                     "folder of <lang>/man<N>/*.gz (\"\": no man pages)")
        ->capture_default_str();
    demo->add_option("--heldout-pairs", demo_options.heldout_pairs,
                     "pairs per dev and per test set")
        ->capture_default_str();
    demo->add_option("--heldout-per-mille", demo_options.heldout_per_mille,
                     "English messages held out for dev, and as many for test (per mille)")
        ->capture_default_str();
    spm = cli.add_subcommand("train-spm",
                             "train a SentencePiece model (data.spm) on language-balanced "
                             "samples of <input>/mono/<lang>.txt[.gz|.xz] (data.mono.languages)");
    spm->add_option("--input", spm_options.corpus_dir, "raw corpus folder (with mono/)")
        ->required();
    spm->add_option("--out", spm_options.out_model, "model file to write (e.g. data/spm.model)")
        ->required();
  };
  return xlme::run_app(
      argc, argv, spec,
      [&](const xlme::config::Config& cfg) {
        if (demo->parsed()) return demo_corpus(demo_options);
        if (spm->parsed()) return train_spm(cfg, spm_options);
        spdlog::error("xlme-data needs a command: demo-corpus, train-spm (see xlme-data --help)");
        return xlme::kExitUsage;
      },
      add_options);
}
