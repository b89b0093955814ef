// Value constraints used by the typed config structs (config.h): each field names its allowed
// values once, and the reader, the writer and the error messages all use that one description.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace xlme::config {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Integers in [min, max] (kNoLimit: unbounded above).
struct IntRange {
  int64_t min;
  int64_t max;

  bool contains(int64_t v) const { return v >= min && v <= max; }
  std::string describe() const;  // "an integer in [1, 65536]", "an integer >= 0"
};

// Real numbers between min and max, each end open or closed; never NaN or infinite.
struct RealRange {
  double min;
  double max;
  bool min_open = false;
  bool max_open = false;

  bool contains(double v) const;
  std::string describe() const;  // "a number in (0, 1]"
};

// One of a fixed set of strings.
struct Choices {
  Choices(std::initializer_list<std::string> v) : values(v) {}
  // The names of a registry's table (task_names(), objective_set_names()).
  explicit Choices(std::vector<std::string> v) : values(std::move(v)) {}

  bool contains(const std::string& v) const;
  std::string describe() const;  // "one of: post, pre"

  std::vector<std::string> values;
};

}  // namespace xlme::config
