// xlme-data binarize: raw text (mono/<lang>.txt, para/<a>-<b>.<a|b>, plain, .gz or .xz) ->
// memory-mapped shards (shard.h). Streams in chunks with bounded memory, encodes on worker
// threads, writes in order, reports progress, and resumes an interrupted run from its last
// checkpoint (<stem>.progress beside the partial files).
#pragma once

#include "xlme/data/shard.h"
#include "xlme/data/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::data {

struct BinarizeOptions {
  std::string input_dir;                    // raw corpus with mono/ and/or para/
  std::string out_dir;                      // shards: <out>/mono/<lang>.*, <out>/para/<a>-<b>.*
  std::vector<std::string> mono_languages;  // empty = every mono file
  std::vector<std::string> para_pairs;      // empty = every pair in para/
  int64_t threads = 1;                      // encoding threads
  int64_t chunk_lines = 2048;               // lines per work item
  double progress_seconds = 5.0;            // between progress lines and checkpoints
  int64_t max_chunks = 0;  // stop after this many chunks per run, resumable (0 = no limit)
  int64_t max_line_bytes = 1 << 20;    // longer lines are skipped unread (data.binarize)
  double max_invalid_fraction = 0.01;  // of a file's lines: invalid UTF-8 or NUL bytes (fail)
};

struct BinarizeReport {
  std::string name;  // "de" or "en-de"
  ShardKind kind = ShardKind::kMono;
  bool up_to_date = false;  // the shard existed for these sources and tokenizer: skipped
  bool resumed = false;     // continued from a checkpoint
  bool finished = false;    // false when max_chunks stopped it
  int64_t source_lines = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t invalid_utf8_lines = 0;
  int64_t nul_lines = 0;   // lines with NUL bytes (UTF-16 or binary data), skipped
  int64_t long_lines = 0;  // lines longer than max_line_bytes, skipped
  int64_t empty_lines = 0;
  int64_t source_bytes = 0;
  double seconds = 0;
};

// A parallel pair of raw files: para/<a>-<b>.<a> and .<b> (each optionally .gz / .xz).
struct ParaFiles {
  std::string pair;  // "en-de"
  std::string first, second;
};
// Pairs under `dir`/para, sorted, limited to `pairs` when not empty; errors name missing sides.
std::vector<ParaFiles> find_para_files(const std::string& dir,
                                       const std::vector<std::string>& pairs);

// Binarizes every selected file. Throws xlme::Error for missing inputs, parallel files with
// different line counts (naming both files and counts), truncated or corrupt compressed files
// (naming the byte offset), a file whose invalid UTF-8 and NUL lines exceed
// max_invalid_fraction (before its shard is replaced), and I/O errors.
std::vector<BinarizeReport> binarize(const BinarizeOptions& options, const Tokenizer& tokenizer);

}  // namespace xlme::data

namespace xlme::data {

// One shard as `xlme-data inspect` sees it.
struct ShardSummary {
  std::string stem;
  ShardHeader header;
  int64_t checked_segments = 0;  // decoded and re-encoded to the same ids
};

// Opens every shard under `dir` with its checksums verified; with a tokenizer, also checks the
// tokenizer hash and that decoding up to `samples` segments per shard (evenly spaced) and
// encoding the text again gives back the same ids (segments with <unk>, which decodes to " ⁇ ",
// are only decoded). Throws xlme::Error on the first problem.
std::vector<ShardSummary> inspect_shards(const std::string& dir, const Tokenizer* tokenizer,
                                         int64_t samples);

}  // namespace xlme::data
