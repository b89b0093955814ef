// xlme-data: build corpora into training data: demo corpus, SentencePiece, memory-mapped shards
#include "xlme/cli/app.h"
#include "xlme/common/error.h"
#include "xlme/config/task_registry.h"
#include "xlme/data/batch_bench.h"
#include "xlme/data/binarize.h"
#include "xlme/data/demo_corpus.h"
#include "xlme/data/spm_trainer.h"
#include "xlme/finetune/tagging_io.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
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

xlme::data::Tokenizer load_tokenizer(const xlme::config::Config& cfg) {
  XLME_CHECK(!cfg.data.tokenizer.empty(),
             "data.tokenizer is not set; train one with xlme-data train-spm and pass --set "
             "data.tokenizer=FILE");
  return xlme::data::Tokenizer(cfg.data.tokenizer,
                               xlme::data::parse_vocab_layout(cfg.data.vocab_layout));
}

int binarize(const xlme::config::Config& cfg, xlme::data::BinarizeOptions options) {
  const auto tokenizer = load_tokenizer(cfg);
  if (options.out_dir.empty()) options.out_dir = cfg.data.shards;
  options.mono_languages = cfg.data.mono.languages;
  options.para_pairs = cfg.data.para.languages;
  options.threads = threads_of(cfg);
  options.max_line_bytes = cfg.data.binarize.max_line_bytes;
  options.max_invalid_fraction = cfg.data.binarize.max_invalid_fraction;
  spdlog::info("binarizing {} into {} with {} ({} ids), {} threads", options.input_dir,
               options.out_dir, cfg.data.tokenizer, tokenizer.vocab_size(), options.threads);
  bool finished = true;
  int64_t tokens = 0, bytes = 0;
  double seconds = 0;
  for (const auto& r : xlme::data::binarize(options, tokenizer)) {
    finished = finished && r.finished;
    if (r.up_to_date) {
      spdlog::info("{:<12} up to date", r.name);
      continue;
    }
    tokens += r.tokens;
    bytes += r.source_bytes;
    seconds += r.seconds;
    spdlog::info(
        "{:<12} {} {} lines -> {} {} / {} tokens; skipped {} invalid UTF-8, {} with NUL, {} too "
        "long, {} empty; {:.2f} MB/s{}{}",
        r.name, r.kind == xlme::data::ShardKind::kMono ? "mono" : "para", r.source_lines,
        r.sequences, r.kind == xlme::data::ShardKind::kMono ? "sentences" : "pairs", r.tokens,
        r.invalid_utf8_lines, r.nul_lines, r.long_lines, r.empty_lines,
        r.source_bytes / std::max(1e-9, r.seconds) / 1e6, r.resumed ? " (resumed)" : "",
        r.finished ? "" : " (stopped at --max-chunks; run again to continue)");
  }
  spdlog::info("binarized {} tokens from {:.1f} MB in {:.2f} s: {:.2f} MB/s, {:.2f}M tokens/s",
               tokens, bytes / 1e6, seconds, bytes / std::max(1e-9, seconds) / 1e6,
               tokens / std::max(1e-9, seconds) / 1e6);
  return finished ? xlme::kExitOk : xlme::kExitError;
}

int inspect(const xlme::config::Config& cfg, std::string dir, int64_t samples) {
  if (dir.empty()) dir = cfg.data.shards;
  std::unique_ptr<xlme::data::Tokenizer> tokenizer;
  if (!cfg.data.tokenizer.empty()) {
    tokenizer = std::make_unique<xlme::data::Tokenizer>(load_tokenizer(cfg));
  }
  const auto summaries = xlme::data::inspect_shards(dir, tokenizer.get(), samples);
  for (const auto& s : summaries) {
    const auto& h = s.header;
    spdlog::info(
        "{:<12} {} {:>10} {} {:>12} tokens {:>8} docs, {} skipped invalid UTF-8, {} "
        "empty, uint{}, vocab {}, checksums ok{}",
        h.name, h.kind == 0 ? "mono" : "para", h.sequences, h.kind == 0 ? "sentences" : "pairs    ",
        h.tokens, h.documents, h.invalid_utf8_lines, h.empty_lines, h.dtype_bytes == 2 ? 16 : 32,
        h.vocab_size,
        tokenizer ? fmt::format(", {} decoded == SentencePiece", s.checked_segments)
                  : std::string(""));
  }
  spdlog::info("{}: {} shards verified", dir, summaries.size());
  return xlme::kExitOk;
}

struct BenchArgs {
  std::string shards;
  double seconds = 3.0;
  int64_t synthetic_tokens = 20000000;
};

int bench(const xlme::config::Config& cfg, const BenchArgs& args) {
  namespace fs = std::filesystem;
  std::unique_ptr<xlme::data::Tokenizer> tokenizer;
  if (!args.shards.empty() && !cfg.data.tokenizer.empty()) {
    tokenizer = std::make_unique<xlme::data::Tokenizer>(load_tokenizer(cfg));
  }
  auto options = xlme::data::BatchOptions::from_config(cfg, tokenizer.get(), 0, 1);
  options.para.enabled = true;  // both tasks, whatever objectives.set trains
  options.shards = args.shards;
  std::string synthetic;
  if (args.shards.empty()) {
    synthetic = (fs::temp_directory_path() / fmt::format("xlme-bench-{}", ::getpid())).string();
    spdlog::info("no --shards: writing synthetic shards ({} tokens, vocab 32000) to {}",
                 args.synthetic_tokens, synthetic);
    xlme::data::write_synthetic_shards(synthetic, 32000, args.synthetic_tokens,
                                       args.synthetic_tokens / 2, options.seed);
    options.shards = synthetic;
    options.ids = {};  // the synthetic shards' own vocabulary, whatever model.vocab_size says
  }
  std::vector<xlme::data::BatchBenchReport> reports;
  try {
    reports = xlme::data::bench_batches(options, args.seconds);
  } catch (...) {
    if (!synthetic.empty()) fs::remove_all(synthetic);
    throw;
  }
  if (!synthetic.empty()) fs::remove_all(synthetic);
  for (const auto& r : reports) {
    const bool mono = r.task == xlme::data::Task::kMono;
    spdlog::info(
        "{}: {} micro-batches, {} sequences, {} tokens ({:.2f}% padding, {:.2f}% masked) in "
        "{:.2f} s on one core: {:.2f}M tokens/s assembled + masked ({:.2f}M with padding)",
        mono ? "MRTD" : "TRTD", r.micro_batches, r.sequences, r.real_tokens,
        100 * r.padding_fraction(), 100.0 * r.masked / std::max<int64_t>(1, r.real_tokens),
        r.seconds, r.tokens_per_second() / 1e6, r.padded_tokens / std::max(1e-9, r.seconds) / 1e6);
    for (const auto& c : r.languages) {
      spdlog::info(
          "  {:<8} m_j {:>11} tokens  p_j {:.4f}  read {:>6} micro-batches {:>11} "
          "tokens ({:.4f} of all)",
          c.name, c.shard_tokens, c.probability, c.micro_batches, c.tokens,
          static_cast<double>(c.tokens) / std::max<int64_t>(1, r.real_tokens));
    }
  }
  return xlme::kExitOk;
}

struct XtremeArgs {
  std::string task, input, out;
  std::vector<std::string> languages;
};

// XTREME's processed tagging layout from the downloads (finetune/tagging_io.h).
int xtreme(const XtremeArgs& args) {
  const auto files =
      xlme::finetune::prepare_tagging(args.task, args.input, args.out, args.languages);
  for (const auto& f : files) spdlog::info("{:>8} sentences -> {}", f.sentences, f.path);
  spdlog::info("{}: wrote {} files; fine-tune with --set finetune.data_dir={}", args.task,
               files.size(), args.out);
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
  CLI::App* bin = nullptr;
  xlme::data::BinarizeOptions bin_options;
  CLI::App* insp = nullptr;
  std::string inspect_dir;
  int64_t inspect_samples = 100;
  CLI::App* bench_cmd = nullptr;
  BenchArgs bench_args;
  CLI::App* xtreme_cmd = nullptr;
  XtremeArgs xtreme_args;
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
    bin = cli.add_subcommand("binarize",
                             "encode <input>/mono/<lang>.txt[.gz|.xz] and para/<a>-<b>.<a|b> "
                             "with data.tokenizer into memory-mapped shards (resumable)");
    bin->add_option("--input", bin_options.input_dir, "raw corpus folder (mono/, para/)")
        ->required();
    bin->add_option("--out", bin_options.out_dir, "shard folder (default: data.shards)");
    bin->add_option("--chunk-lines", bin_options.chunk_lines, "lines per work item")
        ->capture_default_str();
    bin->add_option("--max-chunks", bin_options.max_chunks,
                    "stop after this many chunks per file, resumable (0: no limit)")
        ->capture_default_str();
    insp = cli.add_subcommand("inspect",
                              "print per-language counts of the shards, verify their checksums "
                              "and (with data.tokenizer) decode them against SentencePiece");
    insp->add_option("--shards", inspect_dir, "shard folder (default: data.shards)");
    insp->add_option("--samples", inspect_samples, "segments decoded per shard")
        ->capture_default_str();
    bench_cmd = cli.add_subcommand(
        "bench",
        "assembled + masked tokens/s of MRTD and TRTD micro-batches on one core (data.*, "
        "train.micro_batch_tokens, objectives.mask_*), on --shards or on synthetic shards");
    bench_cmd->add_option("--shards", bench_args.shards,
                          "shard folder (default: synthetic shards in a temporary folder)");
    bench_cmd->add_option("--seconds", bench_args.seconds, "seconds per task")
        ->capture_default_str();
    bench_cmd
        ->add_option("--synthetic-tokens", bench_args.synthetic_tokens,
                     "mono tokens of the synthetic shards (para: half as many)")
        ->capture_default_str();
    xtreme_cmd = cli.add_subcommand(
        "xtreme",
        "write XTREME's processed udpos or panx files (<out>/<task>/{train,dev,test}-<lang>.tsv) "
        "from a UD release folder of .conllu files or the unpacked PAN-X (WikiAnn) folders");
    xtreme_cmd->add_option("--task", xtreme_args.task, "udpos or panx")
        ->required()
        ->check(CLI::IsMember(xlme::finetune::task_names(xlme::finetune::TaskFamily::kTagging)));
    xtreme_cmd
        ->add_option("--input", xtreme_args.input,
                     "udpos: a UD release folder (ud-treebanks-v2.5); panx: a folder of "
                     "<lang>/{train,dev,test} (each <lang>.tar.gz unpacked)")
        ->required();
    xtreme_cmd->add_option("--out", xtreme_args.out, "XTREME's download folder (finetune.data_dir)")
        ->required();
    xtreme_cmd
        ->add_option("--languages", xtreme_args.languages,
                     "comma-separated languages (default: the task's XTREME languages)")
        ->delimiter(',');
  };
  return xlme::run_app(
      argc, argv, spec,
      [&](const xlme::config::Config& cfg) {
        if (demo->parsed()) return demo_corpus(demo_options);
        if (spm->parsed()) return train_spm(cfg, spm_options);
        if (bin->parsed()) return binarize(cfg, bin_options);
        if (insp->parsed()) return inspect(cfg, inspect_dir, inspect_samples);
        if (bench_cmd->parsed()) return bench(cfg, bench_args);
        if (xtreme_cmd->parsed()) return xtreme(xtreme_args);
        spdlog::error(
            "xlme-data needs a command: demo-corpus, train-spm, binarize, inspect, bench, xtreme "
            "(see xlme-data --help)");
        return xlme::kExitUsage;
      },
      add_options);
}
