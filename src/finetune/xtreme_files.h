// Helpers that the XTREME readers and writers (xtreme_io.cpp, pair_io.cpp, tagging_io.cpp,
// qa_io.cpp, retrieval_io.cpp) share: how files are read, how errors name a place, and the checks
// every reader makes.
#pragma once

#include "xlme/data/line_reader.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::finetune::io {

// XTREME files are read with a warning naming the file and line for invalid UTF-8.
data::LineReaderOptions reader_options();

// "path:line".
std::string where(const std::string& path, int64_t line);

// Throws naming `what` and `path` (and how to get the data) when `path` is not a file.
void require_file(const std::string& path, const std::string& what);

// `label` when it is in task_labels(task); throws naming `at` and listing the set otherwise.
std::string check_label(const std::string& label, const std::string& task, const std::string& at);

// Drops a UTF-8 byte-order mark at the start of `line`.
void drop_bom(std::string& line);

// Every line of `path` (no line ends).
std::vector<std::string> read_lines(const std::string& path);

// `lines`, each ended by "\n", written atomically.
void write_lines_atomic(const std::string& path, const std::vector<std::string>& lines);

// `items` joined by `separator`.
std::string join(const std::vector<std::string>& items, const std::string& separator = " ");

bool contains(const std::vector<std::string>& items, const std::string& item);

}  // namespace xlme::finetune::io
