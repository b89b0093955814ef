// xlme's own vectorized CPU math against std::exp and naive loops.
#include "xlme/common/cpu_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace xlme {
namespace {

// The float32 exponentials: within 2 ulp of std::exp wherever e^x is a normal float, 0 below
// (-inf included), NaN for NaN; the sum is the sum of the written values.
TEST(ExpShiftedSum, Float32WithinTwoUlpOfStdExp) {
  std::vector<float> x;
  for (int i = 0; i <= 2000; ++i) x.push_back(-90.0f + 90.0f * static_cast<float>(i) / 2000);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(-1e-30f);
  const float shift = 0.5f;
  for (auto& v : x) v += shift;  // x - shift in [-90, 0]
  const auto input = x;
  const float sum = cpu::exp_shifted_sum(x.data(), static_cast<int64_t>(x.size()), shift);
  double written = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double arg = static_cast<double>(input[i]) - shift;
    const double expected = std::exp(arg);
    written += x[i];
    if (expected < std::numeric_limits<float>::min()) {
      EXPECT_LE(x[i], std::numeric_limits<float>::min()) << arg;
      continue;
    }
    const double ulp =
        std::nextafter(static_cast<float>(expected), std::numeric_limits<float>::infinity()) -
        static_cast<float>(expected);
    EXPECT_LE(std::abs(x[i] - expected), 2 * ulp) << "exp(" << arg << ")";
  }
  EXPECT_EQ(x[x.size() - 2], 0.0f);  // -inf
  EXPECT_NEAR(sum, written, 1e-5 * written);
  float nan[9] = {0, 0, 0, std::numeric_limits<float>::quiet_NaN(), 0, 0, 0, 0, 0};
  cpu::exp_shifted_sum(nan, 9, 0.0f);
  EXPECT_TRUE(std::isnan(nan[3]));
  EXPECT_EQ(nan[0], 1.0f);
}

TEST(ExpShiftedTotal, EqualsTheSumOfTheWrittenExponentials) {
  for (const int64_t n : {1, 7, 8, 9, 16000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) x[j] = std::sin(0.37f * j) * 20.0f;
    const float shift = 21.0f;
    auto written = x;
    const float sum = cpu::exp_shifted_sum(written.data(), n, shift);
    EXPECT_EQ(cpu::exp_shifted_total(x.data(), n, shift), sum) << n;
    double expected = 0;
    for (const float v : x) expected += std::exp(static_cast<double>(v) - shift);
    EXPECT_NEAR(sum, expected, 1e-5 * expected) << n;
    std::vector<double> xd(x.begin(), x.end());
    EXPECT_NEAR(cpu::exp_shifted_total(xd.data(), n, 21.0), expected, 1e-12 * expected) << n;
  }
}

// The first index of the maximum (ties: the lowest), NaN skipped, as a naive scan.
TEST(RowMax, FirstIndexOfTheLargestSkippingNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(37);
  for (size_t j = 0; j < x.size(); ++j) x[j] = std::cos(1.3f * static_cast<float>(j));
  x[5] = 3.0f;
  x[30] = 3.0f;  // tie: 5 wins
  x[2] = nan;
  auto m = cpu::row_max(x.data(), 37);
  EXPECT_EQ(m.value, 3.0f);
  EXPECT_EQ(m.index, 5);
  x[33] = inf;  // in the scalar tail of the 8-lane loop
  m = cpu::row_max(x.data(), 37);
  EXPECT_EQ(m.index, 33);
  std::vector<float> minus_inf(9, -inf);
  EXPECT_EQ(cpu::row_max(minus_inf.data(), 9).index, 0);
  std::vector<float> nans(12, nan);
  EXPECT_TRUE(std::isnan(cpu::row_max(nans.data(), 12).value));
  std::vector<double> xd(x.begin(), x.end());
  EXPECT_EQ(cpu::row_max(xd.data(), 37).index, 33);
}

}  // namespace
}  // namespace xlme
