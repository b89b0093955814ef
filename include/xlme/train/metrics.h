// One JSON object per line in <run>/metrics.jsonl, for scripts/plot_metrics.py and any tool
// that reads JSON lines. Records keep their keys in insertion order.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
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
  // Appends to `path` (a resumed run continues the same file); creates missing folders. With
  // `resumed_step`, first drops the records after that step (written by the run after the
  // checkpoint it resumes from, and about to be written again), the validation records at that
  // step unless `keep_validation_at_step`, and unreadable lines (a crash mid-write), so that each
  // step is logged once.
  explicit MetricsWriter(const std::string& path,
                         std::optional<int64_t> resumed_step = std::nullopt,
                         bool keep_validation_at_step = true);

  // Writes one line and flushes it, so that a crash loses at most the line being written.
  void write(const MetricsRecord& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace xlme::train
