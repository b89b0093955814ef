// Reading YAML files strictly: yaml-cpp keeps the last of two equal keys in one map without a
// word, so a key given twice in a config or a manifest would silently override the first.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace xlme::config {

// The YAML document in `text`, read from `name` (a file path, for the messages). Throws
// xlme::Error naming `name` and both lines when a map holds a key twice, and naming `name`, the
// line and the column when the text is not YAML.
YAML::Node load_yaml_text(const std::string& text, const std::string& name);

// load_yaml_text of the file `path`; throws xlme::Error naming `path` when it cannot be read.
YAML::Node load_yaml_file(const std::string& path);

}  // namespace xlme::config
