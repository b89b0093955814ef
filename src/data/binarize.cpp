#include "xlme/data/binarize.h"

#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/data/line_reader.h"
#include "xlme/data/spm_trainer.h"
#include "xlme/data/text.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace xlme::data {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

enum LineStatus : uint8_t { kOk = 0, kBlank = 1, kInvalid = 2, kEmpty = 3, kNul = 4, kTooLong = 5 };

// One work item: source lines in, their pieces out (para: lines alternate e, f).
struct Chunk {
  std::vector<std::string> lines;
  int64_t source_lines = 0;  // lines consumed from each source file
  std::vector<int32_t> tokens;
  std::vector<uint32_t> lengths;
  std::vector<uint8_t> status;  // kTooLong set by the reader, the rest by encode_chunk
};

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\v\f") == std::string::npos;
}

void encode_chunk(const Tokenizer& tokenizer, Chunk& chunk) {
  chunk.lengths.resize(chunk.lines.size());
  chunk.status.resize(chunk.lines.size());
  for (size_t i = 0; i < chunk.lines.size(); ++i) {
    const std::string& line = chunk.lines[i];
    if (chunk.status[i] == kTooLong) continue;
    if (line.find('\0') != std::string::npos) {
      chunk.status[i] = kNul;
    } else if (is_blank(line)) {
      chunk.status[i] = kBlank;
    } else if (!valid_utf8(line)) {
      chunk.status[i] = kInvalid;
    } else {
      const auto ids = tokenizer.encode(line);
      chunk.status[i] = ids.empty() ? kEmpty : kOk;
      chunk.lengths[i] = static_cast<uint32_t>(ids.size());
      chunk.tokens.insert(chunk.tokens.end(), ids.begin(), ids.end());
    }
  }
  chunk.lines.clear();
  chunk.lines.shrink_to_fit();
}

// Worker threads that encode chunks; results come back in submission order.
class EncodePool {
 public:
  EncodePool(const Tokenizer& tokenizer, int64_t threads) : tokenizer_(tokenizer) {
    for (int64_t t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (auto& w : workers_) w.join();
  }

  void submit(Chunk chunk) {
    std::lock_guard<std::mutex> lock(mutex_);
    todo_.emplace_back(next_submit_++, std::move(chunk));
    ready_.notify_one();
  }

  // The next chunk in order; rethrows a worker's error.
  Chunk next() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_.count(next_take_) > 0 || error_; });
    if (error_) std::rethrow_exception(error_);
    Chunk chunk = std::move(done_.at(next_take_));
    done_.erase(next_take_++);
    return chunk;
  }

 private:
  void work() {
    for (;;) {
      std::pair<int64_t, Chunk> item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (stop_) return;
        item = std::move(todo_.front());
        todo_.pop_front();
      }
      try {
        encode_chunk(tokenizer_, item.second);
        std::lock_guard<std::mutex> lock(mutex_);
        done_.emplace(item.first, std::move(item.second));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
      }
      done_cv_.notify_all();
    }
  }

  const Tokenizer& tokenizer_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable ready_, done_cv_;
  std::deque<std::pair<int64_t, Chunk>> todo_;
  std::map<int64_t, Chunk> done_;
  int64_t next_submit_ = 0, next_take_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// An append-only binary file that can be truncated back to a checkpoint.
class AppendFile {
 public:
  // Never through a link planted at the shard's name (open_own_file refuses it).
  AppendFile(const std::string& path, uint64_t keep_bytes) : path_(path) {
    const int fd = open_own_file(path, keep_bytes, "the unfinished shard file");
    file_ = ::fdopen(fd, "ab");
    if (file_ == nullptr) ::close(fd);
    XLME_CHECK(file_ != nullptr, "cannot write '{}': {}", path, std::strerror(errno));
  }
  ~AppendFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  void write(const void* data, size_t bytes) {
    XLME_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, "cannot write '{}': {} (disk full?)",
               path_, std::strerror(errno));
  }
  void sync() {
    XLME_CHECK(std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0,
               "cannot write '{}': {} (disk full?)", path_, std::strerror(errno));
  }
  void close() {
    sync();
    std::fclose(file_);
    file_ = nullptr;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// What a checkpoint records: enough to truncate the partial files and skip consumed lines.
struct Progress {
  uint64_t source_signature = 0, tokenizer_hash = 0;
  int64_t source_lines = 0, segments = 0, tokens = 0, documents = 0;
  int64_t invalid = 0, empty = 0, nul = 0, too_long = 0;
  uint32_t bin_crc = 0;
  int64_t in_document = 0;  // mono: the last sentence's document continues

  std::string to_text() const {
    return fmt::format(
        "source_signature {}\ntokenizer_hash {}\nsource_lines {}\nsegments {}\ntokens {}\n"
        "documents {}\ninvalid {}\nempty {}\nnul {}\ntoo_long {}\nbin_crc {}\nin_document {}\n",
        source_signature, tokenizer_hash, source_lines, segments, tokens, documents, invalid, empty,
        nul, too_long, bin_crc, in_document);
  }
  static bool from_text(const std::string& text, Progress& p) {
    std::istringstream in(text);
    std::map<std::string, std::string> kv;
    for (std::string key, value; in >> key >> value;) kv[key] = value;
    try {
      p.source_signature = std::stoull(kv.at("source_signature"));
      p.tokenizer_hash = std::stoull(kv.at("tokenizer_hash"));
      p.source_lines = std::stoll(kv.at("source_lines"));
      p.segments = std::stoll(kv.at("segments"));
      p.tokens = std::stoll(kv.at("tokens"));
      p.documents = std::stoll(kv.at("documents"));
      p.invalid = std::stoll(kv.at("invalid"));
      p.empty = std::stoll(kv.at("empty"));
      p.nul = std::stoll(kv.at("nul"));
      p.too_long = std::stoll(kv.at("too_long"));
      p.bin_crc = static_cast<uint32_t>(std::stoul(kv.at("bin_crc")));
      p.in_document = std::stoll(kv.at("in_document"));
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
};

std::string read_text(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "";
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), f)) > 0;) text.append(buffer, n);
  std::fclose(f);
  return text;
}

// Hands the bytes of `path` to `consume` in blocks of 1 MiB.
void stream_file(const std::string& path, const std::function<void(const void*, size_t)>& consume) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  XLME_CHECK(f != nullptr, "cannot read '{}': {}", path, std::strerror(errno));
  std::vector<char> buffer(1 << 20);
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0;)
    consume(buffer.data(), n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  XLME_CHECK(!failed, "cannot read '{}': read error; check the disk", path);
}

// What says that a source changed: its path, size, modification time and status-change time.
// The last one because an edit can keep the size and put the old mtime back (`touch -d`,
// `cp -p`, rsync -t); the kernel sets ctime on every write and no user call can set it back.
uint64_t source_signature(const std::vector<std::string>& paths) {
  std::string key;
  for (const auto& path : paths) {
    struct stat info {};
    XLME_CHECK(::stat(path.c_str(), &info) == 0, "cannot read '{}': {}", path,
               std::strerror(errno));
    key += fmt::format("{}|{}|{}.{}|{}.{};", fs::absolute(path).string(), info.st_size,
                       info.st_mtim.tv_sec, info.st_mtim.tv_nsec, info.st_ctim.tv_sec,
                       info.st_ctim.tv_nsec);
  }
  return hash64(key);
}

std::string strip_compression(const std::string& name) {
  for (const std::string suffix : {".gz", ".xz"}) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return name.substr(0, name.size() - suffix.size());
    }
  }
  return name;
}

// Counts the lines left in `reader` (for the mismatched-length error).
int64_t count_rest(LineReader& reader) {
  std::string line;
  while (reader.next(line)) {
  }
  return reader.lines_read();
}

// Binarizes one mono file or para pair into <stem>.{bin,idx}.
class ShardBuilder {
 public:
  ShardBuilder(const BinarizeOptions& options, const Tokenizer& tokenizer, ShardKind kind,
               std::string name, std::vector<std::string> sources, std::string stem)
      : options_(options),
        tokenizer_(tokenizer),
        kind_(kind),
        sources_(std::move(sources)),
        stem_(std::move(stem)) {
    report_.name = std::move(name);
    report_.kind = kind;
    dtype_bytes_ = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  }

  BinarizeReport run() {
    const auto start = Clock::now();
    signature_ = source_signature(sources_);
    for (const auto& s : sources_) report_.source_bytes += static_cast<int64_t>(fs::file_size(s));
    if (up_to_date()) {
      report_.up_to_date = report_.finished = true;
      return report_;
    }
    fs::create_directories(fs::path(stem_).parent_path());
    Progress resume;
    if (Progress::from_text(read_text(stem_ + ".progress"), resume) &&
        resume.source_signature == signature_ && resume.tokenizer_hash == tokenizer_.hash()) {
      state_ = resume;
      report_.resumed = true;
      spdlog::info("{}: resuming after {} lines ({} tokens)", report_.name, state_.source_lines,
                   state_.tokens);
    }
    state_.source_signature = signature_;
    state_.tokenizer_hash = tokenizer_.hash();
    bin_ = std::make_unique<AppendFile>(stem_ + ".bin.partial",
                                        static_cast<uint64_t>(state_.tokens) * dtype_bytes_);
    offsets_ = std::make_unique<AppendFile>(stem_ + ".offsets.partial",
                                            static_cast<uint64_t>(state_.segments) * 8);
    docs_ = std::make_unique<AppendFile>(stem_ + ".docs.partial",
                                         static_cast<uint64_t>(state_.documents) * 8);
    const bool complete = encode_all();
    report_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (complete) {
      check_invalid_lines();
      XLME_CHECK(state_.segments > 0,
                 "{} '{}' has no data: {} has no usable lines ({} lines read, {} with invalid "
                 "UTF-8, {} without pieces); remove it or fix data.{}.languages",
                 kind_ == ShardKind::kMono ? "language" : "language pair", report_.name,
                 fmt::join(sources_, " / "), state_.source_lines, state_.invalid, state_.empty,
                 kind_ == ShardKind::kMono ? "mono" : "para");
      finish();
    }
    report_.finished = complete;
    report_.source_lines = state_.source_lines;
    report_.sequences = kind_ == ShardKind::kMono ? state_.segments : state_.segments / 2;
    report_.tokens = state_.tokens;
    report_.invalid_utf8_lines = state_.invalid;
    report_.nul_lines = state_.nul;
    report_.long_lines = state_.too_long;
    report_.empty_lines = state_.empty;
    return report_;
  }

 private:
  // Warns about skipped lines; fails when invalid UTF-8 and NUL lines are more than
  // max_invalid_fraction of the file (UTF-16, binary data), before the shard is replaced.
  void check_invalid_lines() const {
    const std::string files = fmt::format("'{}'", fmt::join(sources_, "' / '"));
    if (state_.too_long > 0) {
      spdlog::warn("{}: skipped {} lines longer than {} bytes (data.binarize.max_line_bytes)",
                   files, state_.too_long, options_.max_line_bytes);
    }
    const int64_t bad = state_.invalid + state_.nul;
    if (bad == 0) return;
    spdlog::warn("{}: skipped {} of {} lines: {} with invalid UTF-8, {} with NUL bytes", files, bad,
                 state_.source_lines, state_.invalid, state_.nul);
    XLME_CHECK(static_cast<double>(bad) <=
                   options_.max_invalid_fraction * static_cast<double>(state_.source_lines),
               "{} is not UTF-8 text: {} of {} lines have invalid UTF-8 ({}) or NUL bytes ({}), "
               "more than data.binarize.max_invalid_fraction = {}; convert it to UTF-8 (e.g. "
               "iconv -f UTF-16 -t UTF-8) or remove it; the shard '{}' was not written",
               files, bad, state_.source_lines, state_.invalid, state_.nul,
               options_.max_invalid_fraction, stem_);
  }

  bool up_to_date() const {
    if (!fs::exists(stem_ + ".idx") || !fs::exists(stem_ + ".bin")) return false;
    try {
      const Shard shard(stem_);
      return shard.header().source_signature == signature_ &&
             shard.header().tokenizer_hash == tokenizer_.hash();
    } catch (const Error&) {
      return false;  // unreadable: binarize again
    }
  }

  // Reads the next chunk; false at the end of the input.
  bool read_chunk(std::vector<std::unique_ptr<LineReader>>& readers, Chunk& chunk) {
    std::string line;
    while (chunk.source_lines < options_.chunk_lines) {
      if (!readers[0]->next(line)) {
        if (readers.size() == 2) {
          std::string other;
          if (readers[1]->next(other)) mismatch(readers);
        }
        break;
      }
      chunk.lines.push_back(std::move(line));
      chunk.status.push_back(readers[0]->too_long() ? kTooLong : kOk);
      if (readers.size() == 2) {
        std::string other;
        if (!readers[1]->next(other)) mismatch(readers);
        chunk.lines.push_back(std::move(other));
        chunk.status.push_back(readers[1]->too_long() ? kTooLong : kOk);
      }
      ++chunk.source_lines;
    }
    return chunk.source_lines > 0;
  }

  [[noreturn]] void mismatch(std::vector<std::unique_ptr<LineReader>>& readers) {
    const int64_t a = count_rest(*readers[0]);
    const int64_t b = count_rest(*readers[1]);
    XLME_FAIL(
        "parallel files '{}' ({} lines) and '{}' ({} lines) have different line counts; every "
        "line of one must translate the same line of the other",
        readers[0]->path(), a, readers[1]->path(), b);
  }

  bool encode_all() {
    std::vector<std::unique_ptr<LineReader>> readers;
    LineReaderOptions reader_options;
    reader_options.max_line_bytes = options_.max_line_bytes;
    for (const auto& s : sources_) {
      readers.push_back(std::make_unique<LineReader>(s, reader_options));
    }
    std::string skip;
    for (int64_t i = 0; i < state_.source_lines; ++i) {
      for (auto& r : readers) {
        XLME_CHECK(r->next(skip),
                   "cannot resume '{}': its source has fewer lines than the checkpoint; delete "
                   "'{}.progress' to start over",
                   r->path(), stem_);
      }
    }
    EncodePool pool(tokenizer_, std::max<int64_t>(1, options_.threads));
    const int64_t max_in_flight = 2 * std::max<int64_t>(1, options_.threads) + 2;
    int64_t in_flight = 0, submitted = 0;
    bool input_done = false;
    const auto start = Clock::now();
    auto last_report = start;
    const int64_t start_tokens = state_.tokens;
    while (true) {
      while (!input_done && in_flight < max_in_flight &&
             (options_.max_chunks == 0 || submitted < options_.max_chunks)) {
        Chunk chunk;
        if (!read_chunk(readers, chunk)) {
          input_done = true;
          break;
        }
        pool.submit(std::move(chunk));
        ++in_flight;
        ++submitted;
      }
      if (in_flight == 0) break;
      write_chunk(pool.next());
      --in_flight;
      const auto now = Clock::now();
      if (std::chrono::duration<double>(now - last_report).count() >= options_.progress_seconds) {
        last_report = now;
        checkpoint();
        const double elapsed = std::chrono::duration<double>(now - start).count();
        const double done = static_cast<double>(readers[0]->file_bytes_read()) /
                            std::max<int64_t>(1, readers[0]->file_size());
        const double eta = done > 0 ? elapsed * (1 - done) / done : 0;
        spdlog::info("{}: {:.1f}% of {} MB, {} lines, {} tokens, {:.2f}M tokens/s, ETA {:.0f} s",
                     report_.name, 100 * done, readers[0]->file_size() >> 20, state_.source_lines,
                     state_.tokens, (state_.tokens - start_tokens) / elapsed / 1e6, eta);
      }
    }
    if (!input_done) {
      checkpoint();
      return false;
    }
    return true;
  }

  void write_chunk(const Chunk& chunk) {
    std::vector<uint64_t> offsets, docs;
    size_t token_pos = 0;
    auto append = [&](size_t line) {
      offsets.push_back(static_cast<uint64_t>(state_.tokens));
      const uint32_t n = chunk.lengths[line];
      write_tokens(chunk.tokens.data() + token_pos, n);
      token_pos += n;
      state_.tokens += n;
      ++state_.segments;
    };
    if (kind_ == ShardKind::kMono) {
      for (size_t i = 0; i < chunk.status.size(); ++i) {
        switch (chunk.status[i]) {
          case kBlank:
            state_.in_document = 0;
            break;
          case kInvalid:
            ++state_.invalid;
            break;
          case kNul:
            ++state_.nul;
            break;
          case kTooLong:
            ++state_.too_long;
            break;
          case kEmpty:
            ++state_.empty;
            break;
          default:
            if (!state_.in_document) {
              docs.push_back(static_cast<uint64_t>(state_.segments));
              ++state_.documents;
              state_.in_document = 1;
            }
            append(i);
        }
      }
    } else {
      for (size_t i = 0; i + 1 < chunk.status.size(); i += 2) {
        const uint8_t a = chunk.status[i], b = chunk.status[i + 1];
        if (a == kOk && b == kOk) {
          append(i);
          append(i + 1);
          continue;
        }
        token_pos += chunk.lengths[i] * (a == kOk) + chunk.lengths[i + 1] * (b == kOk);
        if (a == kTooLong || b == kTooLong) {
          ++state_.too_long;
        } else if (a == kNul || b == kNul) {
          ++state_.nul;
        } else if (a == kInvalid || b == kInvalid) {
          ++state_.invalid;
        } else {
          ++state_.empty;
        }
      }
    }
    offsets_->write(offsets.data(), offsets.size() * 8);
    docs_->write(docs.data(), docs.size() * 8);
    state_.source_lines += chunk.source_lines;
  }

  void write_tokens(const int32_t* ids, uint32_t n) {
    if (dtype_bytes_ == 4) {
      bin_->write(ids, n * sizeof(int32_t));
      state_.bin_crc = crc32_update(state_.bin_crc, ids, n * sizeof(int32_t));
      return;
    }
    narrow_.assign(ids, ids + n);
    bin_->write(narrow_.data(), n * sizeof(uint16_t));
    state_.bin_crc = crc32_update(state_.bin_crc, narrow_.data(), n * sizeof(uint16_t));
  }

  void checkpoint() {
    bin_->sync();
    offsets_->sync();
    docs_->sync();
    write_file_atomic(stem_ + ".progress", state_.to_text());
  }

  // .idx = header + offsets + end offset (+ document starts + end); .bin renamed into place
  // before .idx, so an .idx always has its .bin. The index is streamed from the .partial files
  // twice (its CRC, then the file), so that memory stays flat in the number of sentences.
  void finish() {
    bin_->close();
    offsets_->close();
    docs_->close();
    const auto end = static_cast<uint64_t>(state_.tokens);
    const auto sentences = static_cast<uint64_t>(state_.segments);
    const auto stream_payload = [&](const std::function<void(const void*, size_t)>& consume) {
      stream_file(stem_ + ".offsets.partial", consume);
      consume(&end, 8);
      if (kind_ == ShardKind::kMono) {
        stream_file(stem_ + ".docs.partial", consume);
        consume(&sentences, 8);
      }
    };
    uint32_t index_crc = 0;
    stream_payload(
        [&](const void* data, size_t size) { index_crc = crc32_update(index_crc, data, size); });
    ShardHeader header;
    std::memcpy(header.magic, kShardMagic, sizeof(kShardMagic));
    header.kind = static_cast<uint32_t>(kind_);
    header.dtype_bytes = dtype_bytes_;
    header.bin_crc32 = state_.bin_crc;
    header.vocab_size = static_cast<uint64_t>(tokenizer_.vocab_size());
    header.tokenizer_hash = tokenizer_.hash();
    header.source_signature = signature_;
    header.segments = static_cast<uint64_t>(state_.segments);
    header.sequences = kind_ == ShardKind::kMono ? header.segments : header.segments / 2;
    header.tokens = static_cast<uint64_t>(state_.tokens);
    header.documents = static_cast<uint64_t>(state_.documents);
    header.source_lines = static_cast<uint64_t>(state_.source_lines);
    header.invalid_utf8_lines = static_cast<uint64_t>(state_.invalid);
    header.empty_lines = static_cast<uint64_t>(state_.empty);
    header.index_crc32 = index_crc;
    std::snprintf(header.name, sizeof(header.name), "%s", report_.name.c_str());
    fs::rename(stem_ + ".bin.partial", stem_ + ".bin");
    write_file_streamed(stem_ + ".idx", [&](const ByteSink& sink) {
      sink(&header, sizeof(header));
      stream_payload([&](const void* data, size_t size) { sink(data, size); });
    });
    fs::remove(stem_ + ".offsets.partial");
    fs::remove(stem_ + ".docs.partial");
    fs::remove(stem_ + ".progress");
  }

  const BinarizeOptions& options_;
  const Tokenizer& tokenizer_;
  ShardKind kind_;
  std::vector<std::string> sources_;
  std::string stem_;
  BinarizeReport report_;
  uint32_t dtype_bytes_ = 2;
  uint64_t signature_ = 0;
  Progress state_;
  std::unique_ptr<AppendFile> bin_, offsets_, docs_;
  std::vector<uint16_t> narrow_;
};

}  // namespace

std::vector<ParaFiles> find_para_files(const std::string& dir,
                                       const std::vector<std::string>& pairs) {
  const fs::path para = fs::path(dir) / "para";
  std::map<std::string, ParaFiles> found;
  if (fs::is_directory(para)) {
    for (const auto& e : fs::directory_iterator(para)) {
      const std::string name = strip_compression(e.path().filename().string());
      const size_t dot = name.rfind('.'), dash = name.find('-');
      if (dot == std::string::npos || dash == std::string::npos || dash > dot) continue;
      const std::string pair = name.substr(0, dot), side = name.substr(dot + 1);
      const std::string first = pair.substr(0, dash), second = pair.substr(dash + 1);
      if (side != first && side != second) continue;
      if (!pairs.empty() && std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) continue;
      check_corpus_file(e.path().string(), pair);
      ParaFiles& files = found[pair];
      files.pair = pair;
      (side == first ? files.first : files.second) = e.path().string();
    }
  }
  std::vector<ParaFiles> result;
  for (auto& [pair, files] : found) {
    if (!pairs.empty() && std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) continue;
    const std::string a = pair.substr(0, pair.find('-')), b = pair.substr(pair.find('-') + 1);
    XLME_CHECK(!files.first.empty() && !files.second.empty(),
               "pair '{}' has only one side in '{}': need {}.{} and {}.{}", pair, para.string(),
               pair, a, pair, b);
    result.push_back(files);
  }
  for (const auto& pair : pairs) {
    XLME_CHECK(found.count(pair) > 0,
               "language pair '{}' has no data: no {}/{}.<lang> files; fix data.para.languages "
               "or add the files",
               pair, para.string(), pair);
  }
  return result;
}

std::vector<BinarizeReport> binarize(const BinarizeOptions& options, const Tokenizer& tokenizer) {
  XLME_CHECK(fs::is_directory(options.input_dir), "corpus folder '{}' not found",
             options.input_dir);
  const bool has_mono = fs::is_directory(fs::path(options.input_dir) / "mono");
  const bool has_para = fs::is_directory(fs::path(options.input_dir) / "para");
  XLME_CHECK(has_mono || has_para,
             "corpus folder '{}' has neither mono/ nor para/; it needs mono/<lang>.txt and/or "
             "para/<a>-<b>.<a|b> files",
             options.input_dir);
  std::vector<BinarizeReport> reports;
  const fs::path out(options.out_dir);
  if (has_mono || !options.mono_languages.empty()) {
    for (const auto& file : find_mono_files(options.input_dir, options.mono_languages)) {
      ShardBuilder builder(options, tokenizer, ShardKind::kMono, file.language, {file.path},
                           (out / "mono" / file.language).string());
      reports.push_back(builder.run());
    }
  }
  if (has_para || !options.para_pairs.empty()) {
    for (const auto& files : find_para_files(options.input_dir, options.para_pairs)) {
      ShardBuilder builder(options, tokenizer, ShardKind::kPara, files.pair,
                           {files.first, files.second}, (out / "para" / files.pair).string());
      reports.push_back(builder.run());
    }
  }
  return reports;
}

}  // namespace xlme::data

namespace xlme::data {

std::vector<ShardSummary> inspect_shards(const std::string& dir, const Tokenizer* tokenizer,
                                         int64_t samples) {
  XLME_CHECK(fs::is_directory(dir), "shard folder '{}' not found; run xlme-data binarize", dir);
  const auto stems = list_shards(dir);
  XLME_CHECK(!stems.empty(),
             "shard folder '{}' has no mono/*.idx or para/*.idx shards; run "
             "xlme-data binarize",
             dir);
  std::vector<ShardSummary> summaries;
  for (const auto& stem : stems) {
    const Shard shard(stem, /*verify_checksums=*/true);
    ShardSummary summary{stem, shard.header(), 0};
    if (tokenizer != nullptr) {
      shard.check_tokenizer(tokenizer->hash(), tokenizer->sentencepiece().path());
      const int64_t n = std::min<int64_t>(samples, shard.segments());
      std::vector<int32_t> ids;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = k * shard.segments() / n;
        ids.clear();
        shard.append_segment(i, ids);
        const std::string text = tokenizer->decode(ids);
        // <unk> decodes to " ⁇ ", which cannot encode back to <unk>: such segments are only
        // decoded.
        if (std::find(ids.begin(), ids.end(), tokenizer->special_ids().unk) != ids.end()) continue;
        XLME_CHECK(tokenizer->encode(text) == ids,
                   "shard '{}': segment {} decodes to '{}', which SentencePiece encodes to other "
                   "ids; the shard does not match the tokenizer '{}': re-run xlme-data binarize",
                   stem, i, text, tokenizer->sentencepiece().path());
        ++summary.checked_segments;
      }
    }
    summaries.push_back(summary);
  }
  return summaries;
}

}  // namespace xlme::data
