#include "xlme/common/json.h"

#include "xlme/common/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <set>
#include <utility>
#include <vector>

namespace xlme {
namespace {

// Thrown by the parser callback at a list or object nested deeper than kMaxJsonDepth.
struct JsonTooDeep {};

// Thrown by the parser callback at a key its object already has (parse_json's unique_keys).
struct JsonDuplicateKey {
  std::string key;
};

// The longest parser message quoted: nlohmann's "last read" part repeats the offending token,
// which can be the whole (huge) input.
constexpr std::size_t kMaxParserMessage = 240;

// The first `limit` bytes of `text`, cut at a UTF-8 character boundary.
std::string utf8_prefix(const std::string& text, std::size_t limit) {
  if (text.size() <= limit) return text;
  std::size_t n = limit;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

// Appends the JSON text of `value` to `out` until `out` holds at least `limit` characters (then
// at most one container's closing brackets more). Containers beyond kMaxJsonDepth show as "...",
// so that even a value that parse_json did not read is walked to a bounded depth.
template <class Json>
void append_excerpt(const Json& value, std::size_t limit, int depth, std::string& out) {
  if (out.size() >= limit) return;
  if (value.is_string()) {
    const auto& text = value.template get_ref<const typename Json::string_t&>();
    const std::size_t room = limit - out.size();
    out += json_quote(utf8_prefix(text, room));
    if (text.size() > room) out += "...";
    return;
  }
  if (!value.is_structured()) {
    out += value.dump();  // a number, a boolean or null: short
    return;
  }
  if (depth >= kMaxJsonDepth) {
    out += "...";
    return;
  }
  out += value.is_object() ? '{' : '[';
  bool first = true;
  for (auto it = value.begin(); it != value.end() && out.size() < limit; ++it) {
    if (!first) out += ", ";
    first = false;
    if (value.is_object()) out += json_quote(utf8_prefix(it.key(), limit)) + ": ";
    append_excerpt(*it, limit, depth + 1, out);
  }
  out += value.is_object() ? '}' : ']';
}

// The excerpt and whether it was cut.
template <class Json>
std::pair<std::string, bool> excerpt_of(const Json& value) {
  std::string out;
  append_excerpt(value, kJsonExcerpt, 0, out);
  if (out.size() <= kJsonExcerpt) return {out, false};
  return {utf8_prefix(out, kJsonExcerpt) + "...", true};
}

}  // namespace

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

template <class Json>
Json parse_json(const std::string& text, const std::string& what, bool unique_keys) {
  // The keys seen in each object being read, innermost last (only with unique_keys).
  std::vector<std::set<std::string>> keys;
  try {
    // At the start of a list or object, `depth` counts the ones around it: 0 for the outermost.
    using Event = typename Json::parse_event_t;
    return Json::parse(text, [&](int depth, Event event, Json& parsed) {
      if ((event == Event::array_start || event == Event::object_start) && depth >= kMaxJsonDepth) {
        throw JsonTooDeep{};
      }
      if (!unique_keys) return true;
      if (event == Event::object_start) keys.emplace_back();
      if (event == Event::object_end) keys.pop_back();
      if (event == Event::key && !keys.back().insert(parsed.template get<std::string>()).second) {
        throw JsonDuplicateKey{parsed.template get<std::string>()};
      }
      return true;
    });
  } catch (const JsonDuplicateKey& duplicate) {
    XLME_FAIL(
        "{} lists the key {} twice; readers differ on which copy they keep: the file is damaged "
        "or was made to break readers",
        what, json_quote(utf8_prefix(duplicate.key, kJsonExcerpt)));
  } catch (const JsonTooDeep&) {
    XLME_FAIL(
        "{} is nested too deeply: more than {} levels of lists and objects (xlme's own "
        "files nest 3); the file is damaged or was made to break readers",
        what, kMaxJsonDepth);
  } catch (const nlohmann::json::exception& e) {
    const std::string message = e.what();
    XLME_FAIL("{} is not valid JSON: {}{}", what, utf8_prefix(message, kMaxParserMessage),
              message.size() > kMaxParserMessage ? "..." : "");
  }
}

template <class Json>
std::string json_excerpt(const Json& value) {
  return excerpt_of(value).first;
}

template <class Json>
std::string describe_json(const Json& value) {
  const auto [text, cut] = excerpt_of(value);
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      return cut ? fmt::format("an object {} ({} key{})", text, value.size(),
                               value.size() == 1 ? "" : "s")
                 : fmt::format("an object {}", text);
    case nlohmann::json::value_t::array:
      return cut ? fmt::format("a list {} ({} item{})", text, value.size(),
                               value.size() == 1 ? "" : "s")
                 : fmt::format("a list {}", text);
    case nlohmann::json::value_t::string:
      return fmt::format("a string {}", text);
    case nlohmann::json::value_t::boolean:
      return fmt::format("a boolean {}", text);
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return fmt::format("an integer {}", text);
    case nlohmann::json::value_t::number_float:
      return fmt::format("a number {}", text);
    default:
      return "null";
  }
}

template nlohmann::json parse_json(const std::string&, const std::string&, bool);
template nlohmann::ordered_json parse_json(const std::string&, const std::string&, bool);
template std::string json_excerpt(const nlohmann::json&);
template std::string json_excerpt(const nlohmann::ordered_json&);
template std::string describe_json(const nlohmann::json&);
template std::string describe_json(const nlohmann::ordered_json&);

}  // namespace xlme
