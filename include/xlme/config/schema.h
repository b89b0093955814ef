// Value constraints used by the typed config structs (config.h): each field names its allowed
// values once, and the reader, the writer and the error messages all use that one description.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
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

// One of a fixed set of names, held as the enum E: the readers parse the name once, where they
// read it, and code compares enum values, never strings. Lists every value of E with its spelling,
// in the order the reference shows them.
template <class E>
struct Named {
  Named(std::initializer_list<std::pair<const char*, E>> v) : names(v) {}

  // The spellings, as the reader's and the reference's constraint.
  Choices choices() const {
    std::vector<std::string> spellings;
    for (const auto& name : names) spellings.emplace_back(name.first);
    return Choices(std::move(spellings));
  }
  // The spelling of `value`; empty for a value the list lacks (an out-of-range cast).
  std::string name(E value) const {
    for (const auto& name : names)
      if (name.second == value) return name.first;
    return {};
  }
  // The value spelled `spelling`; nullopt for a spelling the list lacks.
  std::optional<E> value(const std::string& spelling) const {
    for (const auto& name : names)
      if (spelling == name.first) return name.second;
    return std::nullopt;
  }

  std::vector<std::pair<const char*, E>> names;
};

}  // namespace xlme::config
