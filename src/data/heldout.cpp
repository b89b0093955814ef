#include "xlme/data/heldout.h"

#include "xlme/common/error.h"
#include "xlme/data/batch_writer.h"
#include "xlme/data/bucketing.h"
#include "xlme/data/framing.h"
#include "xlme/data/line_reader.h"
#include "xlme/data/sampler.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

namespace xlme::data {
namespace {

namespace fs = std::filesystem;

// The lines of a held-out file, read as every corpus file is (LineReader: LF or CRLF, a BOM
// dropped, CR-only line ends refused naming the file).
std::vector<std::string> read_heldout_lines(const std::string& path) {
  LineReader reader(path);
  std::vector<std::string> lines;
  for (std::string line; reader.next(line);) lines.push_back(line);
  return lines;
}

bool any_text(const std::vector<std::vector<int32_t>>& sentences) {
  return std::any_of(sentences.begin(), sentences.end(),
                     [](const std::vector<int32_t>& s) { return !s.empty(); });
}

// Framed sequences of one task, bucketed, written and masked into `out`.
void write_heldout_batches(const std::vector<std::vector<int32_t>>& sequences,
                           const std::vector<size_t>& seconds, Task task,
                           const BatchOptions& options, Rng& rng, std::vector<Batch>& out) {
  std::vector<int64_t> lengths;
  for (const auto& s : sequences) lengths.push_back(static_cast<int64_t>(s.size()));
  const Buckets buckets = bucket_by_length(lengths, options.micro_batch_tokens);
  const MaskOptions mask{options.mask_ratio, options.mask_token_ratio};
  for (const auto& [begin, end] : buckets.batches) {
    BatchWriter writer(task, end - begin, lengths[buckets.order[end - 1]], options.ids,
                       /*pinned=*/false);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = buckets.order[r];
      writer.write(r - begin, sequences[s], seconds[s], options.reset_positions, mask, rng);
    }
    out.push_back(std::move(writer.batch()));
  }
}

// <s> e </s> f </s> appended to `sequences`, and where f starts to `seconds`, unless fit_pair
// drops it at `max_len`.
void add_pair(const std::vector<int32_t>& e, const std::vector<int32_t>& f, int64_t max_len,
              const BatchOptions& options, std::vector<std::vector<int32_t>>& sequences,
              std::vector<size_t>& seconds) {
  const auto kept = fit_pair(static_cast<int64_t>(e.size()), static_cast<int64_t>(f.size()),
                             max_len, options.truncate_too_long);
  if (!kept) return;
  sequences.emplace_back();
  seconds.push_back(frame_pair(e, f, *kept, options.ids, sequences.back()));
}

}  // namespace

std::vector<HeldoutPair> read_heldout(const config::HeldoutConfig& heldout,
                                      const Tokenizer& tokenizer) {
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
    const auto a = read_heldout_lines(path_a), b = read_heldout_lines(path_b);
    XLME_CHECK(a.size() == b.size(),
               "held-out pair {}: {} has {} lines but {} has {}; the files must be line-aligned",
               name, path_a, a.size(), path_b, b.size());
    const size_t n = std::min(a.size(), static_cast<size_t>(heldout.max_pairs));
    for (size_t i = 0; i < n; ++i) {
      pair.a.push_back(tokenizer.encode(a[i]));
      pair.b.push_back(tokenizer.encode(b[i]));
    }
    // An empty pair gives validation nothing to evaluate: it logged zeros.
    XLME_CHECK(any_text(pair.a) || any_text(pair.b),
               "held-out pair {}: {} and {} hold no text ({}); validation would log zeros. Put "
               "the held-out pairs there (scripts/prepare_demo_corpus.sh writes them), leave {} "
               "out of data.heldout.pairs, or set data.heldout.dir= (empty) to train without "
               "validation",
               name, path_a, path_b,
               a.empty() ? std::string("both are empty")
                         : fmt::format("{} lines, all blank{}", a.size(),
                                       n < a.size() ? fmt::format(" in the first {} read "
                                                                  "(data.heldout.max_pairs)",
                                                                  n)
                                                    : ""),
               name);
    pairs.push_back(std::move(pair));
  }
  return pairs;
}

std::vector<Batch> heldout_batches(const std::vector<HeldoutPair>& pairs,
                                   const BatchOptions& options, uint64_t seed) {
  Rng rng(seed);
  std::vector<Batch> batches;
  std::vector<std::vector<int32_t>> sequences;
  std::vector<size_t> seconds;  // where f starts (TRTD), 0 for MRTD
  if (options.mono.enabled) {
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
    std::vector<int32_t> pieces;
    for (const auto& [language, sentences] : by_language) {
      if (options.mono.sentence_pairs) {
        // VECO: consecutive held-out sentences of a language, as one document.
        std::vector<bool> starts(sentences.size(), false);
        starts.front() = true;
        for (const int64_t first : pair_adjacent_sentences(starts)) {
          add_pair(*sentences[first], *sentences[first + 1], options.mono.max_len, options,
                   sequences, seconds);
        }
        continue;
      }
      std::vector<int64_t> lengths;
      for (const auto* sentence : sentences)
        lengths.push_back(static_cast<int64_t>(sentence->size()));
      for (const auto& [first, last] : pack_sentences(lengths, options.mono.max_len)) {
        pieces.clear();
        for (int64_t i = first; i < last; ++i) {
          pieces.insert(pieces.end(), sentences[i]->begin(), sentences[i]->end());
        }
        sequences.emplace_back();
        frame_sentence(pieces, options.mono.max_len, options.ids, sequences.back());
        seconds.push_back(0);
      }
    }
    write_heldout_batches(sequences, seconds, Task::kMono, options, rng, batches);
  }
  if (options.para.enabled) {
    sequences.clear();
    seconds.clear();
    for (const auto& pair : pairs) {
      for (size_t i = 0; i < pair.a.size(); ++i) {
        const auto& e = pair.a[i];
        const auto& f = pair.b[i];
        if (e.empty() || f.empty()) continue;
        add_pair(e, f, options.para.max_len, options, sequences, seconds);
      }
    }
    write_heldout_batches(sequences, seconds, Task::kPara, options, rng, batches);
  }
  return batches;
}

std::vector<std::vector<int64_t>> framed_sentences(
    const std::vector<std::vector<int32_t>>& sentences, int64_t max_len, const SpecialIds& ids) {
  std::vector<std::vector<int64_t>> framed;
  std::vector<int32_t> tokens;
  for (const auto& sentence : sentences) {
    frame_sentence(sentence, max_len, ids, tokens);
    framed.emplace_back(tokens.begin(), tokens.end());
  }
  return framed;
}

}  // namespace xlme::data
