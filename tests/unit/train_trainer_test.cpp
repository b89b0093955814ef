// The trainer's step: gradient accumulation equals one larger batch, a resumed run equals an
// uninterrupted one bit for bit, non-finite updates are skipped and counted, and losses fall.
#include "xlme/train/trainer.h"

#include "xlme/data/synthetic.h"
#include "xlme/train/performance.h"
#include "xlme/train/rng.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <spdlog/sinks/ostream_sink.h>

#include <atomic>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::expect_same_parameters;
using xlme::testing::single_process;
using xlme::testing::TempDir;

config::Config tiny_config(int64_t batch, int64_t micro_batches, double dropout) {
  return xlme::testing::tiny_train_config(batch, micro_batches, dropout);
}

model::ElectraModel make_model(const config::Config& c, uint64_t seed) {
  return xlme::testing::make_tiny_model(c, seed);
}

data::SyntheticBatches make_source(const config::Config& c, int64_t batch) {
  return data::SyntheticBatches(data::SpecialIds::for_vocab(c.model.vocab_size), batch, 16, 0.15,
                                /*seed=*/11);
}

TEST(Trainer, MicroBatchCountFollowsTheTokenBudget) {
  auto c = tiny_config(4, 3, 0.0);
  auto source = make_source(c, 4);
  Trainer trainer(c, make_model(c, 1), source, single_process());
  EXPECT_EQ(trainer.micro_batches_per_task(), 3);
}

TEST(Trainer, AccumulatedMicroBatchesEqualOneLargerBatch) {
  // Near-zero temperature makes replacement sampling an argmax, the same whether one batch of 8
  // or two of 4 draw the noise; dropout is off.
  auto small = tiny_config(/*batch=*/4, /*micro_batches=*/2, 0.0);
  auto large = tiny_config(/*batch=*/8, /*micro_batches=*/1, 0.0);
  small.model.generator.sampling_temperature = large.model.generator.sampling_temperature = 1e-6;
  auto small_source = make_source(small, 4);
  auto large_source = make_source(large, 8);
  Trainer accumulated(small, make_model(small, 3), small_source, single_process());
  Trainer direct(large, make_model(large, 3), large_source, single_process());
  for (int step = 0; step < 2; ++step) {
    const StepRecord a = accumulated.train_step();
    const StepRecord b = direct.train_step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * std::abs(b.loss));
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * b.grad_norm);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.terms.at("mlm").at("accuracy"), b.terms.at("mlm").at("accuracy"));
  }
  expect_same_parameters(accumulated.model(), direct.model(), 1e-6);
}

// The record's term sums are those of the step's micro-batches: counts as the batches hold them,
// the summaries and L computed from those sums.
TEST(Trainer, StepRecordSumsAreTheMicroBatchesSums) {
  auto c = tiny_config(4, 2, 0.0);
  c.objectives.rtd_weight = 30.0;
  auto source = make_source(c, 4);
  Trainer trainer(c, make_model(c, 2), source, single_process());
  const StepRecord record = trainer.train_step();
  auto again = make_source(c, 4);  // the same stream: 2 micro-batches of each task
  double masked[2] = {0, 0};
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      masked[t] +=
          again.next(t == 0 ? data::Task::kMono : data::Task::kPara).masked.sum().item<double>();
    }
  }
  ASSERT_EQ(record.sums.names(), (std::vector<std::string>{"mlm", "mrtd", "tlm", "trtd"}));
  // Per term [loss, count, statistics...]: mlm 3, mrtd 6, tlm 3, trtd 6 values.
  const auto flat = record.sums.flatten(torch::kCPU);
  EXPECT_EQ(flat[1].item<double>(), masked[0]);    // mlm: masked positions
  EXPECT_EQ(flat[4].item<double>(), 2 * 4 * 16);   // mrtd: real tokens
  EXPECT_EQ(flat[10].item<double>(), masked[1]);   // tlm
  EXPECT_EQ(flat[13].item<double>(), 2 * 4 * 16);  // trtd
  EXPECT_EQ(record.sums.summary(), record.terms);
  const auto& t = record.terms;
  EXPECT_NEAR(record.loss,
              t.at("mlm").at("loss") + t.at("tlm").at("loss") +
                  30.0 * (t.at("mrtd").at("loss") + t.at("trtd").at("loss")),
              1e-9 * record.loss);
  EXPECT_EQ(record.tokens, 2 * 2 * 4 * 16);
  std::vector<std::string> phases;
  for (const auto& [phase, seconds] : record.seconds) phases.push_back(phase);
  EXPECT_EQ(phases, (std::vector<std::string>{"backward", "communication", "data", "forward",
                                              "optimizer"}));
}

// The objective set's row decides what a step reads: mlm trains on monolingual text alone.
TEST(Trainer, MaskedLmSetReadsOnlyMonolingualBatches) {
  auto c = tiny_config(4, 2, 0.0);
  c.objectives.set = "mlm";
  auto source = make_source(c, 4);
  Trainer trainer(c, make_model(c, 2), source, single_process());
  const StepRecord record = trainer.train_step();
  EXPECT_EQ(source.state(), "8 0");  // 2 micro-batches of 4 monolingual sequences, no pairs
  ASSERT_EQ(record.terms.size(), 1u);
  EXPECT_EQ(record.loss, record.terms.at("mlm").at("loss"));
  EXPECT_EQ(record.tokens, 2 * 4 * 16);
}

// MFU counts each micro-batch's attention at its own length, not at data.*.max_len.
TEST(Trainer, StepFlopsCountEachMicroBatchAtItsLength) {
  auto c = tiny_config(2, 2, 0.0);
  c.data.mono.max_len = c.data.para.max_len = 64;  // the synthetic sequences are 16 long
  auto source = make_source(c, 2);
  Trainer trainer(c, make_model(c, 1), source, single_process());
  const StepRecord record = trainer.train_step();
  EXPECT_EQ(record.tokens, 2 * 2 * 2 * 16);  // 2 tasks x 2 micro-batches x 2 sequences x 16
  EXPECT_DOUBLE_EQ(record.flops,
                   static_cast<double>(record.tokens) * training_flops_per_token(c, 16));
  EXPECT_LT(record.flops, static_cast<double>(record.tokens) * step_flops_per_token(c));
}

// run.seed makes the model, identical on every rank; dropout and sampling then draw from the
// rank's own stream (every rank used to draw the same dropout masks and sampling noise).
TEST(Trainer, EachRankDrawsFromItsOwnStream) {
  auto c = tiny_config(2, 1, 0.1);
  c.run.seed = 7;
  auto source = make_source(c, 2);
  Trainer trainer(c, make_model(c, 7), source, single_process());
  EXPECT_EQ(at::detail::getDefaultCPUGenerator().current_seed(), training_seed(7, 0));
  EXPECT_NE(training_seed(7, 0), 7u);  // not the initialization's stream again
  EXPECT_NE(training_seed(7, 0), training_seed(7, 1));
}

TEST(Trainer, ResumedRunEqualsTheUninterruptedRun) {
  const auto c = tiny_config(4, 2, /*dropout=*/0.1);
  TempDir dir;
  auto straight_source = make_source(c, 4);
  Trainer straight(c, make_model(c, 5), straight_source, single_process());
  for (int i = 0; i < 4; ++i) straight.train_step();

  std::string checkpoint;
  {
    auto source = make_source(c, 4);
    Trainer first(c, make_model(c, 5), source, single_process());
    first.train_step();
    first.train_step();
    checkpoint = first.save_checkpoint(checkpoint::CheckpointManager(dir / "ckpt", 2, 0));
    first.train_step();  // work after the checkpoint, lost by the "crash"
  }
  torch::manual_seed(999);  // the resumed process starts from other random state
  auto source = make_source(c, 4);
  Trainer resumed(c, make_model(c, 6), source, single_process());
  resumed.load_checkpoint(checkpoint::CheckpointManager::verify(checkpoint));
  EXPECT_EQ(resumed.step(), 2);
  resumed.train_step();
  resumed.train_step();
  EXPECT_EQ(resumed.step(), straight.step());
  EXPECT_EQ(resumed.tokens_seen(), straight.tokens_seen());
  expect_same_parameters(resumed.model(), straight.model(), /*atol=*/0);
}

// The bytes this process has read through read() so far (/proc/self/io rchar): page-cache hits
// count too, so it measures how often a file is read, not whether the disk was touched.
int64_t bytes_read_by_this_process() {
  std::ifstream in("/proc/self/io");
  for (std::string key; in >> key;) {
    int64_t value = 0;
    in >> value;
    if (key == "rchar:") return value;
  }
  ADD_FAILURE() << "/proc/self/io has no rchar";
  return 0;
}

// A resume verifies each file once (CheckpointManager::verify, CRC32) and then reads each file
// once to load it: the archive's record check and LibTorch's reader parse the same bytes.
// Before, the loader verified the checkpoint again and read every archive twice (about 4x).
TEST(Trainer, ResumeReadsEachFileOnceAfterVerifyingItOnce) {
  const auto c = tiny_config(4, 1, 0.0);
  TempDir dir;
  auto source = make_source(c, 4);
  Trainer first(c, make_model(c, 5), source, single_process());
  first.train_step();
  const std::string path = first.save_checkpoint(checkpoint::CheckpointManager(dir / "ckpt", 2, 0));
  int64_t checkpoint_bytes = 0;
  for (const auto& entry : fs::directory_iterator(path)) {
    checkpoint_bytes += static_cast<int64_t>(entry.file_size());
  }
  Trainer resumed(c, make_model(c, 6), source, single_process());
  const int64_t before = bytes_read_by_this_process();
  resumed.load_checkpoint(checkpoint::CheckpointManager::verify(path));
  const int64_t read = bytes_read_by_this_process() - before;
  EXPECT_GE(read, checkpoint_bytes);  // every file is read by verify
  EXPECT_LT(read, 2 * checkpoint_bytes + (64 << 10))
      << "verify + load read " << read << " bytes of a " << checkpoint_bytes << "-byte checkpoint";
  EXPECT_EQ(resumed.step(), 1);
}

// Batches whose reader state cannot be taken once `fail` is set: a save that fails while the
// ranks write their own files.
class FailingStateBatches : public data::SyntheticBatches {
 public:
  using data::SyntheticBatches::SyntheticBatches;
  std::string state() const override {
    XLME_CHECK(!fail, "reader state unavailable");
    return data::SyntheticBatches::state();
  }
  bool fail = false;
};

// The trainer saves through CheckpointManager::save: a failure while the ranks write their reader
// and RNG files (before, outside the save's clean-up) leaves no temporary folder, and the earlier
// checkpoint as it was.
TEST(Trainer, SaveThatFailsWritingTheRankFilesLeavesNoTemporaryFolder) {
  const auto c = tiny_config(4, 1, 0.0);
  TempDir dir;
  FailingStateBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 11);
  Trainer trainer(c, make_model(c, 5), source, single_process());
  const checkpoint::CheckpointManager manager(dir / "ckpt", 5, 0);
  trainer.train_step();
  const std::string earlier = trainer.save_checkpoint(manager);
  trainer.train_step();
  source.fail = true;
  EXPECT_EQ(error_message([&] { trainer.save_checkpoint(manager); }), "reader state unavailable");
  EXPECT_FALSE(fs::exists(manager.temporary_path_for(2)));
  EXPECT_FALSE(fs::exists(manager.path_for(2)));
  EXPECT_NO_THROW(checkpoint::CheckpointManager::verify(earlier));
}

TEST(Trainer, NonFiniteGradientSkipsTheUpdateAndCounts) {
  auto c = tiny_config(4, 1, 0.0);
  c.train.max_bad_steps = 2;
  auto source = make_source(c, 4);
  Trainer trainer(c, make_model(c, 7), source, single_process());
  // A tensor hook on a bias (a weight's hook would see the empty gradient that weight_grad's
  // fused form hands autograd after adding the real one into .grad: ops/weight_gradient.h).
  auto& weight = trainer.model()->discriminator_head->output->bias;
  std::vector<torch::Tensor> before;
  for (const auto& p : trainer.model()->parameters()) before.push_back(p.detach().clone());

  const auto hook = weight.register_hook(
      [](torch::Tensor grad) { return grad * std::numeric_limits<float>::quiet_NaN(); });
  const StepRecord bad = trainer.train_step();
  EXPECT_TRUE(bad.skipped);
  EXPECT_EQ(trainer.skipped_steps(), 1);
  const auto after = trainer.model()->parameters();
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i]));

  weight.remove_hook(hook);
  const StepRecord good = trainer.train_step();  // resets the run of bad steps
  EXPECT_FALSE(good.skipped);
  EXPECT_FALSE(torch::equal(trainer.model()->parameters()[0], before[0]));

  weight.register_hook(
      [](torch::Tensor grad) { return grad * std::numeric_limits<float>::infinity(); });
  EXPECT_TRUE(trainer.train_step().skipped);
  EXPECT_TRUE(contains_all(error_message([&] { trainer.train_step(); }),
                           {"2 optimizer steps in a row had a non-finite loss or gradient norm",
                            "train.max_bad_steps"}));
  EXPECT_EQ(trainer.skipped_steps(), 3);
}

TEST(Trainer, AllFourLossesFallOnALearnableStream) {
  // The same micro-batch every step: something the tiny model can memorize.
  auto c = tiny_config(4, 1, 0.0);
  c.train.lr = 3e-3;
  c.train.warmup_steps = 2;
  c.train.steps = 60;
  xlme::testing::RepeatingBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16,
                                         0.15, 11);
  Trainer trainer(c, make_model(c, 8), source, single_process());
  const StepRecord first = trainer.train_step();
  StepRecord last;
  for (int i = 1; i < 60; ++i) last = trainer.train_step();
  for (const char* term : {"mlm", "tlm", "mrtd", "trtd"}) {
    EXPECT_LT(last.terms.at(term).at("loss"), first.terms.at(term).at("loss")) << term;
  }
  EXPECT_GT(last.terms.at("mlm").at("accuracy"), first.terms.at("mlm").at("accuracy"));
}

// Casts of a parameter (a leaf that requires a gradient) to another dtype during one train_step.
int64_t parameter_casts_in_one_step(Trainer& trainer) {
  std::atomic<int64_t> casts{0};
  // The callback is a plain function: what it reads is static. Only the model's parameters count
  // (the backward's casts of activations, e.g. weight_grad's fp32 operands on the CPU, do not).
  static std::atomic<int64_t>* counter = nullptr;
  static std::set<const void*> parameters;
  counter = &casts;
  parameters.clear();
  for (const auto& p : trainer.model()->parameters()) parameters.insert(p.unsafeGetTensorImpl());
  const auto counting = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            if (std::string(fn.name()) != "aten::_to_copy") return nullptr;
            const auto inputs = fn.inputs();
            if (!inputs.empty() && inputs[0].isTensor() &&
                parameters.count(inputs[0].toTensor().unsafeGetTensorImpl()) != 0) {
              ++*counter;
            }
            return nullptr;
          })
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION}));
  trainer.train_step();
  at::removeCallback(counting);
  counter = nullptr;
  return casts.load();
}

TEST(Trainer, Bf16WeightsAreCastOncePerStepNotPerMicroBatch) {
  // The same model and tokens, in 1 micro-batch of 4 sequences and in 4 of 1, under bf16 autocast:
  // autocast's cast of each weight is made once per step either way.
  std::vector<int64_t> casts;
  for (const int64_t micro_batches : {1, 4}) {
    auto c = tiny_config(4 / micro_batches, micro_batches, 0.0);
    c.train.precision = "bf16";
    auto source = make_source(c, 4 / micro_batches);
    Trainer trainer(c, make_model(c, 1), source, single_process());
    ASSERT_TRUE(trainer.bf16());
    trainer.train_step();  // warm-up
    casts.push_back(parameter_casts_in_one_step(trainer));
  }
  EXPECT_GT(casts[0], 10) << "autocast cast no weight: is the step under bf16 autocast?";
  EXPECT_EQ(casts[1], casts[0]) << "weights cast again in every micro-batch";
}

// train.tokens_per_task that is not a whole number of micro-batches over the ranks is rounded up,
// and the start-up log says so with both numbers and the world size (Base on 24 GPUs would
// otherwise train +12.5% tokens per step without a word); an even split says nothing.
TEST(Trainer, RoundedGlobalBatchIsLoggedAtStart) {
  auto start_log = [](int64_t tokens_per_task, const std::string& rounding) {
    auto c = tiny_config(4, 1, 0.0);  // micro_batch_tokens = 64
    c.train.tokens_per_task = tokens_per_task;
    c.train.batch_rounding = rounding;
    auto source = make_source(c, 4);
    std::ostringstream log;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
    spdlog::default_logger()->sinks().push_back(sink);
    Trainer trainer(c, make_model(c, 1), source, single_process());
    spdlog::default_logger()->sinks().pop_back();
    return std::make_pair(trainer.micro_batches_per_task(), log.str());
  };
  const auto [rounded, warning] = start_log(160, "up");
  EXPECT_EQ(rounded, 3);
  EXPECT_TRUE(contains_all(
      warning,
      {"tokens per step: 192 per task", "3 micro-batch(es) of train.micro_batch_tokens = 64",
       "on each of 1 rank(s)", "train.tokens_per_task = 160", "rounded up", "+20.0%"}))
      << warning;
  const auto [down, down_warning] = start_log(160, "down");
  EXPECT_EQ(down, 2);
  EXPECT_TRUE(
      contains_all(down_warning, {"tokens per step: 128 per task", "rounded down", "-20.0%"}))
      << down_warning;
  // The tokens per step are said at start whether or not they were rounded.
  const auto [even, said] = start_log(128, "error");
  EXPECT_EQ(even, 2);
  EXPECT_TRUE(contains_all(said, {"tokens per step: 128 per task", "= train.tokens_per_task"}))
      << said;
  // train.batch_rounding=error (the default) refuses, naming the world sizes that divide it.
  EXPECT_TRUE(contains_all(error_message([&] { start_log(160, "error"); }),
                           {"train.tokens_per_task = 160 is not a whole number of micro-batches "
                            "over 1 rank(s)",
                            "none: train.tokens_per_task is not a multiple of "
                            "train.micro_batch_tokens",
                            "train.batch_rounding=up (3 per rank, 192 tokens per step, +20.0%)",
                            "down (2 per rank, 128 tokens per step, -20.0%)"}));
}

}  // namespace
}  // namespace xlme::train
