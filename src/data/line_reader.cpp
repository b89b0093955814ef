#include "xlme/data/line_reader.h"

#include "xlme/common/error.h"
#include "xlme/data/text.h"

#include <spdlog/spdlog.h>

#include <lzma.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace xlme::data {
namespace {

constexpr size_t kBlockBytes = size_t{1} << 20;
constexpr int64_t kInvalidLinesNamed = 3;  // invalid UTF-8 lines warned about one by one

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// One of three decoders; `read` appends up to kBlockBytes decompressed bytes, 0 at the end.
// gzip is decoded member by member with inflate (not gzread, which ends silently at a damaged
// second member or at trailing bytes): every byte of the file must belong to a whole member.
struct LineReader::Decoder {
  enum class Kind { kPlain, kGzip, kXz } kind = Kind::kPlain;
  std::FILE* file = nullptr;
  lzma_stream xz = LZMA_STREAM_INIT;
  z_stream zs{};
  bool zs_started = false;
  bool at_member_start = true;  // gzip: the next input byte starts a member (or the file ends)
  int64_t members = 0;          // gzip members decoded whole
  std::string in;               // compressed input block
  bool input_done = false;
  bool done = false;

  ~Decoder() {
    if (kind == Kind::kXz) lzma_end(&xz);
    if (zs_started) inflateEnd(&zs);
    if (file != nullptr) std::fclose(file);
  }

  size_t avail_in() const { return kind == Kind::kGzip ? zs.avail_in : xz.avail_in; }

  int64_t bytes_consumed() const {
    const long pos = std::ftell(file);
    return pos < 0 ? 0 : static_cast<int64_t>(pos) - static_cast<int64_t>(avail_in());
  }

  // Reads the next compressed block into `in`; returns its size (0 at the end of the file).
  size_t next_input(const std::string& path) {
    in.resize(kBlockBytes);
    const size_t n = std::fread(in.data(), 1, in.size(), file);
    XLME_CHECK(n > 0 || !std::ferror(file), "cannot read '{}': {}", path, std::strerror(errno));
    input_done = n == 0;
    return n;
  }

  size_t read_gzip(char* out, const std::string& path, int64_t decoded) {
    if (done) return 0;
    zs.next_out = reinterpret_cast<Bytef*>(out);
    zs.avail_out = static_cast<uInt>(kBlockBytes);
    while (zs.avail_out > 0) {
      if (zs.avail_in < 2 && !input_done) {
        // Keep an unread byte: a member's 2-byte magic may straddle two blocks.
        const std::string rest(reinterpret_cast<const char*>(zs.next_in), zs.avail_in);
        const size_t n = next_input(path);
        in.insert(0, rest);
        in.resize(rest.size() + n);
        zs.next_in = reinterpret_cast<Bytef*>(in.data());
        zs.avail_in = static_cast<uInt>(in.size());
        continue;
      }
      const int64_t at = bytes_consumed();
      const size_t produced = kBlockBytes - zs.avail_out;
      if (at_member_start) {
        if (zs.avail_in == 0) {  // the end of the file, after whole members (or an empty file)
          done = true;
          break;
        }
        const bool magic = zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b;
        XLME_CHECK(magic || members > 0,
                   "'{}' is not gzip data (no gzip header at byte 0); rename it without .gz if it "
                   "is plain text, or re-compress it",
                   path);
        XLME_CHECK(magic,
                   "'{}' has {} bytes after its gzip member {} (which ends at byte {} of {}, after "
                   "{} decompressed bytes) that are not another gzip member: a damaged member or "
                   "trailing garbage, whose lines would be lost; re-download or re-compress it "
                   "(gzip -t names the damage)",
                   path, file_size(path) - at, members, at, file_size(path),
                   decoded + static_cast<int64_t>(produced));
        const int init = zs_started ? inflateReset(&zs) : inflateInit2(&zs, 16 + MAX_WBITS);
        XLME_CHECK(init == Z_OK, "cannot start the gzip decoder for '{}' (zlib error {})", path,
                   init);
        zs_started = true;
        at_member_start = false;
      }
      const int ret = inflate(&zs, Z_NO_FLUSH);
      if (ret == Z_STREAM_END) {
        ++members;
        at_member_start = true;
        continue;
      }
      if (ret == Z_BUF_ERROR && zs.avail_in == 0 && input_done) {
        XLME_FAIL(
            "'{}' is truncated: its gzip data stops at byte {} of {} before the end of the stream, "
            "after {} decompressed bytes; re-download or re-compress it",
            path, bytes_consumed(), file_size(path),
            decoded + static_cast<int64_t>(kBlockBytes - zs.avail_out));
      }
      XLME_CHECK(ret == Z_OK || ret == Z_BUF_ERROR,
                 "'{}' is not a valid gzip file or is corrupt in member {} at byte {} of {} ({}); "
                 "re-download or re-compress it",
                 path, members + 1, bytes_consumed(), file_size(path),
                 zs.msg != nullptr ? zs.msg : "zlib error " + std::to_string(ret));
    }
    return kBlockBytes - zs.avail_out;
  }

  static int64_t file_size(const std::string& path) {
    return static_cast<int64_t>(std::filesystem::file_size(path));
  }

  // `decoded` bytes were decompressed before this call (for the error messages).
  size_t read(char* out, const std::string& path, int64_t decoded) {
    if (kind == Kind::kPlain) {
      const size_t n = std::fread(out, 1, kBlockBytes, file);
      XLME_CHECK(n > 0 || !std::ferror(file), "cannot read '{}': {}", path, std::strerror(errno));
      return n;
    }
    if (kind == Kind::kGzip) return read_gzip(out, path, decoded);
    if (done) return 0;
    xz.next_out = reinterpret_cast<uint8_t*>(out);
    xz.avail_out = kBlockBytes;
    while (xz.avail_out > 0) {
      if (xz.avail_in == 0 && !input_done) {
        const size_t n = next_input(path);
        xz.next_in = reinterpret_cast<const uint8_t*>(in.data());
        xz.avail_in = n;
      }
      const lzma_ret ret = lzma_code(&xz, input_done ? LZMA_FINISH : LZMA_RUN);
      if (ret == LZMA_STREAM_END) {
        done = true;
        break;
      }
      XLME_CHECK(ret == LZMA_OK,
                 "'{}' is not a valid xz file or is truncated (liblzma error {} at byte {} of {}, "
                 "after {} decompressed bytes); re-download or re-compress it",
                 path, static_cast<int>(ret), xz.total_in, std::filesystem::file_size(path),
                 decoded + static_cast<int64_t>(kBlockBytes - xz.avail_out));
    }
    return kBlockBytes - xz.avail_out;
  }
};

LineReader::LineReader(const std::string& path, LineReaderOptions options)
    : path_(path), options_(options), decoder_(new Decoder) {
  XLME_CHECK(std::filesystem::is_regular_file(path), "input file '{}' not found", path);
  file_size_ = static_cast<int64_t>(std::filesystem::file_size(path));
  decoder_->file = std::fopen(path.c_str(), "rb");
  XLME_CHECK(decoder_->file != nullptr, "cannot open '{}': {}", path, std::strerror(errno));
  if (ends_with(path, ".gz")) {
    decoder_->kind = Decoder::Kind::kGzip;
    return;
  }
  if (ends_with(path, ".xz")) {
    decoder_->kind = Decoder::Kind::kXz;
    const lzma_ret ret = lzma_stream_decoder(&decoder_->xz, UINT64_MAX, LZMA_CONCATENATED);
    XLME_CHECK(ret == LZMA_OK, "cannot start the xz decoder for '{}' (liblzma error {})", path,
               static_cast<int>(ret));
  }
}

LineReader::~LineReader() = default;

int64_t LineReader::file_bytes_read() const {
  return decoder_->bytes_consumed();
}

bool LineReader::fill() {
  if (eof_) return false;
  buffer_.erase(0, pos_);
  pos_ = 0;
  const size_t old = buffer_.size();
  buffer_.resize(old + kBlockBytes);
  const size_t n = decoder_->read(buffer_.data() + old, path_, decoded_bytes_);
  buffer_.resize(old + n);
  decoded_bytes_ += static_cast<int64_t>(n);
  eof_ = n == 0;
  return n > 0;
}

bool LineReader::skip_long_line() {
  for (;;) {
    const size_t newline = buffer_.find('\n', pos_);
    if (newline != std::string::npos) {
      pos_ = newline + 1;
      return true;
    }
    pos_ = buffer_.size();
    if (!fill()) return false;
  }
}

void LineReader::check_utf8(const std::string& line) {
  if (!options_.warn_invalid_utf8 || valid_utf8(line)) return;
  if (++invalid_utf8_lines_ <= kInvalidLinesNamed) {
    spdlog::warn("{}:{}: invalid UTF-8; the file must be UTF-8 text (convert it with iconv)", path_,
                 lines_);
  }
}

void LineReader::check_first_line(size_t begin, size_t end) const {
  if (!options_.refuse_cr_line_ends || lines_ > 0) return;
  const size_t cr = buffer_.find('\r', begin);
  if (cr == std::string::npos || cr + 1 >= end) return;  // none, or the CR of a CRLF
  // UTF-16 text ("\r\0\n\0") or binary data: named as such by the readers' UTF-8 checks.
  if (buffer_.find('\0', begin) < end) return;
  XLME_FAIL(
      "'{}' has a carriage return (\\r) at byte {} of its first line, with no line feed (\\n) "
      "before it: its lines end in CR alone (classic Mac OS), and the whole file would be read "
      "as one line; convert its line ends to LF, e.g. tr '\\r' '\\n' < FILE > FILE.new (for a "
      ".gz: zcat FILE | tr '\\r' '\\n' | gzip > FILE.new.gz), or remove the stray \\r if only "
      "this line has one",
      path_, cr - begin + 1);
}

void LineReader::check_carriage_returns(size_t begin, size_t end) {
  if (!options_.refuse_cr_line_ends || lines_ == 0 || begin >= end) return;
  const size_t last = buffer_[end - 1] == '\r' ? end - 1 : end;  // a CRLF's CR is no line end
  size_t count = 0, first = std::string::npos;
  for (size_t at = buffer_.find('\r', begin); at < last; at = buffer_.find('\r', at + 1)) {
    if (first == std::string::npos) first = at;
    ++count;
  }
  if (count == 0) return;
  // UTF-16 text or binary data: named as such by the readers' UTF-8 checks.
  if (buffer_.find('\0', begin) < end) return;
  XLME_CHECK(count < 2 || !options_.refuse_cr_inside_later_lines,
             "'{}' line {} holds {} carriage returns (\\r) with no line feed (\\n) after "
             "them, the first at byte {} of the line: from there on its lines end in CR alone "
             "(classic Mac OS) and would be read as one line; convert its line ends to LF, e.g. "
             "tr '\\r' '\\n' < FILE > FILE.new (for a .gz: zcat FILE | tr '\\r' '\\n' | "
             "gzip > FILE.new.gz)",
             path_, lines_ + 1, count, first - begin + 1);
  if (++stray_cr_lines_ <= kInvalidLinesNamed) {
    spdlog::warn("{}:{}: a carriage return (\\r) inside the line, kept as part of it", path_,
                 lines_ + 1);
  }
}

void LineReader::finish_line(std::string& line) {
  ++lines_;
  if (lines_ == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  check_utf8(line);
}

bool LineReader::next(std::string& line) {
  too_long_ = false;
  const size_t limit = options_.max_line_bytes > 0 ? static_cast<size_t>(options_.max_line_bytes)
                                                   : std::string::npos;
  size_t searched = 0;  // bytes after pos_ known to hold no '\n'
  size_t newline;
  while ((newline = buffer_.find('\n', pos_ + searched)) == std::string::npos) {
    searched = buffer_.size() - pos_;
    if (searched > limit) break;
    if (!fill()) {
      if (pos_ >= buffer_.size()) {
        if (!summarized_) {
          summarized_ = true;
          if (options_.warn_invalid_utf8 && invalid_utf8_lines_ > 0) {
            spdlog::warn("'{}': {} of {} lines are not valid UTF-8", path_, invalid_utf8_lines_,
                         lines_);
          }
          if (stray_cr_lines_ > 0) {
            spdlog::warn("'{}': {} of {} lines hold a carriage return (\\r) inside", path_,
                         stray_cr_lines_, lines_);
          }
        }
        return false;
      }
      check_first_line(pos_, buffer_.size());
      check_carriage_returns(pos_, buffer_.size());
      line.assign(buffer_, pos_, std::string::npos);  // a last line without '\n'
      pos_ = buffer_.size();
      finish_line(line);
      return true;
    }
  }
  if (newline == std::string::npos || newline - pos_ > limit) {
    check_first_line(pos_, std::min(newline, buffer_.size()));
    line.clear();
    if (options_.keep_long_line_prefix) {
      size_t end = pos_ + limit;
      // Not inside a UTF-8 character: back up over continuation bytes (10xxxxxx) to its lead.
      while (end > pos_ && (static_cast<unsigned char>(buffer_[end]) & 0xC0) == 0x80) --end;
      line.assign(buffer_, pos_, end - pos_);
    }
    too_long_ = true;
    ++long_lines_;
    ++lines_;
    if (options_.keep_long_line_prefix) check_utf8(line);
    skip_long_line();
    return true;
  }
  check_first_line(pos_, newline);
  check_carriage_returns(pos_, newline);
  line.assign(buffer_, pos_, newline - pos_);
  pos_ = newline + 1;
  finish_line(line);
  return true;
}

}  // namespace xlme::data
