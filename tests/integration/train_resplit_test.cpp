// Preemption across ranks and a change of rank count: two Gloo ranks on real shards, one of them
// signalled in the middle of a step, both stop after the same micro-batch and save the last
// finished step; one process resumes from it. The data streams are re-split
// (docs/ARCHITECTURE.md#data): every language's micro-batches trained on, over both runs, are
// exactly the first ones of its global sequence (none twice, none skipped), and the abandoned
// step's micro-batches are trained on after the resume.
#include "xlme/common/exit_codes.h"
#include "xlme/data/batches.h"
#include "xlme/data/binarize.h"
#include "xlme/train/pretrain.h"
#include "xlme/train/signals.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/serialize.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace xlme::train {
namespace {

using xlme::testing::read_file;
using xlme::testing::spawn_self;
using xlme::testing::TempDir;
using xlme::testing::wait_exit_code;

constexpr int64_t kCallsPerStepTwoRanks = 4;  // per rank: 2 micro-batches x 2 tasks

// A micro-batch's identity: its rows' original tokens.
std::string fingerprint(const data::Batch& b) {
  std::ostringstream out;
  const auto labels = b.labels.contiguous();
  const auto* p = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i) out << p[i] << ',';
  return std::to_string(std::hash<std::string>{}(out.str()));
}

// Logs "<task> <fingerprint>" per micro-batch read; raises SIGTERM while reading call `stop_at`.
class RecordingSource : public data::BatchSource {
 public:
  RecordingSource(data::BatchSource& inner, const std::string& log, int64_t stop_at)
      : inner_(inner), log_(log, std::ios::app), stop_at_(stop_at) {}
  data::Batch next(data::Task task) override {
    if (++calls_ == stop_at_) std::raise(SIGTERM);
    data::Batch b = inner_.next(task);
    log_ << (task == data::Task::kMono ? "mono " : "para ") << fingerprint(b) << std::endl;
    return b;
  }
  std::string state() const override { return inner_.state(); }
  void restore(const std::vector<std::string>& saved) override { inner_.restore(saved); }

 private:
  data::BatchSource& inner_;
  std::ofstream log_;
  int64_t stop_at_;
  int64_t calls_ = 0;
};

config::Config resplit_config(const std::string& dir, int64_t steps) {
  auto c = xlme::testing::tiny_train_config(2, 1, /*dropout=*/0.1);
  c.model.vocab_size = data::Tokenizer(dir + "/spm.model", data::VocabLayout::kOwn).vocab_size();
  c.data.tokenizer = dir + "/spm.model";
  c.data.shards = dir + "/shards";
  c.data.bucket_pool = 8;  // many pools, so that cursors cross pool boundaries
  c.data.mono.max_len = 32;
  c.data.para.max_len = 32;
  c.data.too_long = "truncate";
  c.train.micro_batch_tokens = 64;
  c.train.tokens_per_task = 2 * 2 * 64;  // 2 ranks x 2 micro-batches, or 1 rank x 4
  c.train.steps = steps;
  c.train.warmup_steps = 1;
  c.train.log_every = 1;
  c.train.save_every = 0;
  c.run.out_dir = dir + "/run";
  return c;
}

int run_rank(const config::Config& c, const dist::LaunchInfo& launch, const std::string& log,
             int64_t stop_at) {
  const data::Tokenizer tokenizer(c.data.tokenizer, data::VocabLayout::kOwn);
  auto comm = dist::Communicator::create(launch, torch::kCPU, "gloo", std::chrono::seconds(60));
  data::ShardBatchSource shards(
      data::BatchOptions::from_config(c, &tokenizer, launch.rank, launch.world_size));
  RecordingSource source(shards, log, stop_at);
  return pretrain(c, PretrainOptions{}, source, comm);
}

// Runs inside the spawned ranks only.
TEST(TrainResplit, DISABLED_Worker) {
  const std::string dir = std::getenv("XLME_DIR");
  const auto launch = dist::launch_info_from_env();
  const int64_t stop_at = launch.rank == 1 ? std::atoll(std::getenv("XLME_STOP_AT")) : 0;
  const auto c = resplit_config(dir, std::atoll(std::getenv("XLME_STEPS")));
  const int code =
      run_rank(c, launch, dir + "/rank" + std::to_string(launch.rank) + ".log", stop_at);
  std::exit(code);
}

std::vector<std::pair<std::string, std::string>> read_log(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(read_file(path));
  for (std::string task, print; in >> task >> print;) out.emplace_back(task, print);
  return out;
}

void write_resplit_corpus(const std::string& dir) {
  unsigned state = 11;
  auto next = [&state] { return (state = state * 1103515245u + 12345u) >> 16; };
  std::string en, de, fr;
  for (int line = 0; line < 300; ++line) {
    std::string words;
    for (int w = 0, n = 2 + static_cast<int>(next() % 6); w < n; ++w) {
      words += std::string(w ? " " : "") + static_cast<char>('a' + next() % 26) + "x" +
               static_cast<char>('a' + next() % 26);
    }
    en += words + " " + std::to_string(line) + "\n";
    de += words + "en " + std::to_string(line) + "\n";
    fr += "le" + words + " " + std::to_string(line) + "\n";
  }
  xlme::testing::write_file(dir + "/raw/mono/en.txt", en);
  xlme::testing::write_file(dir + "/raw/mono/de.txt", de);
  xlme::testing::write_file(dir + "/raw/para/en-de.en", en);
  xlme::testing::write_file(dir + "/raw/para/en-de.de", de);
  xlme::testing::write_file(dir + "/raw/para/en-fr.en", en);
  xlme::testing::write_file(dir + "/raw/para/en-fr.fr", fr);
}

TEST(TrainResplit, TwoRanksStoppedMidStepResumeAsOneWithoutRepeatingOrSkippingData) {
  TempDir tmp;
  const std::string dir = tmp.path().string();
  write_resplit_corpus(dir);
  data::SpmTrainingOptions spm;
  spm.corpus_dir = dir + "/raw";
  spm.out_model = dir + "/spm.model";
  spm.spm.vocab_size = 80;
  spm.spm.character_coverage = 1.0;
  data::train_sentencepiece(spm);
  const data::Tokenizer tokenizer(dir + "/spm.model", data::VocabLayout::kOwn);
  data::BinarizeOptions bin;
  bin.input_dir = dir + "/raw";
  bin.out_dir = dir + "/shards";
  data::binarize(bin, tokenizer);

  // 2 ranks, 5 steps planned; rank 1 is signalled while reading the first micro-batch of step 3.
  const std::string port = std::to_string(xlme::testing::free_port());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pids.push_back(spawn_self("TrainResplit.DISABLED_Worker",
                              {{"RANK", std::to_string(rank)},
                               {"WORLD_SIZE", "2"},
                               {"MASTER_ADDR", "127.0.0.1"},
                               {"MASTER_PORT", port},
                               {"XLME_DIR", dir},
                               {"XLME_STEPS", "5"},
                               {"XLME_STOP_AT", std::to_string(2 * kCallsPerStepTwoRanks + 1)}}));
  }
  for (const pid_t pid : pids) EXPECT_EQ(wait_exit_code(pid), kExitPreempted);
  // Both ranks gave up step 3 after its first micro-batch: the checkpoint is of step 2.
  ASSERT_TRUE(std::filesystem::exists(dir + "/run/checkpoints/step_00000002/manifest.yaml"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/checkpoints/step_00000003"));
  const auto rank0 = read_log(dir + "/rank0.log"), rank1 = read_log(dir + "/rank1.log");
  ASSERT_EQ(rank0.size(), 3 * kCallsPerStepTwoRanks);  // steps 1, 2 and the abandoned 3
  ASSERT_EQ(rank1.size(), 3 * kCallsPerStepTwoRanks);

  // One process continues to step 5 (4 micro-batches per task and step).
  auto c = resplit_config(dir, 5);
  ASSERT_EQ(run_rank(c, dist::LaunchInfo{}, dir + "/single.log", 0), xlme::kExitOk);
  const auto single = read_log(dir + "/single.log");
  ASSERT_EQ(single.size(), 3u * 8u);

  // What was trained on, per task: steps 1-2 of both ranks, then the single process.
  std::map<std::string, std::multiset<std::string>> trained;
  for (const auto* log : {&rank0, &rank1}) {
    for (size_t i = 0; i < 2 * kCallsPerStepTwoRanks; ++i)
      trained[(*log)[i].first].insert((*log)[i].second);
  }
  for (const auto& [task, print] : single) trained[task].insert(print);
  // The abandoned step's micro-batches are trained on after the resume.
  for (const auto* log : {&rank0, &rank1}) {
    for (size_t i = 2 * kCallsPerStepTwoRanks; i < log->size(); ++i) {
      EXPECT_EQ(std::count(single.begin(), single.end(), (*log)[i]), 1) << i;
    }
  }

  // Each language's global sequence, read alone by one rank: what was trained on must be, per
  // language, exactly its first micro-batches.
  for (const auto& [task_name, languages] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"mono", {"de", "en"}}, {"para", {"en-de", "en-fr"}}}) {
    std::multiset<std::string> remaining = trained[task_name];
    int64_t total = 0;
    for (const auto& language : languages) {
      auto solo = c;
      (task_name == "mono" ? solo.data.mono : solo.data.para).languages = {language};
      const auto task = task_name == "mono" ? data::Task::kMono : data::Task::kPara;
      data::TaskReader reader(data::BatchOptions::from_config(solo, &tokenizer, 0, 1), task);
      int64_t prefix = 0;
      for (;; ++prefix) {
        const auto it = remaining.find(fingerprint(reader.next()));
        if (it == remaining.end()) break;
        remaining.erase(it);
      }
      total += prefix;
      EXPECT_GT(prefix, 0) << language;
    }
    EXPECT_TRUE(remaining.empty()) << task_name << ": " << remaining.size()
                                   << " micro-batches trained on are not a prefix of their "
                                      "language's sequence (read twice or out of order)";
    EXPECT_EQ(total, 2 * 2 * 2 + 3 * 4) << task_name;  // 2 steps x 2 ranks x 2, 3 steps x 4
  }

  // Training went on from step 3 with finite losses.
  std::istringstream metrics(read_file(dir + "/run/metrics.jsonl"));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(metrics, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, std::regex("\"step\": ([0-9]+), \"kind\": \"train\"")))
      continue;
    steps.push_back(std::stoll(m[1].str()));
    EXPECT_TRUE(std::regex_search(line, std::regex("\"total_loss\": [-0-9.]"))) << line;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace xlme::train
