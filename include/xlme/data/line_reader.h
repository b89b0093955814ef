// Reads lines from .txt, .gz (zlib) and .xz (liblzma) files in fixed-size blocks, so that a
// corpus is never decompressed to disk or held in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace xlme::data {

class LineReader {
 public:
  // Opens `path`; the compression comes from its extension (.gz, .xz, anything else: plain).
  // Throws xlme::Error naming the file when it cannot be opened.
  explicit LineReader(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n' (and without a trailing '\r'); false at the end of the file.
  // Throws xlme::Error naming the file and line on a corrupt compressed stream.
  bool next(std::string& line);

  int64_t lines_read() const { return lines_; }
  int64_t file_bytes_read() const;  // compressed bytes consumed so far (for progress)
  int64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  bool fill();  // appends decompressed bytes to buffer_; false at end of input

  struct Decoder;
  std::string path_;
  std::unique_ptr<Decoder> decoder_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t lines_ = 0;
  int64_t file_size_ = 0;
};

}  // namespace xlme::data
