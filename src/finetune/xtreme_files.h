// Helpers that the XTREME readers and writers (xtreme_io.cpp, pair_io.cpp, tagging_io.cpp,
// qa_io.cpp, retrieval_io.cpp) share: how files are read, how errors name a place, and the checks
// every reader makes.
#pragma once

#include "xlme/data/line_reader.h"
#include "xlme/config/task_registry.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::finetune::io {

// How every reader of fine-tuning files reads text lines: with a warning naming the file and line
// for invalid UTF-8, a UTF-8 byte-order mark at the start of the file dropped (data::LineReader's
// rule for every text file: Windows editors write one; XTREME's Python readers decode it away or
// fail, and no XTREME file needs it), and a NUL byte an error naming the file and line (a binary
// or damaged file, whose NUL would end a field early in C code downstream).
//
// With `keep_bytes` > 0 a longer line is cut to its first `keep_bytes` bytes (at a character
// boundary) while it is read, with a warning naming the file and line: the rest is never held.
class Lines {
 public:
  explicit Lines(const std::string& path, int64_t keep_bytes = 0);
  // The next line without its line end; false at the end of the file.
  bool next(std::string& line);
  int64_t lines_read() const { return reader_.lines_read(); }

 private:
  data::LineReader reader_;
  int64_t keep_bytes_ = 0;
};

// "path:line".
std::string where(const std::string& path, int64_t line);

// Throws "<what>: file '<path>' not found; <remedy>" when `path` is not a file. `remedy` says
// what the user has to do for this file (the config key to fix, the archive to unpack, the
// command that writes it): data_remedy and gold_remedy for XTREME's files.
void require_file(const std::string& path, const std::string& what, const std::string& remedy);

// "XTREME's scripts/download_data.sh writes it into its download/ folder; set finetune.data_dir
// ('<data_dir>') to that folder".
std::string download_remedy(const std::string& data_dir);

// How to get `task`'s processed files under finetune.data_dir `data_dir`: XTREME's
// scripts/download_data.sh, or for udpos and panx xlme-data xtreme (XTREME's own converter needs
// an old networkx; PAN-X needs a manual download).
std::string data_remedy(const std::string& task, const std::string& data_dir);

// How to get a task's upstream test gold into finetune.gold_dir.
std::string gold_remedy(TaskGold gold);

// Refuses a file that gave nothing to read (`found` false), naming it: a 0-byte file (a failed
// download or copy) or one without a single `expected` (an HTML page, only blank lines).
void require_content(bool found, const std::string& path, const std::string& expected);

// `text` with every byte that is not printable ASCII (or is a backslash) written as \xNN.
std::string visible(const std::string& text);

// `label` when it is in task_labels(task); throws naming `at` and listing the set otherwise (the
// label shown through visible(), a byte-order mark in it named).
std::string check_label(const std::string& label, const std::string& task, const std::string& at);

// Every line of `path` (no line ends); `keep_bytes` as for Lines.
std::vector<std::string> read_lines(const std::string& path, int64_t keep_bytes = 0);

// `lines`, each ended by "\n", written atomically.
void write_lines_atomic(const std::string& path, const std::vector<std::string>& lines);

// `items` joined by `separator`.
std::string join(const std::vector<std::string>& items, const std::string& separator = " ");

bool contains(const std::vector<std::string>& items, const std::string& item);

}  // namespace xlme::finetune::io
