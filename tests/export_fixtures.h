// Tiny tokenizers and checkpoints for the export tests, made the way xlme-data and the trainer
// make them.
#pragma once

#include "xlme/checkpoint/manager.h"
#include "xlme/data/spm_trainer.h"
#include "xlme/data/synthetic.h"
#include "xlme/data/tokenizer.h"
#include "xlme/train/trainer.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace xlme::testing {

// A SentencePiece model in xlme's own layout (80 ids, <mask> included), trained on random words.
inline std::string train_tiny_tokenizer(const std::string& dir) {
  unsigned state = 7;
  auto next = [&state] { return (state = state * 1103515245u + 12345u) >> 16; };
  std::vector<std::string> words(150);
  for (auto& word : words) {
    for (unsigned n = 3 + next() % 5; n > 0; --n) word += static_cast<char>('a' + next() % 26);
  }
  std::ostringstream text;
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 8; ++w) text << (w ? " " : "") << words[next() % words.size()];
    text << "\n";
  }
  write_file(dir + "/corpus/mono/xx.txt", text.str());
  data::SpmTrainingOptions options;
  options.corpus_dir = dir + "/corpus";
  options.out_model = dir + "/spm.model";
  options.spm.vocab_size = 80;
  options.spm.character_coverage = 1.0;
  options.spm.max_sentences = 1000;
  data::train_sentencepiece(options);
  return options.out_model;
}

// The tiny model (2 layers, 32 wide) for `tokenizer`, with `overrides` on top.
inline config::Config tiny_export_config(const std::string& tokenizer,
                                         const std::vector<std::string>& overrides) {
  std::vector<std::string> sets{"model.hidden_size=32",
                                "model.layers=2",
                                "model.heads=4",
                                "model.ffn_size=48",
                                "model.max_positions=64",
                                "data.mono.max_len=16",
                                "data.para.max_len=16",
                                "finetune.max_len=64",
                                "model.generator.layers=1",
                                "model.dropout=0",
                                "model.attention_dropout=0",
                                "train.steps=3",
                                "train.warmup_steps=1",
                                "train.lr=1e-3",
                                "run.device=cpu",
                                "data.tokenizer=" + tokenizer};
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  config::Config c = config::load_config("", sets);
  c.model.vocab_size = data::Tokenizer(tokenizer, data::VocabLayout::kOwn).vocab_size();
  return c;
}

// Runs `command` through the shell; returns its exit code and stdout + stderr.
inline std::pair<int, std::string> shell(const std::string& command) {
  const TempDir scratch;
  const int status = std::system((command + " >" + quote(scratch / "out") + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(scratch / "out")};
}

// The error to report when `python` lacks one of `modules` (space-separated), or "" when it has
// them all. The modules are found, not imported: importing torch and transformers costs seconds
// in every test process, and the script the test runs imports them anyway.
inline std::string python_lacks(const std::string& python, const std::string& modules) {
  const auto [code, out] = shell(
      quote(python) +
      " -c 'import importlib.util, sys; missing = [m for m in sys.argv[1:] if "
      "importlib.util.find_spec(m) is None]; print(*missing); sys.exit(1 if missing else 0)' " +
      modules);
  if (code == 0) return "";
  const std::string missing = out.substr(0, out.find_last_not_of('\n') + 1);
  return python + " cannot import " + modules + " (missing: " + missing +
         "), which this test needs: run scripts/setup.sh (it installs requirements.txt into "
         ".venv), or configure with -DXLME_PYTHON=<a python with them>";
}

// Three rows of ids from the tokenizer's pieces: full length, and two padded ones.
struct ParityBatch {
  torch::Tensor ids, positions, padding;  // [B, T] int64, int64, bool
};

inline ParityBatch parity_batch(const data::SpecialIds& special, int64_t length) {
  torch::manual_seed(11);
  ParityBatch b;
  b.ids = torch::randint(4, special.vocab_size - 1, {3, length}, torch::kLong);
  b.padding = torch::zeros({3, length}, torch::kBool);
  const int64_t lengths[] = {length, 15, 7};
  for (int64_t row = 0; row < 3; ++row) {
    b.ids[row][0] = special.bos;
    b.ids[row][lengths[row] - 1] = special.eos;
    b.ids[row].narrow(0, lengths[row], length - lengths[row]).fill_(special.pad);
    b.padding[row].narrow(0, lengths[row], length - lengths[row]).fill_(true);
  }
  b.positions = torch::arange(length).unsqueeze(0).expand({3, length}).contiguous();
  return b;
}

// An architecture variant of the tiny model that the export tests run (export_parity_test.cpp
// against the PyTorch reference, hf_export_test.cpp through transformers).
struct ExportVariant {
  std::string name;                      // the test's name: "PreLn"
  std::string label;                     // what the test prints: "pre-LN"
  std::vector<std::string> overrides;    // on top of tiny_export_config
  std::vector<std::string> export_args;  // xlme-export's extra arguments
};

// Every variant, for INSTANTIATE_TEST_SUITE_P (export_variant_name names the tests).
inline const std::vector<ExportVariant>& export_variants() {
  static const std::vector<ExportVariant> variants = {
      {"PostLnGatedPerLayerTable", "post-LN gated", {}, {}},
      {"PreLn", "pre-LN", {"model.norm=pre"}, {}},
      {"PlainRelativeBiasWithoutAbsolutePositions",
       "plain bias, no absolute positions",
       {"model.relative_position.gated=false", "model.absolute_positions=false"},
       {}},
      // 16 buckets up to distance 12 < T = 24: the last buckets take every longer distance.
      {"SharedTableWithFewBuckets",
       "shared table",
       {"model.relative_position.shared_across_layers=true",
        "model.relative_position.num_buckets=16", "model.relative_position.max_distance=12"},
       {}},
      {"NoRelativeBias", "no relative bias", {"model.relative_position.enabled=false"}, {}},
      {"FactorizedEmbeddingsWithGdes",
       "factorized + gdes",
       {"model.embedding_size=16", "model.embedding_sharing=gdes"},
       {}},
      // ALBERT's sharing: the weights of layers.0 serve every depth, stored once.
      {"AlbertAllLayersShared",
       "all layers shared",
       {"model.share_layers=all", "model.embedding_size=16"},
       {}},
      {"AlbertAttentionShared", "attention shared", {"model.share_layers=attention"}, {}},
      {"AlbertFfnSharedPreLn",
       "ffn shared, pre-LN",
       {"model.share_layers=ffn", "model.norm=pre"},
       {}},
      {"MaskedLmBaseline", "mlm baseline", {"objectives.set=mlm"}, {}},
      // VECO: the cross-attention is plugged out; the export is the self-attention stack.
      {"VecoPlugOut",
       "VECO plugged out",
       {"objectives.set=veco", "model.cross_attention=true"},
       {}},
      {"Bf16Export", "bf16 export", {}, {"--dtype", "bf16"}},
      {"WithGenerator",
       "with generator",
       {"model.generator.hidden_size=16", "model.generator.heads=2"},
       {"--with-generator"}},
  };
  return variants;
}

// The test name of a variant (the third argument of INSTANTIATE_TEST_SUITE_P).
inline std::string export_variant_name(const ::testing::TestParamInfo<ExportVariant>& info) {
  return info.param.name;
}

// Whether the variant exports the generator too.
inline bool exports_generator(const ExportVariant& v) {
  return std::find(v.export_args.begin(), v.export_args.end(), "--with-generator") !=
         v.export_args.end();
}

struct TinyCheckpoint {
  std::string path;  // <run>/checkpoints/step_<N>
  model::ElectraModel model{nullptr};
};

// Trains config.train.steps steps on synthetic batches, moves every weight by N(0, perturb) (so
// that LayerNorm, biases and gates are far from their initial values), and saves a checkpoint
// with Trainer::save_checkpoint under `run_dir`/checkpoints.
inline TinyCheckpoint make_tiny_checkpoint(const config::Config& c, const std::string& run_dir,
                                           double perturb = 0.1, uint64_t seed = 3) {
  TinyCheckpoint out;
  out.model = make_tiny_model(c, seed);
  const auto special = data::SpecialIds::for_vocab(c.model.vocab_size);
  data::SyntheticBatches source(special, /*batch_size=*/2, /*length=*/16, /*mask_ratio=*/0.15,
                                seed);
  source.set_sentence_pairs(c.model.cross_attention);
  auto config = c;
  config.train.micro_batch_tokens = 32;
  config.train.tokens_per_task = 32;
  const torch::Device device =
      config.run.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  train::Trainer trainer(config, out.model, source, single_process(device));
  while (trainer.step() < config.train.steps) trainer.train_step();
  {
    // Its own stream: the perturbation does not depend on what training drew.
    torch::manual_seed(seed + 1000);
    torch::NoGradGuard no_grad;
    for (auto& p : out.model->parameters()) p.add_(torch::randn_like(p) * perturb);
  }
  const checkpoint::CheckpointManager manager(run_dir + "/checkpoints", 3, 0);
  out.path = trainer.save_checkpoint(manager);
  out.model->eval();
  return out;
}

// A test suite that shares one tiny tokenizer (in suite_dir()/tok) and one tiny trained checkpoint
// of tiny_export_config (in suite_dir()/run), made once (a tokenizer and a few training steps take
// a moment): `class MySuite : public TinyCheckpointSuite<MySuite>`. A suite may declare, public,
// `static constexpr double kPerturb` (the N(0, kPerturb) that make_tiny_checkpoint moves the
// trained weights by; 0.02 otherwise) and `static void prepare()` (its own set-up in suite_dir(),
// run once after the checkpoint). An own SetUp() calls TinyCheckpointSuite::SetUp() first. Each
// Suite has its own statics.
template <class Suite>
class TinyCheckpointSuite : public ::testing::Test {
 public:
  static constexpr double kPerturb = 0.02;
  static void prepare() {}

 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      tokenizer_ = new std::string(train_tiny_tokenizer((dir_->path() / "tok").string()));
      const auto c = tiny_export_config(*tokenizer_, {});
      checkpoint_ = new TinyCheckpoint(
          make_tiny_checkpoint(c, (dir_->path() / "run").string(), Suite::kPerturb));
      Suite::prepare();
    });
  }
  static void TearDownTestSuite() {
    delete checkpoint_;
    checkpoint_ = nullptr;
    delete tokenizer_;
    tokenizer_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { setup_.check(); }

  static const TempDir& suite_dir() { return *dir_; }
  static const std::string& tokenizer() { return *tokenizer_; }
  static const std::string& checkpoint() { return checkpoint_->path; }
  static TinyCheckpoint& tiny_checkpoint() { return *checkpoint_; }

 private:
  inline static SuiteSetUp setup_;
  inline static TempDir* dir_ = nullptr;
  inline static std::string* tokenizer_ = nullptr;
  inline static TinyCheckpoint* checkpoint_ = nullptr;
};

}  // namespace xlme::testing
