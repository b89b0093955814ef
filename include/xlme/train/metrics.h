// One JSON object per line in <run>/metrics.jsonl, for scripts/plot_metrics.py and any tool
// that reads JSON lines. Records keep their keys in insertion order.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

namespace xlme::train {

class MetricsRecord {
 public:
  using Value = std::variant<int64_t, double, std::string>;

  MetricsRecord& add(const std::string& key, int64_t value);
  MetricsRecord& add(const std::string& key, double value);  // NaN and infinities become null
  MetricsRecord& add(const std::string& key, const std::string& value);

  // {"step": 10, "loss/mlm": 7.25, "kind": "train"}
  std::string to_json() const;

 private:
  std::vector<std::pair<std::string, Value>> fields_;
};

class MetricsWriter {
 public:
  // Appends to `path` (a resumed run continues the same file); creates missing folders.
  explicit MetricsWriter(const std::string& path);

  // Writes one line and flushes it, so that a crash loses at most the line being written.
  void write(const MetricsRecord& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace xlme::train
