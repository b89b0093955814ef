// Start-up and set-up: the dry run changes nothing and names the sizes when it fails; --init-from
// loads weights with a report; the FLOPs count and the GPU peak table.
#include "xlme/checkpoint/manager.h"
#include "xlme/data/synthetic.h"
#include "xlme/train/init.h"
#include "xlme/train/performance.h"
#include "xlme/train/trainer.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::TempDir;

TEST(DryRun, DoesNotChangeTrainingResults) {
  const auto c = xlme::testing::tiny_train_config(4, 2, /*dropout=*/0.1);
  auto run = [&](bool dry) {
    data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 5);
    Trainer trainer(c, xlme::testing::make_tiny_model(c, 8), source,
                    xlme::testing::single_process());
    torch::manual_seed(123);
    if (dry) trainer.dry_run();
    for (int step = 0; step < 3; ++step) trainer.train_step();
    return trainer.model();
  };
  auto plain = run(false);
  auto dry = run(true);
  xlme::testing::expect_same_parameters(plain, dry, 0);
}

TEST(DryRun, NamesTheTaskAndSizesWhenItDoesNotFit) {
  auto c = xlme::testing::tiny_train_config(4, 1, 0.0);
  c.train.micro_batch_tokens = int64_t{1} << 40;  // 2^36 sequences of 16: no machine has that
  c.train.tokens_per_task = c.train.micro_batch_tokens;
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 5);
  Trainer trainer(c, xlme::testing::make_tiny_model(c, 8), source, xlme::testing::single_process());
  EXPECT_TRUE(contains_all(error_message([&] { trainer.dry_run(); }),
                           {"start-up dry run", "MRTD micro-batch of 68719476736 sequences x 16",
                            "train.micro_batch_tokens 1099511627776", "data.mono.max_len 16",
                            "M-parameter model", "does not fit in memory"}));
}

TEST(InitFrom, LoadsSelectedWeightsAndReports) {
  TempDir dir;
  const auto c = xlme::testing::tiny_train_config(4, 1, 0.0);
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 5);
  Trainer trainer(c, xlme::testing::make_tiny_model(c, 1), source, xlme::testing::single_process());
  trainer.train_step();
  const checkpoint::CheckpointManager manager(dir / "checkpoints", 2, 0);
  const std::string folder = trainer.save_checkpoint(manager);
  const auto weights = checkpoint_weights(folder);
  auto source_model = trainer.model();
  const auto names = source_model->named_parameters();
  EXPECT_TRUE(weights.count("discriminator.layers.0.attention.query.weight"));
  EXPECT_TRUE(weights.count("embeddings.token.weight"));

  auto fresh = xlme::testing::make_tiny_model(c, 2);
  const InitReport all = init_weights(fresh, weights, "all", folder);
  EXPECT_EQ(all.matched.size(), weights.size());
  EXPECT_TRUE(all.missing.empty() && all.unexpected.empty() && all.not_selected.empty());
  xlme::testing::expect_same_parameters(fresh, source_model, 0);

  auto partial = xlme::testing::make_tiny_model(c, 2);
  auto untouched = xlme::testing::make_tiny_model(c, 2);
  auto edited = weights;
  edited.erase("discriminator_head.output.bias");
  edited["discriminator.extra.weight"] = torch::zeros({2});
  const InitReport report = init_weights(partial, edited, "discriminator", "SRC");
  EXPECT_EQ(report.missing, std::vector<std::string>{"discriminator_head.output.bias"});
  EXPECT_EQ(report.unexpected, std::vector<std::string>{"discriminator.extra.weight"});
  for (const auto& item : partial->named_parameters()) {
    const bool generator = item.key().rfind("generator", 0) == 0;
    const bool missing = item.key() == "discriminator_head.output.bias";
    const torch::Tensor expected =
        generator || missing ? untouched->named_parameters()[item.key()] : names[item.key()];
    EXPECT_TRUE(torch::equal(item.value(), expected)) << item.key();
  }
  EXPECT_TRUE(
      contains_all(format_report(report, "SRC", "discriminator"),
                   {"init from SRC (train.init_parts=discriminator)", "tensors loaded",
                    "missing there (kept at initialization): discriminator_head.output.bias",
                    "unexpected (ignored): discriminator.extra.weight", "not selected"}));

  edited = weights;
  edited["discriminator.layers.0.attention.query.weight"] = torch::zeros({3, 5});
  auto before = xlme::testing::make_tiny_model(c, 2);
  EXPECT_TRUE(contains_all(error_message([&] { init_weights(before, edited, "all", "SRC"); }),
                           {"init from SRC", "discriminator.layers.0.attention.query.weight",
                            "shape [3, 5] there but [32, 32] in this model"}));
  xlme::testing::expect_same_parameters(before, untouched, 0);  // nothing copied
}

TEST(Performance, FlopsCountAndPeakTable) {
  auto c = xlme::testing::tiny_train_config(4, 1, 0.0);
  // Discriminator: H 32, F 64, 1 layer; generator the same (1 layer); V 64, E = H, r 0.15.
  const double layer = 2 * 4 * 32.0 * 32 + 2 * 2 * 32.0 * 64 + 2 * 2 * 16.0 * 32;
  const double expected =
      3 * (2 * layer + 0.15 * 2 * (32.0 * 32 + 32.0 * 64) + 2 * (32.0 * 32 + 32));
  EXPECT_DOUBLE_EQ(training_flops_per_token(c, 16), expected);
  EXPECT_DOUBLE_EQ(step_flops_per_token(c), expected);  // both tasks at max_len 16
  EXPECT_EQ(peak_bf16_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(peak_bf16_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_FALSE(peak_bf16_flops("cpu").has_value());
  // The job's FLOP/s over the job's peak: 4 H100s at 494.5 TFLOP/s of model work each are 50%.
  EXPECT_DOUBLE_EQ(*model_flops_utilization(4 * 494.5e12, "NVIDIA H100 80GB HBM3", 4), 0.5);
  EXPECT_DOUBLE_EQ(*model_flops_utilization(494.5e12, "NVIDIA H100 80GB HBM3", 1), 0.5);
  EXPECT_FALSE(model_flops_utilization(1e12, "cpu", 1).has_value());
  EXPECT_GT(peak_memory_mib(torch::kCPU), 1.0);
}

}  // namespace
}  // namespace xlme::train
