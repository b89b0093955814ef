// GNU gettext's compiled message catalogs (.mo files), read without libintl.
//
// Format (GNU gettext manual, "The Format of GNU MO Files"): a 28-byte header of 32-bit words in
// the writer's byte order (magic 0x950412de, revision, N strings, offset of the original-string
// table, offset of the translation table, hash table size and offset), then two tables of N
// (length, offset) pairs. A string holds a context as "ctxt\x04msgid" and plural forms as
// NUL-separated strings.
#pragma once

#include <string>
#include <vector>

namespace xlme::data {

// One message of a catalog. The header entry (empty msgid, no context) is not an entry.
struct MoEntry {
  std::string context;               // msgctxt, "" when none
  std::string msgid;                 // the English singular
  std::string msgid_plural;          // "" unless the message has plural forms
  std::vector<std::string> msgstrs;  // translations: one, or one per plural form
};

// Parses the bytes of a .mo file; `name` (its path) appears in every error, with the offset of
// the first inconsistent field.
std::vector<MoEntry> parse_mo(const std::string& bytes, const std::string& name);

// Reads and parses a .mo file.
std::vector<MoEntry> read_mo(const std::string& path);

}  // namespace xlme::data
