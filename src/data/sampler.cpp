#include "xlme/data/sampler.h"

#include "xlme/common/error.h"

#include <algorithm>
#include <cmath>

namespace xlme::data {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t hash_key(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x243f6a8885a308d3ULL;
  for (const uint64_t w : words) h = mix64(h ^ mix64(w));
  return h;
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

Rng::Rng(uint64_t key) {
  for (auto& s : s_) {
    key += 0x9e3779b97f4a7c15ULL;
    s = mix64(key);
  }
}

uint64_t Rng::next() {
  const auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

uint64_t Rng::below(uint64_t bound) {
  // Lemire's multiply-shift; the bias (bound / 2^64) is far below anything a batch can show.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
}

LanguageSampler::LanguageSampler(const std::vector<double>& sizes, double alpha) {
  XLME_CHECK(alpha > 0 && alpha <= 1,
             "the sampling exponent alpha must be in (0, 1], got {}; set "
             "data.mono.sampling_exponent / data.para.sampling_exponent",
             alpha);
  XLME_CHECK(!sizes.empty(), "no languages to sample from");
  double total = 0;
  for (const double m : sizes) {
    XLME_CHECK(m > 0, "a language of size {} cannot be sampled: every size must be > 0", m);
    probabilities_.push_back(std::pow(m, alpha));
    total += probabilities_.back();
  }
  double sum = 0;
  for (auto& p : probabilities_) {
    p /= total;
    sum += p;
    cumulative_.push_back(sum);
  }
  cumulative_.back() = 1.0;
}

int64_t LanguageSampler::pick(double u) const {
  const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
  return std::min<int64_t>(it - cumulative_.begin(), static_cast<int64_t>(cumulative_.size()) - 1);
}

}  // namespace xlme::data
