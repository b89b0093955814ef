// The communication estimate of xlme-pretrain --comm-estimate, against the ring
// all-reduce formula computed by hand.
#include "xlme/train/comm_estimate.h"

#include "test_util.h"

#include <gtest/gtest.h>

namespace xlme::train {
namespace {

TEST(CommEstimate, RingAllReduceOverTheSlowestLink) {
  const double bytes = 4.0 * 307268179;  // Base's fp32 gradients
  const auto rows = estimate_communication(bytes, {8, 64});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].link, "NVLink 4 (450 GB/s)");
  EXPECT_DOUBLE_EQ(rows[0].bytes_per_gpu, 2.0 * 7 / 8 * bytes);
  EXPECT_NEAR(rows[0].seconds, 4.78e-3, 0.01e-3);
  EXPECT_EQ(rows[1].link, "InfiniBand 400 Gb/s (50 GB/s)");
  EXPECT_NEAR(rows[1].seconds, 48.39e-3, 0.01e-3);
}

TEST(CommEstimate, TheTableNamesTheModelsBytesAndTheEmbeddingsShare) {
  auto c = config::load_config(std::string(XLME_SOURCE_DIR) + "/configs/model/base.yaml");
  const std::string table = format_communication_estimate(c);
  EXPECT_TRUE(xlme::testing::contains_all(
      table, {"307.3M trained parameters, 1.229 GB of fp32 gradients", "4.8 ms", "48.4 ms",
              "the shared embeddings (192.4M parameters, 63% of the bytes)",
              "AdamW state per GPU: 2.46 GB (train.zero=0)", "0.038 GB on 64"}))
      << table;
}

}  // namespace
}  // namespace xlme::train
