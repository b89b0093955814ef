// Visitors that read config structs from YAML nodes and write them back as YAML (private to
// src/config). The structs' `visit` methods drive both, see include/xlme/config/config.h.
#pragma once

#include "xlme/config/schema.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace xlme::config::detail {

// Where a layer of values comes from: a YAML file (errors carry its line numbers) or one `--set`.
struct Source {
  std::string name;  // "configs/pretrain/demo.yaml" or "--set model.layers=4"
  bool is_file = true;

  // "configs/x.yaml:12" for a file node, the `--set` text otherwise.
  std::string where(const YAML::Node& node) const;
};

// Dotted key -> where its current value was set; keys absent here hold their defaults.
using Origins = std::map<std::string, std::string>;

// Reads one YAML map into a struct: each visited field present in the map is parsed, checked
// against its constraint and recorded in `origins`; `finish()` rejects the keys no field took.
class YamlReader {
 public:
  YamlReader(YAML::Node map, std::string prefix, const Source& source, Origins& origins,
             std::vector<std::string> reserved = {});

  void field(const char* name, bool& value, const char* doc);
  void field(const char* name, int64_t& value, const IntRange& range, const char* doc);
  void field(const char* name, double& value, const RealRange& range, const char* doc);
  void field(const char* name, std::string& value, const char* doc);
  void field(const char* name, std::string& value, const Choices& choices, const char* doc);
  void field(const char* name, std::vector<std::string>& value, const char* doc);
  void field(const char* name, std::vector<int64_t>& value, const IntRange& range, const char* doc);
  // Read as its spelling, checked against the list, and kept as the enum value.
  template <class E>
  void field(const char* name, E& value, const Named<E>& named, const char* doc) {
    std::string spelling = named.name(value);
    field(name, spelling, named.choices(), doc);
    value = *named.value(spelling);
  }

  template <class T>
  void section(const char* name, T& value, const char* /*doc*/) {
    YAML::Node node = take(name);
    if (!node) return;
    YamlReader reader(node, key(name), source_, origins_);
    value.visit(reader);
    reader.finish();
  }

  // Throws for the first key of the map that no field or section took.
  void finish() const;

 private:
  YAML::Node take(const char* name);  // the node under `name`, or an undefined node
  std::string key(const char* name) const;
  [[noreturn]] void fail(const YAML::Node& node, const std::string& key,
                         const std::string& problem) const;
  void record(const YAML::Node& node, const std::string& key);

  YAML::Node map_;
  std::string prefix_;  // "model.relative_position" (empty at the root)
  const Source& source_;
  Origins& origins_;
  std::vector<std::string> known_;  // every name visited, plus the reserved ones
};

// Writes a struct as block-style YAML, with optional comments from the field docs.
class YamlWriter {
 public:
  YamlWriter(std::ostringstream& out, bool docs, int indent = 0)
      : out_(out), docs_(docs), indent_(indent) {}

  void field(const char* name, const bool& value, const char* doc);
  void field(const char* name, const int64_t& value, const IntRange& range, const char* doc);
  void field(const char* name, const double& value, const RealRange& range, const char* doc);
  void field(const char* name, const std::string& value, const char* doc);
  void field(const char* name, const std::string& value, const Choices& choices, const char* doc);
  void field(const char* name, const std::vector<std::string>& value, const char* doc);
  void field(const char* name, const std::vector<int64_t>& value, const IntRange& range,
             const char* doc);
  template <class E>
  void field(const char* name, const E& value, const Named<E>& named, const char* doc) {
    field(name, named.name(value), named.choices(), doc);
  }

  template <class T>
  void section(const char* name, T& value, const char* doc) {
    comment(doc, "");
    out_ << pad() << name << ":\n";
    YamlWriter writer(out_, docs_, indent_ + 2);
    value.visit(writer);
  }

 private:
  void comment(const char* doc, const std::string& allowed);
  void line(const char* name, const std::string& text);
  std::string pad() const { return std::string(indent_, ' '); }

  std::ostringstream& out_;
  bool docs_;
  int indent_;
};

// YAML text of one scalar, such that yaml-cpp (and other YAML 1.1/1.2 readers) read it back as
// the same value and type.
std::string format_scalar(const std::string& value);
std::string format_scalar(double value);

// `text` as a message shows a value: its first 80 bytes, then "... (N bytes)" when longer, so that
// a huge or deeply nested value is not echoed whole.
std::string clipped(const std::string& text);

// The edit distance used to suggest a key for a misspelt one.
std::size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace xlme::config::detail
