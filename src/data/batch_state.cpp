// The saved reader state of the shard batch pipeline (batches.h): written into checkpoints,
// restored in O(1) and re-split over any number of ranks; a shard set that changed since is
// refused unless allowed, another tokenizer always.
#include "xlme/common/error.h"

#include "batches_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <optional>
#include <sstream>

namespace xlme::data {

std::string TaskReader::settings() const {
  std::string s =
      fmt::format("max_len={},micro_batch_tokens={},bucket_pool={},seed={}", task_options_.max_len,
                  options_.micro_batch_tokens, options_.bucket_pool, options_.seed);
  if (task_ == Task::kPara)
    s += options_.truncate_too_long ? ",too_long=truncate" : ",too_long=drop";
  return s;
}

void TaskReader::set_state(const ReaderState& state) {
  XLME_CHECK(state.cursors.size() == languages_.size() && state.round >= 0,
             "a {} reader state needs {} language cursors, got {}", task_key(task_),
             languages_.size(), state.cursors.size());
  state_ = state;
  for (auto& language : languages_) language->cache.clear();
}

namespace {

constexpr const char* kStateMagic = "xlme-batches";
constexpr int kStateVersion = 1;

struct SavedTask {
  bool present = false;
  int64_t round = 0;
  std::string settings;
  std::map<std::string, LanguageCursor> cursors;
  std::map<std::string, std::string> shards;  // language -> TaskReader::shard_signatures()
};

struct SavedState {
  int64_t ranks = 0, rank = 0;
  std::array<SavedTask, 2> tasks;
  // The tokenizer the shards were encoded with (data.tokenizer's hash64 and path); no hash in
  // states written without a tokenizer or before it was recorded.
  std::optional<uint64_t> tokenizer_hash;
  std::string tokenizer_path;
};

SavedState parse_state(const std::string& text, size_t which) {
  SavedState s;
  std::istringstream in(text);
  std::string magic;
  int version = 0;
  in >> magic >> version;
  XLME_CHECK(magic == kStateMagic && version == kStateVersion,
             "saved data state #{} is not an {} v{} state (starts with '{}'); the checkpoint "
             "was written by another version of xlme",
             which, kStateMagic, kStateVersion, text.substr(0, 40));
  std::string word;
  while (in >> word) {
    if (word == "ranks") {
      in >> s.ranks;
    } else if (word == "rank") {
      in >> s.rank;
    } else if (word == "shard") {
      std::string task, name, signature;
      in >> task >> name >> signature;
      s.tasks[task == "mono" ? 0 : 1].shards[name] = signature;
    } else if (word == "tokenizer") {
      std::string hex;
      in >> hex;
      char* end = nullptr;
      const uint64_t hash = std::strtoull(hex.c_str(), &end, 16);
      XLME_CHECK(hex.size() == 16 && end == hex.c_str() + hex.size(),
                 "saved data state #{}: the tokenizer hash '{}' is not 16 hex digits", which,
                 hex.substr(0, 40));
      s.tokenizer_hash = hash;
      std::getline(in, s.tokenizer_path);
      if (!s.tokenizer_path.empty() && s.tokenizer_path.front() == ' ')
        s.tokenizer_path.erase(0, 1);
    } else if (word == "mono" || word == "para") {
      SavedTask& t = s.tasks[word == "mono" ? 0 : 1];
      std::string what;
      in >> what;
      if (what == "round") {
        t.present = true;
        in >> t.round >> word >> t.settings;
      } else {
        LanguageCursor c;
        in >> c.pool >> c.batch >> c.consumed;
        t.cursors[what] = c;
      }
    } else {
      XLME_FAIL("saved data state #{}: unexpected '{}'", which, word);
    }
    XLME_CHECK(!in.fail(), "saved data state #{} is malformed near '{}'", which, word);
  }
  XLME_CHECK(s.ranks >= 1, "saved data state #{} names no number of ranks", which);
  return s;
}

// Compares the shards a state was saved with (states without shard lines compare equal) with the
// reader's: fails on a difference unless `allow_change`, then logs it.
void check_shard_set(Task task, const SavedTask& saved, const TaskReader& reader,
                     bool allow_change) {
  if (saved.shards.empty()) return;
  std::map<std::string, std::string> now;
  const auto names = reader.languages();
  const auto signatures = reader.shard_signatures();
  for (size_t j = 0; j < names.size(); ++j) now[names[j]] = signatures[j];
  std::vector<std::string> changes;
  for (const auto& [name, signature] : saved.shards) {
    const auto it = now.find(name);
    if (it == now.end()) {
      changes.push_back(fmt::format("'{}' removed (had {})", name, signature));
    } else if (it->second != signature) {
      changes.push_back(fmt::format("'{}' changed ({} -> {})", name, signature, it->second));
    }
  }
  for (const auto& [name, signature] : now) {
    if (saved.shards.count(name) == 0) {
      changes.push_back(fmt::format("'{}' added ({})", name, signature));
    }
  }
  if (changes.empty()) return;
  XLME_CHECK(allow_change,
             "the {} shards differ from those the checkpoint was trained on (tokens:crc32): {}; "
             "restore the shards (data.shards) or pass --allow-data-change to continue with these",
             task_key(task), fmt::join(changes, ", "));
  spdlog::warn("--allow-data-change: the {} shards differ from the checkpoint's: {}",
               task_key(task), fmt::join(changes, ", "));
}

// A resumed run must encode with the tokenizer the checkpoint was trained with: another
// SentencePiece model (even one of the same size) gives every id another piece, and the trained
// embeddings would be meaningless. --allow-data-change covers other shards, never this.
void check_tokenizer(const SavedState& saved, const BatchOptions& options) {
  if (!saved.tokenizer_hash || options.tokenizer_path.empty()) return;
  XLME_CHECK(
      *saved.tokenizer_hash == options.tokenizer_hash,
      "the checkpoint was trained with the tokenizer '{}' (hash {:016x}), but data.tokenizer "
      "'{}' is another SentencePiece model (hash {:016x}): its ids mean other pieces, so the "
      "trained embeddings would be meaningless (--allow-data-change allows other shards, "
      "not another vocabulary). Set data.tokenizer back to '{}' (the checkpoint holds a "
      "copy, tokenizer.model) and use shards binarized with it, or start a new run in "
      "another run.out_dir",
      saved.tokenizer_path, *saved.tokenizer_hash, options.tokenizer_path, options.tokenizer_hash,
      saved.tokenizer_path);
}

}  // namespace

std::string ShardBatchSource::state() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::string text = fmt::format("{} {}\nranks {}\nrank {}\n", kStateMagic, kStateVersion,
                                 impl_->options.ranks, impl_->options.rank);
  const std::string& tokenizer = impl_->options.tokenizer_path;
  if (!tokenizer.empty()) {
    // The path names the file in messages: one line of it (a path with a line break is left out).
    const bool one_line = tokenizer.find_first_of("\r\n") == std::string::npos;
    text += fmt::format("tokenizer {:016x} {}\n", impl_->options.tokenizer_hash,
                        one_line ? tokenizer : "");
  }
  for (const Task task : {Task::kMono, Task::kPara}) {
    const auto& p = impl_->pipelines[static_cast<size_t>(task)];
    if (!p) continue;
    const ReaderState& s = p->consumed_state;
    text +=
        fmt::format("{} round {} settings {}\n", task_key(task), s.round, p->reader->settings());
    const auto names = p->reader->languages();
    for (size_t j = 0; j < names.size(); ++j) {
      const LanguageCursor& c = s.cursors[j];
      text +=
          fmt::format("{} {} {} {} {}\n", task_key(task), names[j], c.pool, c.batch, c.consumed);
    }
    const auto signatures = p->reader->shard_signatures();
    for (size_t j = 0; j < names.size(); ++j) {
      text += fmt::format("shard {} {} {}\n", task_key(task), names[j], signatures[j]);
    }
  }
  return text;
}

void ShardBatchSource::restore(const std::vector<std::string>& saved) {
  XLME_CHECK(!saved.empty(), "restoring the data state needs the state of at least one rank");
  std::vector<SavedState> states;
  for (size_t i = 0; i < saved.size(); ++i) {
    states.push_back(parse_state(saved[i], i));
    XLME_CHECK(states.back().ranks == static_cast<int64_t>(saved.size()),
               "saved data state #{} was written by one of {} ranks, but {} states were given; "
               "pass the state of every rank of the saving run",
               i, states.back().ranks, saved.size());
  }
  check_tokenizer(states.front(), impl_->options);
  std::array<ReaderState, 2> restored;
  for (const Task task : {Task::kMono, Task::kPara}) {
    const size_t t = static_cast<size_t>(task);
    const auto& p = impl_->pipelines[t];
    if (!p) continue;
    // Every rank's cursors are global: ranks that saved after the same number of micro-batches
    // hold the same state. If some lag, the most advanced state wins (the laggards skip the
    // micro-batches they had not read).
    const SavedTask* best = nullptr;
    for (const auto& s : states) {
      if (s.tasks[t].present && (best == nullptr || s.tasks[t].round > best->round)) {
        best = &s.tasks[t];
      }
    }
    ReaderState state;
    state.cursors.assign(p->reader->languages().size(), LanguageCursor{});
    if (best != nullptr) {
      XLME_CHECK(best->settings == p->reader->settings(),
                 "the saved {} data state was made with {}, this run has {}; the cursors address "
                 "micro-batches of those settings: restore with the same data and train settings",
                 task_key(task), best->settings, p->reader->settings());
      state.round = best->round;
      check_shard_set(task, *best, *p->reader, impl_->options.allow_data_change);
      const auto names = p->reader->languages();
      for (size_t j = 0; j < names.size(); ++j) {
        const auto it = best->cursors.find(names[j]);
        if (it != best->cursors.end()) state.cursors[j] = it->second;  // new languages start at 0
      }
    }
    restored[t] = state;
  }
  impl_->stop();
  for (size_t t = 0; t < restored.size(); ++t) {
    const auto& p = impl_->pipelines[t];
    if (!p) continue;
    p->reader->set_state(restored[t]);
    p->consumed_state = restored[t];
    p->scheduled = p->consumed = 0;
    p->ready.clear();
  }
  impl_->start();
}

}  // namespace xlme::data
