#include "xlme/data/line_reader.h"

#include "xlme/common/error.h"

#include <lzma.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace xlme::data {
namespace {

constexpr size_t kBlockBytes = size_t{1} << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// One of three decoders; `read` appends up to kBlockBytes decompressed bytes, 0 at the end.
struct LineReader::Decoder {
  enum class Kind { kPlain, kGzip, kXz } kind = Kind::kPlain;
  std::FILE* file = nullptr;
  gzFile gz = nullptr;
  lzma_stream xz = LZMA_STREAM_INIT;
  std::string in;  // compressed input block (xz)
  bool xz_input_done = false;
  bool xz_done = false;

  ~Decoder() {
    if (gz != nullptr) gzclose(gz);
    if (kind == Kind::kXz) lzma_end(&xz);
    if (file != nullptr) std::fclose(file);
  }

  int64_t bytes_consumed() const {
    if (kind == Kind::kGzip) return gzoffset(gz);
    const long pos = std::ftell(file);
    return pos < 0 ? 0 : static_cast<int64_t>(pos) - static_cast<int64_t>(xz.avail_in);
  }

  size_t read(char* out, const std::string& path) {
    if (kind == Kind::kPlain) {
      const size_t n = std::fread(out, 1, kBlockBytes, file);
      XLME_CHECK(n > 0 || !std::ferror(file), "cannot read '{}': {}", path, std::strerror(errno));
      return n;
    }
    if (kind == Kind::kGzip) {
      const int n = gzread(gz, out, static_cast<unsigned>(kBlockBytes));
      int code = Z_OK;
      const char* message = n < 0 ? gzerror(gz, &code) : "";
      XLME_CHECK(n >= 0,
                 "'{}' is not a valid gzip file or is truncated ({}); re-download or "
                 "re-compress it",
                 path, message);
      return static_cast<size_t>(n);
    }
    if (xz_done) return 0;
    xz.next_out = reinterpret_cast<uint8_t*>(out);
    xz.avail_out = kBlockBytes;
    while (xz.avail_out > 0) {
      if (xz.avail_in == 0 && !xz_input_done) {
        in.resize(kBlockBytes);
        const size_t n = std::fread(in.data(), 1, in.size(), file);
        XLME_CHECK(n > 0 || !std::ferror(file), "cannot read '{}': {}", path, std::strerror(errno));
        xz.next_in = reinterpret_cast<const uint8_t*>(in.data());
        xz.avail_in = n;
        xz_input_done = n == 0;
      }
      const lzma_ret ret = lzma_code(&xz, xz_input_done ? LZMA_FINISH : LZMA_RUN);
      if (ret == LZMA_STREAM_END) {
        xz_done = true;
        break;
      }
      XLME_CHECK(ret == LZMA_OK,
                 "'{}' is not a valid xz file or is truncated (liblzma error {} "
                 "after {} compressed bytes); re-download or re-compress it",
                 path, static_cast<int>(ret), xz.total_in);
    }
    return kBlockBytes - xz.avail_out;
  }
};

LineReader::LineReader(const std::string& path) : path_(path), decoder_(new Decoder) {
  XLME_CHECK(std::filesystem::is_regular_file(path), "input file '{}' not found", path);
  file_size_ = static_cast<int64_t>(std::filesystem::file_size(path));
  if (ends_with(path, ".gz")) {
    decoder_->kind = Decoder::Kind::kGzip;
    decoder_->gz = gzopen(path.c_str(), "rb");
    XLME_CHECK(decoder_->gz != nullptr, "cannot open '{}': {}", path, std::strerror(errno));
    gzbuffer(decoder_->gz, kBlockBytes);
    return;
  }
  decoder_->file = std::fopen(path.c_str(), "rb");
  XLME_CHECK(decoder_->file != nullptr, "cannot open '{}': {}", path, std::strerror(errno));
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
  const size_t n = decoder_->read(buffer_.data() + old, path_);
  buffer_.resize(old + n);
  eof_ = n == 0;
  return n > 0;
}

bool LineReader::next(std::string& line) {
  size_t newline;
  while ((newline = buffer_.find('\n', pos_)) == std::string::npos) {
    if (!fill()) {
      if (pos_ >= buffer_.size()) return false;
      line.assign(buffer_, pos_, std::string::npos);  // a last line without '\n'
      pos_ = buffer_.size();
      ++lines_;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
  }
  line.assign(buffer_, pos_, newline - pos_);
  pos_ = newline + 1;
  ++lines_;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

}  // namespace xlme::data
