// Reads lines from .txt, .gz (zlib) and .xz (liblzma) files in fixed-size blocks, so that a
// corpus is never decompressed to disk or held in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace xlme::data {

struct LineReaderOptions {
  // Lines longer than this (bytes, 0 = no limit) are never held in memory: next() returns them
  // empty with too_long() true, so that parallel files stay line-aligned.
  int64_t max_line_bytes = 0;
  // With max_line_bytes: return the first max_line_bytes bytes of a longer line (cut back to a
  // UTF-8 character boundary) instead of an empty line; too_long() is still true. The rest of the
  // line is read past, never held.
  bool keep_long_line_prefix = false;
  // Log a warning naming the file and line for each of the first invalid UTF-8 lines, and their
  // count at the end of the file.
  bool warn_invalid_utf8 = false;
  // Refuse a file whose first line holds a carriage return that does not end it: lines ended by
  // CR alone (classic Mac OS) would make the whole file one line. Off only for text that is not
  // the user's (the demo corpus' man pages).
  bool refuse_cr_line_ends = true;
  // A later line holding two or more carriage returns (the file switched to CR line ends there):
  // an error (the corpora's readers), or a warning like a single stray one (the XTREME readers,
  // which keep reading published files as their own scorers do).
  bool refuse_cr_inside_later_lines = true;
};

class LineReader {
 public:
  // Opens `path`; the compression comes from its extension (.gz, .xz, anything else: plain).
  // Throws xlme::Error naming the file when it cannot be opened.
  explicit LineReader(const std::string& path, LineReaderOptions options = {});
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n' (and without a trailing '\r'); false at the end of the file.
  // A UTF-8 byte-order mark at the start of the file is dropped (Windows editors write one; no
  // reader wants it in the first sentence, label or field). Throws xlme::Error naming the file,
  // the compressed byte offset and the line on a corrupt or truncated compressed stream, on a .gz
  // file that is not gzip data, and naming the file and the fix on CR-only line ends
  // (refuse_cr_line_ends).
  bool next(std::string& line);

  // Whether the line next() returned last was longer than max_line_bytes (and returned empty).
  bool too_long() const { return too_long_; }
  int64_t long_lines() const { return long_lines_; }
  int64_t lines_read() const { return lines_; }
  int64_t file_bytes_read() const;  // compressed bytes consumed so far (for progress)
  int64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  bool fill();            // appends decompressed bytes to buffer_; false at end of input
  bool skip_long_line();  // drops the rest of a line past max_line_bytes; false at end of input
  void check_utf8(const std::string& line);
  void check_first_line(size_t begin, size_t end) const;  // buffer_[begin, end): line 1 so far
  // buffer_[begin, end): a later line. Carriage returns inside it (not a CRLF's): one is a
  // warning; two or more mean the file switched to CR line ends there, an error.
  void check_carriage_returns(size_t begin, size_t end);
  void finish_line(std::string& line);  // BOM and trailing '\r' dropped, UTF-8 checked

  struct Decoder;
  std::string path_;
  LineReaderOptions options_;
  std::unique_ptr<Decoder> decoder_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t lines_ = 0;
  int64_t file_size_ = 0;
  int64_t decoded_bytes_ = 0;
  bool too_long_ = false;
  int64_t long_lines_ = 0;
  int64_t invalid_utf8_lines_ = 0;
  int64_t stray_cr_lines_ = 0;  // later lines with one carriage return inside
  bool summarized_ = false;
};

}  // namespace xlme::data
