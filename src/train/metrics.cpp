#include "xlme/train/metrics.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

namespace xlme::train {

MetricsRecord& MetricsRecord::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, value);
  return *this;
}

MetricsRecord& MetricsRecord::add(const std::string& key, double value) {
  fields_.emplace_back(key, value);
  return *this;
}

MetricsRecord& MetricsRecord::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, value);
  return *this;
}

std::string MetricsRecord::to_json() const {
  std::string out = "{";
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    if (i > 0) out += ", ";
    out += json_quote(fields_[i].first) + ": ";
    const Value& value = fields_[i].second;
    if (const auto* n = std::get_if<int64_t>(&value)) {
      out += std::to_string(*n);
    } else if (const auto* d = std::get_if<double>(&value)) {
      out += std::isfinite(*d) ? fmt::format("{}", *d) : "null";
    } else {
      out += json_quote(std::get<std::string>(value));
    }
  }
  return out + "}";
}

MetricsWriter::MetricsWriter(const std::string& path, std::optional<int64_t> resumed_step,
                             bool keep_validation_at_step)
    : path_(path) {
  const auto folder = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  require_plain_file_or_missing(path, "the metrics file");
  if (resumed_step && std::filesystem::is_regular_file(path)) {
    std::ifstream in(path);
    std::string kept, line;
    int64_t dropped = 0;
    while (std::getline(in, line)) {
      bool keep = false;
      try {
        const auto record = nlohmann::json::parse(line);
        const int64_t step = record.at("step").get<int64_t>();
        const bool validation = record.value("kind", std::string()) == "validation";
        keep = step < *resumed_step ||
               (step == *resumed_step && (!validation || keep_validation_at_step));
      } catch (const nlohmann::json::exception&) {
        keep = false;
      }
      if (keep) {
        kept += line + "\n";
      } else {
        ++dropped;
      }
    }
    in.close();
    if (dropped > 0) {
      write_file_atomic(path, kept);
      spdlog::info("{}: {} record(s) after step {} dropped (the run resumes there)", path, dropped,
                   *resumed_step);
    }
  }
  out_.open(path, std::ios::app);
  XLME_CHECK(out_.good(), "cannot open the metrics file '{}' for appending", path);
}

void MetricsWriter::write(const MetricsRecord& record) {
  out_ << record.to_json() << '\n';
  out_.flush();
  XLME_CHECK(out_.good(), "cannot write to the metrics file '{}' (is the disk full?)", path_);
}

}  // namespace xlme::train
