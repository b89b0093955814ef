#include "yaml_io.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"
#include "xlme/config/yaml_file.h"

#include <yaml-cpp/eventhandler.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace xlme::config {

std::string IntRange::describe() const {
  if (max == kNoLimit) return fmt::format("an integer >= {}", min);
  return fmt::format("an integer in [{}, {}]", min, max);
}

bool RealRange::contains(double v) const {
  if (!std::isfinite(v)) return false;
  const bool above = min_open ? v > min : v >= min;
  const bool below = max_open ? v < max : v <= max;
  return above && below;
}

std::string RealRange::describe() const {
  return fmt::format("a number in {}{}, {}{}", min_open ? '(' : '[', detail::format_scalar(min),
                     detail::format_scalar(max), max_open ? ')' : ']');
}

bool Choices::contains(const std::string& v) const {
  return std::find(values.begin(), values.end(), v) != values.end();
}

std::string Choices::describe() const {
  return fmt::format("one of: {}", fmt::join(values, ", "));
}

namespace detail {

std::string clipped(const std::string& text) {
  constexpr size_t kShown = 80;
  if (text.size() <= kShown) return text;
  size_t end = kShown;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
  return fmt::format("{}... ({} bytes)", text.substr(0, end), text.size());
}

namespace {

const char* kind_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    default:
      return "a scalar";
  }
}

// What the node holds, for "got ..." in messages: its text when it is a scalar (clipped).
std::string shown(const YAML::Node& node) {
  if (node.IsScalar()) return fmt::format("'{}'", clipped(node.Scalar()));
  return kind_of(node);
}

bool parse_int(const std::string& text, int64_t& out) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, out);
  if (ec == std::errc() && ptr == end && begin != end) return true;
  // Accept integral values written as reals ("1e6", "2048.0"), as users do for token counts.
  char* stop = nullptr;
  const double d = std::strtod(text.c_str(), &stop);
  if (text.empty() || *stop != '\0' || !std::isfinite(d) || d != std::floor(d) ||
      std::fabs(d) > 9.0e18) {
    return false;
  }
  out = static_cast<int64_t>(d);
  return true;
}

bool parse_real(const std::string& text, double& out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* stop = nullptr;
  out = std::strtod(text.c_str(), &stop);
  return *stop == '\0';
}

bool parse_bool(const std::string& text, bool& out) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "yes" || t == "on") {
    out = true;
    return true;
  }
  if (t == "false" || t == "no" || t == "off") {
    out = false;
    return true;
  }
  return false;
}

bool is_reserved_word(const std::string& s) {
  std::string t = s;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  static const char* const kWords[] = {"true", "false", "yes",  "no", "on",   "off",
                                       "y",    "n",     "null", "~",  ".inf", ".nan"};
  return std::any_of(std::begin(kWords), std::end(kWords), [&](const char* w) { return t == w; });
}

}  // namespace

std::string Source::where(const YAML::Node& node) const {
  if (!is_file) return name;
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return name;
  return fmt::format("{}:{}", name, mark.line + 1);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string format_scalar(const std::string& value) {
  const bool plain_chars = !value.empty() &&
                           (std::isalpha(static_cast<unsigned char>(value[0])) || value[0] == '_' ||
                            value[0] == '/' || value[0] == '.') &&
                           std::all_of(value.begin(), value.end(), [](unsigned char c) {
                             return std::isalnum(c) || c == '_' || c == '.' || c == '/' ||
                                    c == '+' || c == '-' || c == '@';
                           });
  double ignored = 0;
  if (plain_chars && !is_reserved_word(value) && !parse_real(value, ignored)) return value;
  return json_quote(value);  // JSON escapes are YAML double-quoted escapes
}

std::string format_scalar(double value) {
  // fmt's shortest representation that reads back to the same double.
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// --- YamlReader ---------------------------------------------------------------------------------

YamlReader::YamlReader(YAML::Node map, std::string prefix, const Source& source, Origins& origins,
                       std::vector<std::string> reserved)
    : map_(std::move(map)),
      prefix_(std::move(prefix)),
      source_(source),
      origins_(origins),
      known_(std::move(reserved)) {
  if (!map_.IsMap() && !map_.IsNull()) {
    // A whole file that is not YAML (an include: of a .env) is not echoed: it may hold secrets.
    fail(map_, prefix_.empty() ? "(top level)" : prefix_,
         prefix_.empty() && map_.IsScalar()
             ? fmt::format("expected a map of keys, got plain text of {} bytes (not shown); is "
                           "it a YAML config file?",
                           map_.Scalar().size())
             : fmt::format("expected a map of keys, got {}", shown(map_)));
  }
}

std::string YamlReader::key(const char* name) const {
  return prefix_.empty() ? name : fmt::format("{}.{}", prefix_, name);
}

void YamlReader::fail(const YAML::Node& node, const std::string& key,
                      const std::string& problem) const {
  XLME_FAIL("{}: {}: {}", source_.where(node), key, problem);
}

void YamlReader::record(const YAML::Node& node, const std::string& key) {
  origins_[key] = source_.where(node);
}

YAML::Node YamlReader::take(const char* name) {
  known_.emplace_back(name);
  if (!map_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  for (const auto& entry : map_) {
    if (entry.first.Scalar() == name) return entry.second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

void YamlReader::finish() const {
  if (!map_.IsMap()) return;
  for (const auto& entry : map_) {
    const std::string name = entry.first.Scalar();
    if (std::find(known_.begin(), known_.end(), name) != known_.end()) continue;
    std::string hint;
    std::size_t best = std::max<std::size_t>(2, name.size() / 3) + 1;
    for (const auto& candidate : known_) {
      const std::size_t d = edit_distance(name, candidate);
      if (d < best) {
        best = d;
        hint = fmt::format(" (did you mean '{}'?)", key(candidate.c_str()));
      }
    }
    XLME_FAIL("{}: unknown key '{}'{}; the keys allowed {} are: {}", source_.where(entry.first),
              key(name.c_str()), hint,
              prefix_.empty() ? "at the top level" : "in '" + prefix_ + "'",
              fmt::join(known_, ", "));
  }
}

void YamlReader::field(const char* name, bool& value, const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  if (!node.IsScalar() || !parse_bool(node.Scalar(), value)) {
    fail(node, key(name), fmt::format("expected true or false, got {}", shown(node)));
  }
  record(node, key(name));
}

void YamlReader::field(const char* name, int64_t& value, const IntRange& range,
                       const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  int64_t parsed = 0;
  if (!node.IsScalar() || !parse_int(node.Scalar(), parsed)) {
    fail(node, key(name), fmt::format("expected {}, got {}", range.describe(), shown(node)));
  }
  if (!range.contains(parsed)) {
    fail(node, key(name), fmt::format("{} is out of range: expected {}", parsed, range.describe()));
  }
  value = parsed;
  record(node, key(name));
}

void YamlReader::field(const char* name, double& value, const RealRange& range,
                       const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  double parsed = 0;
  if (!node.IsScalar() || !parse_real(node.Scalar(), parsed)) {
    fail(node, key(name), fmt::format("expected {}, got {}", range.describe(), shown(node)));
  }
  if (!range.contains(parsed)) {
    fail(node, key(name),
         fmt::format("{} is out of range: expected {}", node.Scalar(), range.describe()));
  }
  value = parsed;
  record(node, key(name));
}

void YamlReader::field(const char* name, std::string& value, const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  if (node.IsNull()) {
    value.clear();
  } else if (node.IsScalar()) {
    value = node.Scalar();
  } else {
    fail(node, key(name), fmt::format("expected a string, got {}", shown(node)));
  }
  record(node, key(name));
}

void YamlReader::field(const char* name, std::string& value, const Choices& choices,
                       const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  if (!node.IsScalar() || !choices.contains(node.Scalar())) {
    fail(node, key(name), fmt::format("expected {}, got {}", choices.describe(), shown(node)));
  }
  value = node.Scalar();
  record(node, key(name));
}

void YamlReader::field(const char* name, std::vector<std::string>& value, const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  std::vector<std::string> parsed;
  if (!node.IsNull()) {
    if (!node.IsSequence()) {
      fail(node, key(name), fmt::format("expected a list such as [a, b], got {}", shown(node)));
    }
    for (const auto& item : node) {
      if (!item.IsScalar()) {
        fail(item, key(name), fmt::format("expected a list of strings, got {} in it", shown(item)));
      }
      parsed.push_back(item.Scalar());
    }
  }
  value = std::move(parsed);
  record(node, key(name));
}

void YamlReader::field(const char* name, std::vector<int64_t>& value, const IntRange& range,
                       const char* /*doc*/) {
  const YAML::Node node = take(name);
  if (!node) return;
  std::vector<int64_t> parsed;
  if (!node.IsNull()) {
    if (!node.IsSequence()) {
      fail(node, key(name), fmt::format("expected a list such as [1, 2], got {}", shown(node)));
    }
    for (const auto& item : node) {
      int64_t v = 0;
      if (!item.IsScalar() || !parse_int(item.Scalar(), v) || !range.contains(v)) {
        fail(item, key(name),
             fmt::format("expected a list of {}, got {} in it", range.describe(), shown(item)));
      }
      parsed.push_back(v);
    }
  }
  value = std::move(parsed);
  record(node, key(name));
}

// --- YamlWriter ---------------------------------------------------------------------------------

void YamlWriter::comment(const char* doc, const std::string& allowed) {
  if (!docs_) return;
  out_ << pad() << "# " << doc;
  if (!allowed.empty()) out_ << " [" << allowed << "]";
  out_ << "\n";
}

void YamlWriter::line(const char* name, const std::string& text) {
  out_ << pad() << name << ": " << text << "\n";
}

void YamlWriter::field(const char* name, const bool& value, const char* doc) {
  comment(doc, "true or false");
  line(name, value ? "true" : "false");
}

void YamlWriter::field(const char* name, const int64_t& value, const IntRange& range,
                       const char* doc) {
  comment(doc, range.describe());
  line(name, std::to_string(value));
}

void YamlWriter::field(const char* name, const double& value, const RealRange& range,
                       const char* doc) {
  comment(doc, range.describe());
  line(name, format_scalar(value));
}

void YamlWriter::field(const char* name, const std::string& value, const char* doc) {
  comment(doc, "");
  line(name, format_scalar(value));
}

void YamlWriter::field(const char* name, const std::string& value, const Choices& choices,
                       const char* doc) {
  comment(doc, choices.describe());
  line(name, format_scalar(value));
}

void YamlWriter::field(const char* name, const std::vector<std::string>& value, const char* doc) {
  comment(doc, "a list");
  std::vector<std::string> items;
  for (const auto& v : value) items.push_back(format_scalar(v));
  line(name, fmt::format("[{}]", fmt::join(items, ", ")));
}

void YamlWriter::field(const char* name, const std::vector<int64_t>& value, const IntRange& range,
                       const char* doc) {
  comment(doc, "a list of " + range.describe());
  line(name, fmt::format("[{}]", fmt::join(value, ", ")));
}

}  // namespace detail
}  // namespace xlme::config

namespace xlme::config {
namespace {

// Walks the parser's events and fails at the second occurrence of a scalar key in one map.
class DuplicateKeyCheck : public YAML::EventHandler {
 public:
  explicit DuplicateKeyCheck(const std::string& name) : name_(name) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, nullptr); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, nullptr); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string& value) override {
    node(mark, &value);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark, nullptr);
    enter(mark, false);
  }
  void OnSequenceEnd() override { frames_.pop_back(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark, nullptr);
    enter(mark, true);
  }
  void OnMapEnd() override { frames_.pop_back(); }

 private:
  struct Frame {
    bool is_map;
    bool expect_key;                      // maps: the next node is a key
    std::map<std::string, int64_t> keys;  // maps: key -> its line (1-based)
  };

  // A list or map starts at `mark`: one level deeper, refused past kMaxYamlDepth. The parser
  // recurses once per level, so the check comes before the recursion goes far.
  void enter(const YAML::Mark& mark, bool is_map) {
    XLME_CHECK(frames_.size() < static_cast<size_t>(kMaxYamlDepth),
               "{}:{}: nested too deeply: more than {} levels of lists and maps (xlme's YAML "
               "files use fewer than 10); this is not an xlme config, manifest or trainer state",
               name_, mark.line + 1, kMaxYamlDepth);
    frames_.push_back({is_map, true, {}});
  }

  // A node starts at `mark`; `scalar` is its value when it is a scalar.
  void node(const YAML::Mark& mark, const std::string* scalar) {
    if (frames_.empty() || !frames_.back().is_map) return;
    Frame& frame = frames_.back();
    const bool is_key = frame.expect_key;
    frame.expect_key = !frame.expect_key;
    if (!is_key || scalar == nullptr) return;
    const int64_t line = mark.line + 1;
    const auto [it, inserted] = frame.keys.emplace(*scalar, line);
    XLME_CHECK(inserted,
               "{}:{}: key '{}' is given twice in the same map (lines {} and {}); yaml-cpp would "
               "keep only the last one: remove one of them",
               name_, line, *scalar, it->second, line);
  }

  const std::string& name_;
  std::vector<Frame> frames_;
};

}  // namespace

YAML::Node load_yaml_text(const std::string& text, const std::string& name) {
  XLME_CHECK(text.size() <= static_cast<size_t>(kMaxYamlBytes),
             "{} holds {} bytes of YAML, over the limit of {} MiB: xlme's configs, manifests and "
             "trainer states are a few KiB, and parsing this much would take minutes; pass the "
             "right file",
             name, text.size(), kMaxYamlBytes >> 20);
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DuplicateKeyCheck check(name);
    while (parser.HandleNextDocument(check)) {
    }
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    XLME_FAIL("{}:{}:{}: malformed YAML: {}", name, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

YAML::Node load_yaml_file(const std::string& path) {
  // stat() first: a FIFO, a device or a folder is named for what it is and never opened (a FIFO
  // would block the open, /dev/zero would be read without end).
  struct stat st {};
  XLME_CHECK(::stat(path.c_str(), &st) == 0,
             "YAML file '{}' cannot be read: {}; check that it exists and its permissions", path,
             std::strerror(errno));
  XLME_CHECK(S_ISREG(st.st_mode), "YAML file '{}' is {}, not a regular file; pass a YAML file",
             path, file_type_name(st.st_mode));
  XLME_CHECK(st.st_size <= kMaxYamlBytes,
             "YAML file '{}' is {} bytes, over the limit of {} MiB: xlme's configs, manifests and "
             "trainer states are a few KiB, and parsing this much would take minutes; pass the "
             "right file",
             path, st.st_size, kMaxYamlBytes >> 20);
  // O_NONBLOCK in case the file was swapped for a FIFO since the stat; reading stops past the
  // limit, whatever the file grew to since (load_yaml_text refuses it then).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  XLME_CHECK(fd >= 0, "YAML file '{}' cannot be read: {}", path, std::strerror(errno));
  std::string text;
  char chunk[65536];
  ssize_t n = 0;
  while (text.size() <= static_cast<size_t>(kMaxYamlBytes) &&
         (n = ::read(fd, chunk, sizeof(chunk))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(chunk, static_cast<size_t>(n));
  }
  const int error = n < 0 ? errno : 0;
  ::close(fd);
  XLME_CHECK(error == 0, "YAML file '{}' cannot be read: {}", path, std::strerror(error));
  return load_yaml_text(text, path);
}

}  // namespace xlme::config
