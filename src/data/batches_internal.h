// What the parts of the shard batch pipeline share (batches.h): the reader (batches.cpp), the
// pools and micro-batches (batch_packing.cpp), the schedule (batch_schedule.cpp), the loader
// threads (batch_prefetch.cpp) and the saved state (batch_state.cpp).
#pragma once

#include "xlme/data/batches.h"
#include "xlme/data/shard.h"

#include <array>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace xlme::data {

// Salts that keep the random decisions of different kinds apart.
constexpr uint64_t kSaltRotation = 0x726f74;
constexpr uint64_t kSaltShuffle = 0x736875;
constexpr uint64_t kSaltLanguage = 0x6c616e;
constexpr uint64_t kSaltMask = 0x6d736b;

inline const char* task_key(Task task) {
  return task == Task::kMono ? "mono" : "para";
}

// One pool of one language: its sequences sorted by length and its micro-batches.
struct Pool {
  struct Sequence {
    int64_t first = 0;     // position of its first unit in the language's rotated stream
    int32_t count = 0;     // units (mono: sentences, 2 for sentence pairs; para: 1)
    int32_t length = 0;    // tokens, special tokens included
    int32_t e = 0, f = 0;  // para and sentence pairs: tokens kept of each side
  };
  int64_t index = 0;
  std::vector<Sequence> sequences;                   // ascending length
  std::vector<std::pair<int64_t, int64_t>> batches;  // [begin, end) of sequences, shuffled
};

struct TaskReader::Language {
  std::string name;
  std::unique_ptr<Shard> shard;
  uint64_t key = 0;        // hash_name(name)
  int64_t units = 0;       // sentences or pairs
  int64_t rotation = 0;    // the unit the stream starts at
  int64_t pool_units = 0;  // units per pool, at most one epoch
  std::map<int64_t, std::shared_ptr<const Pool>> cache;

  int64_t unit(int64_t position) const { return (rotation + position) % units; }
};

// ShardBatchSource's readers on loader threads, in order, with the consumed state.
struct ShardBatchSource::Impl {
  struct Slot {
    Batch batch;
    int64_t language = 0;
    ReaderState after;
    std::exception_ptr error;
  };
  struct Pipeline {
    std::unique_ptr<TaskReader> reader;
    int64_t scheduled = 0;          // jobs handed to loader threads
    int64_t consumed = 0;           // batches returned by next()
    std::map<int64_t, Slot> ready;  // built, by job number
    ReaderState consumed_state;     // the reader state after the last batch next() returned
    std::vector<LanguageCount> counts;
  };

  BatchOptions options;
  std::array<std::unique_ptr<Pipeline>, 2> pipelines;  // by Task
  mutable std::mutex mutex;
  std::condition_variable work_cv, ready_cv;
  bool stopping = false;
  size_t turn = 0;
  std::vector<std::thread> workers;

  Pipeline* pipeline(Task task) const;
  // A pipeline with room in its prefetch window, taking turns; null when none has.
  Pipeline* pick();
  void work();
  void start();
  void stop();
};

}  // namespace xlme::data
