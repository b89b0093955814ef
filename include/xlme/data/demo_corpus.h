// The offline demo corpus: Debian's gettext catalogs and translated manual pages turned into the
// raw layout of docs/ARCHITECTURE.md#data (mono/, para/, and a held-out dev/test split).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xlme::data {

struct DemoCorpusOptions {
  std::string out_dir;
  std::string locale_dir = "/usr/share/locale";  // <lang>/LC_MESSAGES/*.mo
  std::string man_dir = "/usr/share/man";        // <lang>/man<N>/*.gz; "" = no man pages
  int64_t heldout_pairs = 1000;                  // at most this many pairs per dev and test set
  int64_t heldout_per_mille = 80;  // English messages held out for dev, and as many for test
};

// Counts for one language: monolingual lines and documents, and its pair with English.
struct DemoLanguageCounts {
  std::string language;
  int64_t mono_lines = 0;
  int64_t mono_documents = 0;
  int64_t train_pairs = 0;
  int64_t dev_pairs = 0;
  int64_t test_pairs = 0;
};

struct DemoCorpusReport {
  int64_t catalogs = 0;      // .mo files read
  int64_t bad_catalogs = 0;  // .mo files that did not parse (skipped with a warning)
  int64_t entries = 0;       // messages in them
  int64_t man_pages = 0;     // translated man pages read
  std::vector<DemoLanguageCounts> languages;  // sorted by name
};

// A message as it enters the corpus, or nothing when it is not usable text. In order: newlines
// and tabs become spaces; markup tags (<b>, </span>, <a href=...>) are removed and the XML
// entities decoded; keyboard accelerators are removed ("_File" -> "File", "&Open" -> "Open",
// "保存(_S)" -> "保存"); format directives (%s, %-5.2f, %1$d, %(name)s, %<PRIu64>, {0}, {name})
// become the placeholder "{}" and "%%" becomes "%"; whitespace is collapsed. Invalid UTF-8,
// control characters or an empty result give nothing.
std::optional<std::string> clean_message(const std::string& text);

// Whitespace-separated words with at least one letter or digit ("{}" and "--" are no words).
int64_t count_words(const std::string& text);

// Which held-out set an English message belongs to: 0 = training, 1 = dev, 2 = test. Decided by
// hash64 of the cleaned message, so the same message is held out for every language.
int heldout_split(const std::string& english, int64_t per_mille);

// The text paragraphs of a roff manual page (macros, font escapes, tables and no-fill blocks
// removed), split into sentences; for tests and build_demo_corpus.
std::vector<std::string> man_page_sentences(const std::string& roff);

// Reads every catalog and man page, cleans, splits and writes:
//   mono/<lang>.txt                     one message or sentence per line, blank line between
//                                       documents (one document per catalog or man page)
//   para/en-<lang>.en, .<lang>          aligned training pairs
//   heldout/{dev,test}/en-<lang>.{en,<lang>}
//   counts.tsv                          the report's table
// Pairs need >= 3 English words and a translation different from the English; duplicate pairs
// (and duplicate mono lines) are dropped per language. A held-out English message, and any
// translation of it, never appears in mono/ or para/ of any language. Every file is written
// atomically. Throws xlme::Error when `locale_dir` has no catalogs.
DemoCorpusReport build_demo_corpus(const DemoCorpusOptions& options);

}  // namespace xlme::data
