#include "xlme/train/validation.h"

#include "xlme/common/error.h"
#include "xlme/common/precision.h"
#include "xlme/train/rng.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

// splitmix64: a fully specified stream, so the held-out masking is the same on every platform.
class MaskRng {
 public:
  explicit MaskRng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  XLME_CHECK(in.good(), "data.heldout: cannot read {}", path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct HeldoutSequence {
  std::vector<int64_t> ids;
  int64_t second = 0;  // where f starts (TRTD), 0 for MRTD
};

// Sorted by length, cut so that rows x longest row <= `budget`, masked with `rng`.
std::vector<data::Batch> make_batches(std::vector<HeldoutSequence> sequences, data::Task task,
                                      int64_t budget, const config::Config& config,
                                      const data::SpecialIds& special, MaskRng& rng) {
  std::stable_sort(sequences.begin(), sequences.end(),
                   [](const HeldoutSequence& a, const HeldoutSequence& b) {
                     return a.ids.size() < b.ids.size();
                   });
  std::vector<data::Batch> batches;
  size_t begin = 0;
  while (begin < sequences.size()) {
    size_t end = begin + 1;
    while (end < sequences.size() &&
           static_cast<int64_t>((end + 1 - begin) * sequences[end].ids.size()) <= budget) {
      ++end;
    }
    const auto rows = static_cast<int64_t>(end - begin);
    const auto width = static_cast<int64_t>(sequences[end - 1].ids.size());
    data::Batch batch;
    batch.task = task;
    batch.labels = torch::full({rows, width}, special.pad, torch::kLong);  // [B, T]
    batch.masked = torch::zeros({rows, width}, torch::kBool);              // [B, T]
    batch.padding = torch::ones({rows, width}, torch::kBool);              // [B, T]
    batch.positions = torch::arange(width).expand({rows, width}).clone();  // [B, T]
    batch.input_ids = batch.labels.clone();                                // [B, T]
    auto* labels = batch.labels.data_ptr<int64_t>();
    auto* input = batch.input_ids.data_ptr<int64_t>();
    auto* masked = batch.masked.data_ptr<bool>();
    auto* padding = batch.padding.data_ptr<bool>();
    auto* positions = batch.positions.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const HeldoutSequence& s = sequences[begin + static_cast<size_t>(r)];
      const auto n = static_cast<int64_t>(s.ids.size());
      std::vector<int64_t> candidates;
      for (int64_t i = 0; i < n; ++i) {
        labels[r * width + i] = input[r * width + i] = s.ids[static_cast<size_t>(i)];
        padding[r * width + i] = false;
        if (!special.is_special(s.ids[static_cast<size_t>(i)])) candidates.push_back(i);
        if (s.second > 0 && config.data.reset_positions && i >= s.second) {
          positions[r * width + i] = 1 + i - s.second;
        }
      }
      // As in training: round(ratio x n) positions, randomly rounded, uniformly chosen.
      const auto c = static_cast<int64_t>(candidates.size());
      const int64_t k = std::min<int64_t>(
          c, static_cast<int64_t>(config.objectives.mask_ratio * static_cast<double>(c) +
                                  rng.uniform()));
      for (int64_t q = 0; q < k; ++q) {
        std::swap(candidates[static_cast<size_t>(q)],
                  candidates[static_cast<size_t>(q) + rng.below(static_cast<uint64_t>(c - q))]);
        const int64_t i = r * width + candidates[static_cast<size_t>(q)];
        masked[i] = true;
        if (rng.uniform() < config.objectives.mask_token_ratio) input[i] = special.mask;
      }
      batch.real_tokens += n;
    }
    batches.push_back(std::move(batch));
    begin = end;
  }
  return batches;
}

}  // namespace

std::vector<HeldoutPair> read_heldout(const config::HeldoutConfig& heldout,
                                      const data::Tokenizer& tokenizer) {
  XLME_CHECK(!heldout.dir.empty(), "data.heldout.dir is empty: no held-out data to validate on");
  XLME_CHECK(fs::is_directory(heldout.dir),
             "data.heldout.dir {} is not a folder; point it at held-out pairs such as "
             "data/demo/heldout/dev (scripts/prepare_demo_corpus.sh writes them)",
             heldout.dir);
  // Every <a>-<b> with both <a>-<b>.<a> and <a>-<b>.<b> present.
  std::set<std::string> available;
  for (const auto& entry : fs::directory_iterator(heldout.dir)) {
    const std::string stem = entry.path().stem().string();
    const auto dash = stem.find('-');
    if (dash == std::string::npos) continue;
    const std::string a = stem.substr(0, dash), b = stem.substr(dash + 1);
    if (entry.path().extension() == "." + a &&
        fs::is_regular_file(fs::path(heldout.dir) / (stem + "." + b))) {
      available.insert(stem);
    }
  }
  std::vector<std::string> names(heldout.pairs.begin(), heldout.pairs.end());
  if (names.empty()) names.assign(available.begin(), available.end());
  XLME_CHECK(!names.empty(), "data.heldout.dir {} holds no pair files <a>-<b>.<a> / <a>-<b>.<b>",
             heldout.dir);
  std::vector<HeldoutPair> pairs;
  for (const auto& name : names) {
    XLME_CHECK(available.count(name) > 0,
               "data.heldout.pairs names {}, but {} has no {}.<a> / {}.<b> files ({} pairs there)",
               name, heldout.dir, name, name, available.size());
    HeldoutPair pair;
    pair.name = name;
    pair.first_language = name.substr(0, name.find('-'));
    pair.second_language = name.substr(name.find('-') + 1);
    const std::string path_a =
        (fs::path(heldout.dir) / (name + "." + pair.first_language)).string();
    const std::string path_b =
        (fs::path(heldout.dir) / (name + "." + pair.second_language)).string();
    const auto a = read_lines(path_a), b = read_lines(path_b);
    XLME_CHECK(a.size() == b.size(),
               "held-out pair {}: {} has {} lines but {} has {}; the files must be line-aligned",
               name, path_a, a.size(), path_b, b.size());
    const size_t n = std::min(a.size(), static_cast<size_t>(heldout.max_pairs));
    for (size_t i = 0; i < n; ++i) {
      pair.a.push_back(tokenizer.encode(a[i]));
      pair.b.push_back(tokenizer.encode(b[i]));
    }
    pairs.push_back(std::move(pair));
  }
  return pairs;
}

Validator::Validator(const config::Config& config, const std::vector<HeldoutPair>& pairs,
                     const data::SpecialIds& special)
    : objectives_(config.objectives), pad_(special.pad), seed_(config.run.seed * 0x5eed + 17) {
  probe_layer_ = config.train.probe_layer >= 0 ? config.train.probe_layer : config.model.layers / 2;
  MaskRng rng(seed_);
  const auto bos = static_cast<int32_t>(special.bos), eos = static_cast<int32_t>(special.eos);
  auto wrap = [&](const std::vector<int32_t>& pieces, int64_t max_len) {
    std::vector<int64_t> ids{bos};
    const auto kept = std::min<size_t>(pieces.size(), static_cast<size_t>(max_len - 2));
    ids.insert(ids.end(), pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(kept));
    ids.push_back(eos);
    return ids;
  };

  // MRTD: each language's distinct sentences, in pair and line order, packed.
  if (!objectives_.term_names(data::Task::kMono).empty()) {
    std::map<std::string, std::vector<const std::vector<int32_t>*>> by_language;
    std::map<std::string, std::set<std::vector<int32_t>>> seen;
    for (const auto& pair : pairs) {
      for (size_t i = 0; i < pair.a.size(); ++i) {
        for (const auto& [language, sentence] : {std::pair(pair.first_language, &pair.a[i]),
                                                 std::pair(pair.second_language, &pair.b[i])}) {
          if (!sentence->empty() && seen[language].insert(*sentence).second) {
            by_language[language].push_back(sentence);
          }
        }
      }
    }
    const int64_t max_len = config.data.mono.max_len;
    std::vector<HeldoutSequence> sequences;
    for (const auto& [language, sentences] : by_language) {
      HeldoutSequence current{{bos}, 0};
      for (const auto* sentence : sentences) {
        const auto room = static_cast<size_t>(max_len - 2);
        if (current.ids.size() > 1 && current.ids.size() - 1 + sentence->size() > room) {
          current.ids.push_back(eos);
          sequences.push_back(current);
          current.ids.assign(1, bos);
        }
        const auto kept = std::min(sentence->size(), room);
        current.ids.insert(current.ids.end(), sentence->begin(),
                           sentence->begin() + static_cast<std::ptrdiff_t>(kept));
      }
      if (current.ids.size() > 1) {
        current.ids.push_back(eos);
        sequences.push_back(current);
      }
    }
    auto mono = make_batches(std::move(sequences), data::Task::kMono,
                             config.train.micro_batch_tokens, config, special, rng);
    batches_.insert(batches_.end(), mono.begin(), mono.end());
  }

  // TRTD: <s> e </s> f </s>, the longer side cut first when over data.para.max_len.
  if (!objectives_.term_names(data::Task::kPara).empty()) {
    std::vector<HeldoutSequence> sequences;
    for (const auto& pair : pairs) {
      for (size_t i = 0; i < pair.a.size(); ++i) {
        size_t e = pair.a[i].size(), f = pair.b[i].size();
        if (e == 0 || f == 0) continue;
        while (static_cast<int64_t>(e + f + 3) > config.data.para.max_len) (e >= f ? e : f) -= 1;
        HeldoutSequence s;
        s.ids.push_back(bos);
        s.ids.insert(s.ids.end(), pair.a[i].begin(),
                     pair.a[i].begin() + static_cast<std::ptrdiff_t>(e));
        s.ids.push_back(eos);
        s.second = static_cast<int64_t>(s.ids.size());
        s.ids.insert(s.ids.end(), pair.b[i].begin(),
                     pair.b[i].begin() + static_cast<std::ptrdiff_t>(f));
        s.ids.push_back(eos);
        sequences.push_back(std::move(s));
      }
    }
    auto para = make_batches(std::move(sequences), data::Task::kPara,
                             config.train.micro_batch_tokens, config, special, rng);
    batches_.insert(batches_.end(), para.begin(), para.end());
  }

  for (const auto& pair : pairs) {
    ProbePair probe{pair.name, {}, {}};
    for (size_t i = 0; i < pair.a.size(); ++i) {
      probe.a.push_back(wrap(pair.a[i], config.data.mono.max_len));
      probe.b.push_back(wrap(pair.b[i], config.data.mono.max_len));
    }
    if (!probe.a.empty()) probe_.push_back(std::move(probe));
  }
}

int64_t Validator::tokens() const {
  int64_t n = 0;
  for (const auto& b : batches_) n += b.real_tokens;
  return n;
}

ValidationResult Validator::run(model::ElectraModel& model, dist::Communicator& comm,
                                const torch::Device& device, bool bf16) const {
  const auto start = std::chrono::steady_clock::now();
  ValidationResult result;
  result.probe_layer = probe_layer_;
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;

  objectives::TermSums sums(objectives_);
  {
    ForkedRng fork(device);
    for (size_t i = 0; i < batches_.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(comm.world_size())) != comm.rank()) continue;
      fork.seed(seed_ + i);  // the same replacements whichever rank evaluates the micro-batch
      const auto inputs = model::ModelInputs::from(batches_[i]).to(device);
      std::vector<objectives::Term> terms;
      {
        AutocastScope autocast(device, bf16);
        terms = objectives_.compute(model->forward(inputs), batches_[i].task);
      }
      sums.add(terms);
    }
  }
  // Every rank lays out every term of the set (zeros for terms it saw nothing of).
  std::vector<torch::Tensor> reduced{sums.flatten(device)};
  comm.all_reduce_sum(reduced);
  result.terms = sums.unflatten(reduced[0].cpu()).summary();

  if (comm.rank() == 0 && !probe_.empty()) {
    eval::EmbeddingOptions options;
    options.layers = {probe_layer_};
    options.pad_id = pad_;
    options.device = device;
    AutocastScope autocast(device, bf16);
    for (const auto& pair : probe_) {
      const auto a = eval::sentence_embeddings(model->discriminator, pair.a, options)[0];
      const auto b = eval::sentence_embeddings(model->discriminator, pair.b, options)[0];
      const auto accuracy = eval::retrieval_accuracy(a, b);
      result.retrieval[pair.name] = accuracy;
      result.retrieval_mean.a_to_b += accuracy.a_to_b / static_cast<double>(probe_.size());
      result.retrieval_mean.b_to_a += accuracy.b_to_a / static_cast<double>(probe_.size());
      result.retrieval_mean.mean += accuracy.mean / static_cast<double>(probe_.size());
    }
  }
  model->train(was_training);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace xlme::train
