// Reading YAML files strictly: yaml-cpp keeps the last of two equal keys in one map without a
// word, so a key given twice in a config or a manifest would silently override the first.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

namespace xlme::config {

// The largest YAML text read (16 MiB): configs, manifests and trainer states are a few KiB, and
// yaml-cpp takes minutes on a 1 GB file, so anything larger is refused before parsing.
constexpr int64_t kMaxYamlBytes = int64_t{16} << 20;
// The deepest nesting of lists and maps read: xlme's files use fewer than 10 levels, and each
// level is a recursion in the parser.
constexpr int kMaxYamlDepth = 64;

// The YAML document in `text`, read from `name` (a file path, for the messages). Throws
// xlme::Error naming `name` and both lines when a map holds a key twice, naming `name` and the
// line when lists and maps nest deeper than kMaxYamlDepth, naming `name`, the line and the column
// when the text is not YAML, and naming `name` when it is longer than kMaxYamlBytes.
YAML::Node load_yaml_text(const std::string& text, const std::string& name);

// load_yaml_text of the file `path`; throws xlme::Error naming `path` when it cannot be read, is
// not a regular file (a folder, a FIFO, a device: said which, without opening it) or is larger
// than kMaxYamlBytes.
YAML::Node load_yaml_file(const std::string& path);

}  // namespace xlme::config
