// The demo corpus: .mo catalogs made by msgfmt and by hand (both byte orders, plural forms,
// contexts, corruption), the cleaning rules, roff text, and the held-out split on a small
// locale tree built here.
#include "xlme/data/demo_corpus.h"
#include "xlme/data/mo_file.h"

#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

namespace xlme::data {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// A .mo file written field by field as the gettext manual describes it, in either byte order.
std::string build_mo(std::vector<std::pair<std::string, std::string>> strings, bool big_endian) {
  std::sort(strings.begin(), strings.end());
  const uint32_t n = static_cast<uint32_t>(strings.size());
  std::string out;
  auto put = [&](uint32_t v) {
    for (int b = 0; b < 4; ++b) {
      const int shift = big_endian ? 24 - 8 * b : 8 * b;
      out.push_back(static_cast<char>((v >> shift) & 0xff));
    }
  };
  const uint32_t originals = 28, translations = 28 + 8 * n, data = 28 + 16 * n;
  put(0x950412de);
  put(0);
  put(n);
  put(originals);
  put(translations);
  put(0);
  put(data);
  std::string blob;
  std::vector<uint32_t> original_desc, translation_desc;
  for (const auto& [original, translation] : strings) {
    original_desc.push_back(static_cast<uint32_t>(original.size()));
    original_desc.push_back(data + static_cast<uint32_t>(blob.size()));
    blob += original + '\0';
  }
  for (const auto& [original, translation] : strings) {
    translation_desc.push_back(static_cast<uint32_t>(translation.size()));
    translation_desc.push_back(data + static_cast<uint32_t>(blob.size()));
    blob += translation + '\0';
  }
  for (const uint32_t v : original_desc) put(v);
  for (const uint32_t v : translation_desc) put(v);
  return out + blob;
}

const std::vector<std::pair<std::string, std::string>> kStrings = {
    {"", "Content-Type: text/plain; charset=UTF-8\n"},
    {"Open the file", "Datei öffnen"},
    {std::string("menu\x04") + "Open", "Öffnen"},
    {std::string("one file\0%d files", 17), std::string("eine Datei\0%d Dateien", 21)},
};

void expect_hand_built_entries(const std::vector<MoEntry>& entries) {
  ASSERT_EQ(entries.size(), 3u);  // the header entry is skipped
  EXPECT_EQ(entries[0].msgid, "Open the file");
  EXPECT_EQ(entries[0].msgstrs, std::vector<std::string>{"Datei öffnen"});
  EXPECT_EQ(entries[1].context, "menu");
  EXPECT_EQ(entries[1].msgid, "Open");
  EXPECT_EQ(entries[2].msgid, "one file");
  EXPECT_EQ(entries[2].msgid_plural, "%d files");
  EXPECT_EQ(entries[2].msgstrs, (std::vector<std::string>{"eine Datei", "%d Dateien"}));
}

TEST(MoFile, ReadsHandBuiltCatalogsInBothByteOrders) {
  for (const bool big_endian : {false, true}) {
    SCOPED_TRACE(big_endian ? "big endian" : "little endian");
    expect_hand_built_entries(parse_mo(build_mo(kStrings, big_endian), "hand.mo"));
  }
}

TEST(MoFile, ReadsWhatMsgfmtWritesWithPluralsAndContexts) {
  TempDir dir;
  write_file(dir / "ru.po", R"(msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);\n"

msgid "Cannot open the file"
msgstr "Невозможно открыть файл"

msgctxt "verb"
msgid "Print"
msgstr "Печатать"

msgctxt "noun"
msgid "Print"
msgstr "Печать"

msgid "%d file was removed"
msgid_plural "%d files were removed"
msgstr[0] "%d файл удалён"
msgstr[1] "%d файла удалено"
msgstr[2] "%d файлов удалено"
)");
  const std::string command = "msgfmt -o " + (dir / "ru.mo") + " " + (dir / "ru.po");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto entries = read_mo(dir / "ru.mo");
  ASSERT_EQ(entries.size(), 4u);
  std::map<std::string, MoEntry> by_key;
  for (const auto& e : entries) by_key[e.context + "|" + e.msgid] = e;
  EXPECT_EQ(by_key.at("|Cannot open the file").msgstrs,
            std::vector<std::string>{"Невозможно открыть файл"});
  EXPECT_EQ(by_key.at("verb|Print").msgstrs, std::vector<std::string>{"Печатать"});
  EXPECT_EQ(by_key.at("noun|Print").msgstrs, std::vector<std::string>{"Печать"});
  const MoEntry& plural = by_key.at("|%d file was removed");
  EXPECT_EQ(plural.msgid_plural, "%d files were removed");
  EXPECT_EQ(plural.msgstrs,
            (std::vector<std::string>{"%d файл удалён", "%d файла удалено", "%d файлов удалено"}));
}

TEST(MoFile, CorruptCatalogsNameTheFileAndOffset) {
  const std::string good = build_mo(kStrings, false);
  EXPECT_TRUE(contains_all(error_message([&] { parse_mo(good.substr(0, 20), "short.mo"); }),
                           {"short.mo is not a gettext .mo file: 20 bytes", "(offset 0)"}));
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_TRUE(contains_all(error_message([&] { parse_mo(bad_magic, "magic.mo"); }),
                           {"magic.mo is not a gettext .mo file: magic number", "at offset 0"}));
  // Cut inside the tables: the translation table (at 28 + 8 * 4 = 60) needs 32 bytes.
  EXPECT_TRUE(contains_all(
      error_message([&] { parse_mo(good.substr(0, 70), "cut.mo"); }),
      {"cut.mo is truncated or corrupt: the translation table at offset 60", "the file has 70"}));
  // Cut inside the strings: a descriptor points past the end.
  EXPECT_TRUE(contains_all(
      error_message([&] { parse_mo(good.substr(0, good.size() - 30), "tail.mo"); }),
      {"tail.mo is truncated or corrupt: the translation descriptor at offset", "past the end"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { read_mo("/nonexistent/x.mo"); }),
                   {"cannot read .mo file '/nonexistent/x.mo': No such file or directory"}));
}

TEST(DemoCorpus, CleaningRules) {
  EXPECT_EQ(clean_message("_Open the file"), "Open the file");
  EXPECT_EQ(clean_message("Save &As another file"), "Save As another file");
  EXPECT_EQ(clean_message("ファイルを開く(_O)"), "ファイルを開く");
  EXPECT_EQ(clean_message("Set LC_ALL and LC_CTYPE"), "Set LC_ALL and LC_CTYPE");
  EXPECT_EQ(clean_message("Tom &amp; Jerry <b>bold</b> text"), "Tom & Jerry bold text");
  EXPECT_EQ(clean_message("usage: <file> is kept"), "usage: <file> is kept");
  EXPECT_EQ(clean_message("cannot open %s: %-5.2f%% done, %1$d of %lld"),
            "cannot open {}: {}% done, {} of {}");
  EXPECT_EQ(clean_message("Copied %(count)d files to {0} and {name}"),
            "Copied {} files to {} and {}");
  EXPECT_EQ(clean_message("100% sure it works"), "100% sure it works");
  EXPECT_EQ(clean_message("  two\nlines\tand  spaces "), "two lines and spaces");
  EXPECT_EQ(clean_message("\xff\xfe invalid"), std::nullopt);
  EXPECT_EQ(clean_message("  \n "), std::nullopt);
  EXPECT_EQ(count_words("copy {} to {} --"), 2);
  EXPECT_EQ(count_words("three small words"), 3);
}

TEST(DemoCorpus, ManPageSentences) {
  const std::string roff = R"(.\" a comment
.TH LS 1
.SH BEZEICHNUNG
ls \- Verzeichnisinhalte auflisten
.SH BESCHREIBUNG
.PP
Auflistung von Informationen über die \fBDATEIen\fP. Die Einträge werden
alphabetisch sortiert, falls \fB\-\-sort\fP fehlt.
.nf
code block that is skipped
.fi
.B ls
zeigt \(Fodies\(Fc an und noch mehr.
)";
  EXPECT_EQ(man_page_sentences(roff),
            (std::vector<std::string>{"ls - Verzeichnisinhalte auflisten",
                                      "Auflistung von Informationen über die DATEIen.",
                                      "Die Einträge werden alphabetisch sortiert, falls --sort "
                                      "fehlt.",
                                      "ls zeigt «dies» an und noch mehr."}));
  EXPECT_TRUE(man_page_sentences(".so man1/other.1\n").empty());
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A locale tree with two languages sharing English messages, compiled by msgfmt.
void make_locale_tree(const std::string& root, int messages) {
  for (const std::string lang : {"de", "fr", "en_GB"}) {
    std::string po = "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n\n";
    for (int i = 0; i < messages; ++i) {
      po += fmt::format(
          "msgid \"message number {} is here\"\nmsgstr \"{} Nachricht {} ist da\"\n\n", i, lang, i);
    }
    po += "msgid \"Short\"\nmsgstr \"Kurz\"\n\n";  // < 3 words
    po += "msgid \"same in both languages\"\nmsgstr \"same in both languages\"\n\n";
    const std::string dir = root + "/" + lang + "/LC_MESSAGES";
    write_file(dir + "/test.po", po);
    const std::string command = "msgfmt -o " + dir + "/test.mo " + dir + "/test.po";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
}

TEST(DemoCorpus, HeldOutMessagesNeverReachTraining) {
  TempDir dir;
  make_locale_tree(dir / "locale", 300);
  DemoCorpusOptions options;
  options.out_dir = dir / "out";
  options.locale_dir = dir / "locale";
  options.man_dir = "";
  options.heldout_pairs = 20;
  options.heldout_per_mille = 150;
  const auto report = build_demo_corpus(options);
  EXPECT_EQ(report.catalogs, 2);  // en_GB is English, not a language of its own
  ASSERT_EQ(report.languages.size(), 2u);

  std::set<std::string> heldout_en;
  for (const std::string lang : {"de", "fr"}) {
    for (const std::string split : {"dev", "test"}) {
      const auto en = lines_of(dir / ("out/heldout/" + split + "/en-" + lang + ".en"));
      const auto tr = lines_of(dir / ("out/heldout/" + split + "/en-" + lang + "." + lang));
      ASSERT_EQ(en.size(), tr.size());
      EXPECT_EQ(en.size(), 20u);  // capped at heldout_pairs
      for (const auto& line : en) {
        EXPECT_EQ(heldout_split(line, options.heldout_per_mille), split == "dev" ? 1 : 2);
        heldout_en.insert(line);
      }
    }
  }
  for (const std::string lang : {"de", "fr"}) {
    const auto en = lines_of(dir / ("out/para/en-" + lang + ".en"));
    const auto tr = lines_of(dir / ("out/para/en-" + lang + "." + lang));
    ASSERT_EQ(en.size(), tr.size());
    const auto mono = lines_of(dir / ("out/mono/" + lang + ".txt"));
    int64_t expected_train = 0;
    for (int i = 0; i < 300; ++i) {
      const std::string english = fmt::format("message number {} is here", i);
      const std::string target = fmt::format("{} Nachricht {} ist da", lang, i);
      const bool held = heldout_split(english, options.heldout_per_mille) > 0;
      expected_train += !held;
      EXPECT_EQ(std::count(en.begin(), en.end(), english), held ? 0 : 1) << english;
      EXPECT_EQ(std::count(mono.begin(), mono.end(), target), held ? 0 : 1) << target;
    }
    EXPECT_EQ(static_cast<int64_t>(en.size()), expected_train);
    for (const auto& line : en) EXPECT_EQ(heldout_en.count(line), 0u) << line;
    EXPECT_EQ(std::count(en.begin(), en.end(), "Short"), 0);
    EXPECT_EQ(std::count(en.begin(), en.end(), "same in both languages"), 0);
  }
  EXPECT_TRUE(contains_all(read_file(dir / "out/counts.tsv"),
                           {"language\tmono_lines", "\nde\t", "\nfr\t"}));
}

TEST(DemoCorpus, MissingOrEmptyLocaleFolder) {
  TempDir dir;
  DemoCorpusOptions options;
  options.out_dir = dir / "out";
  options.locale_dir = dir / "nope";
  EXPECT_TRUE(contains_all(
      error_message([&] { build_demo_corpus(options); }),
      {"locale folder '" + (dir / "nope") + "' not found", "scripts/prepare_demo_corpus.sh"}));
  std::filesystem::create_directories(dir / "empty/de/LC_MESSAGES");
  options.locale_dir = dir / "empty";
  EXPECT_TRUE(contains_all(error_message([&] { build_demo_corpus(options); }),
                           {"no .mo catalogs under '" + (dir / "empty")}));
}

}  // namespace
}  // namespace xlme::data
