// JSON helpers: writing string literals (metrics lines, safetensors headers, config.json), also
// valid as YAML double-quoted scalars (YAML 1.2 reads JSON's escapes), and reading JSON that
// others wrote (safetensors headers, export config.json) without trusting its shape.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string>

namespace xlme {

// "a \"b\"\n" for a "b" + newline: quotes, backslashes and control characters escaped.
std::string json_quote(const std::string& text);

// The deepest nesting of lists and objects that parse_json accepts. xlme's own files nest three
// levels; deeper input is refused before anything walks it recursively (dump, copy, compare).
constexpr int kMaxJsonDepth = 64;

// Parses untrusted JSON. `what` names the text in errors ("export config 'm/config.json'"): an
// xlme::Error says it "is not valid JSON" (with the parser's position) or "is nested too deeply".
// With `unique_keys` (xlme's own formats: safetensors headers, export configs) an object that
// lists a key twice is refused naming the key: readers differ on which copy they keep.
// Json is nlohmann::json or nlohmann::ordered_json.
template <class Json>
Json parse_json(const std::string& text, const std::string& what, bool unique_keys = false);

// An untrusted value for an error message, however large or deep: its kind and the start of its
// JSON text, e.g. `a string "F99"`, `a list [1, 2, 3]`, `an object {"a": [[[[... (2 keys)`.
// Never longer than about kJsonExcerpt + 40 characters.
constexpr std::size_t kJsonExcerpt = 80;
template <class Json>
std::string describe_json(const Json& value);

// At most kJsonExcerpt characters of the JSON text of `value` ("..." marks a cut).
template <class Json>
std::string json_excerpt(const Json& value);

}  // namespace xlme
