// train.cuda_graphs without a GPU: the choice and the sentence said at start, and what the graphs
// need of the gradient buckets (memory kept at the same address, the hooks a capture ran recorded,
// presence marked after a replay). The capture and the replays themselves are CUDA's:
// tests/integration/cuda_test.cpp (CudaGraphs.*), run by scripts/gpu_check.sh.
#include "xlme/train/micro_batch_graphs.h"

#include "xlme/train/gradient_buckets.h"
#include "xlme/train/trainer.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <spdlog/sinks/ostream_sink.h>

#include <gtest/gtest.h>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;

TEST(CudaGraphsChoice, OnOnlyWhenSetOnForACudaElectraOrMaskedLmRun) {
  const torch::Device cuda(torch::kCUDA, 0);  // a device name: no GPU is touched
  auto c = xlme::testing::tiny_train_config(4, 2, 0.1);
  c.train.cuda_graphs = "on";
  const auto on = MicroBatchGraphs::choose(c, cuda);
  EXPECT_TRUE(on.on);
  EXPECT_TRUE(contains_all(on.reason, {"on: every micro-batch of a step but the last",
                                       "after 2 eager ones", "padded to one count"}))
      << on.reason;
  c.objectives.set = "mlm";
  EXPECT_TRUE(MicroBatchGraphs::choose(c, cuda).on);

  const auto cpu = MicroBatchGraphs::choose(c, torch::kCPU);
  EXPECT_FALSE(cpu.on);
  EXPECT_EQ(cpu.reason, "off: the device is cpu (CUDA graphs are CUDA's)");

  for (const std::string set : {"veco", "distill"}) {
    c.objectives.set = set;
    const auto other = MicroBatchGraphs::choose(c, cuda);
    EXPECT_FALSE(other.on) << set;
    EXPECT_TRUE(contains_all(other.reason, {"off: objectives.set=" + set})) << other.reason;
  }
  c.objectives.set = "xlme";

  c.train.cuda_graphs = "auto";
  const auto automatic = MicroBatchGraphs::choose(c, cuda);
  EXPECT_FALSE(automatic.on);
  EXPECT_TRUE(contains_all(automatic.reason, {"a capture cannot hold the fused random ops",
                                              "train.cuda_graphs=on uses them"}))
      << automatic.reason;
  c.train.cuda_graphs = "off";
  EXPECT_EQ(MicroBatchGraphs::choose(c, cuda).reason, "off (train.cuda_graphs=off)");
}

TEST(CudaGraphsChoice, ACpuTrainerSaysWhyItHasNone) {
  auto c = xlme::testing::tiny_train_config(4, 2, 0.0);
  c.train.cuda_graphs = "on";
  data::SyntheticBatches source(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 11);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  Trainer trainer(c, xlme::testing::make_tiny_model(c, 1), source, xlme::testing::single_process());
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(trainer.cuda_graphs(), nullptr);
  EXPECT_TRUE(contains_all(log.str(), {"cuda graphs: off: the device is cpu"})) << log.str();
  trainer.train_step();  // the eager step, unpadded
}

TEST(CudaGraphsChoice, TheConfigKeyTakesAutoOnOrOff) {
  EXPECT_EQ(config::load_config("", {}).train.cuda_graphs, "auto");
  EXPECT_EQ(config::load_config("", {"train.cuda_graphs=on"}).train.cuda_graphs, "on");
  EXPECT_TRUE(contains_all(
      xlme::testing::error_message([] { config::load_config("", {"train.cuda_graphs=yes"}); }),
      {"train.cuda_graphs", "yes", "auto", "on", "off"}));
}

// Two parameters in their buckets; a backward through `a` alone.
struct TwoParameters {
  torch::Tensor a = torch::ones({3}).requires_grad_();
  torch::Tensor b = torch::ones({2}).requires_grad_();
  std::shared_ptr<dist::Communicator> comm = xlme::testing::single_process();
  GradientBuckets buckets{{a, b}, 1 << 20, *comm, GradientBuckets::Reduction::kAllReduce};
};

TEST(CudaGraphsBuckets, KeptBucketsStayAtTheirAddressAndAreZeroedAgain) {
  TwoParameters p;
  p.buckets.attach();
  (p.a * 2).sum().backward();
  EXPECT_TRUE(torch::equal(p.a.grad(), torch::full({3}, 2.0)));
  p.buckets.release();  // without keep_allocated: freed
  p.buckets.attach();
  EXPECT_TRUE(torch::equal(p.a.grad(), torch::zeros({3})));

  p.buckets.keep_allocated(true);
  p.buckets.attach();
  const void* kept = p.a.grad().data_ptr();
  (p.a * 3).sum().backward();
  p.a.mutable_grad() = torch::Tensor();
  p.buckets.release();
  p.buckets.attach();
  EXPECT_EQ(p.a.grad().data_ptr(), kept);
  EXPECT_TRUE(torch::equal(p.a.grad(), torch::zeros({3})));
}

TEST(CudaGraphsBuckets, TheHooksOfARecordedBackwardAreListedAndMarkedPresentAgain) {
  TwoParameters p;
  p.buckets.attach();
  p.buckets.start_recording();
  (p.b * 5).sum().backward();
  const auto recorded = p.buckets.stop_recording();
  EXPECT_EQ(recorded, (std::vector<std::size_t>{1}));
  EXPECT_FALSE(p.buckets.present(0));
  EXPECT_TRUE(p.buckets.present(1));
  (p.a * 5).sum().backward();  // not recorded
  EXPECT_TRUE(p.buckets.present(0));

  p.buckets.attach();  // a new step: nothing present, as after a replay that runs no hook
  EXPECT_FALSE(p.buckets.present(1));
  p.buckets.mark_present(recorded);
  EXPECT_FALSE(p.buckets.present(0));
  EXPECT_TRUE(p.buckets.present(1));
}

}  // namespace
}  // namespace xlme::train
