// Counter-based random numbers and the language sampler of the batch pipeline (batches.h).
// Every random choice of a batch is a function of a key (seed, task, position in the data), not
// of a generator's history, so that the batches do not depend on thread counts and a reader's
// state stays a handful of integers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace xlme::data {

// SplitMix64's finalizer: a well-mixed 64-bit function of `x`.
uint64_t mix64(uint64_t x);

// A hash of several words (the key of one random decision: seed, task, round, rank, ...).
uint64_t hash_key(std::initializer_list<uint64_t> words);

// FNV-1a of a name (languages enter keys by name, not by their index in a list).
uint64_t hash_name(std::string_view name);

// xoshiro256** seeded from a key: a fast generator for the choices inside one batch.
class Rng {
 public:
  explicit Rng(uint64_t key);

  uint64_t next();
  double uniform();                // [0, 1), 53 bits
  uint64_t below(uint64_t bound);  // [0, bound), bound > 0

 private:
  uint64_t s_[4];
};

// Picks languages (or pairs) with p_j ∝ m_j^alpha (docs/ARCHITECTURE.md#data), m_j their sizes.
class LanguageSampler {
 public:
  // `sizes` > 0, alpha in (0, 1]; throws xlme::Error otherwise.
  LanguageSampler(const std::vector<double>& sizes, double alpha);

  const std::vector<double>& probabilities() const { return probabilities_; }

  // The language whose slice of [0, 1) holds `u`.
  int64_t pick(double u) const;

 private:
  std::vector<double> probabilities_;
  std::vector<double> cumulative_;  // cumulative_[j] = p_0 + ... + p_j, the last one exactly 1
};

}  // namespace xlme::data
