#include "xlme/data/spm_trainer.h"
#include "xlme/data/text.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/data/line_reader.h"
#include "xlme/data/sentencepiece.h"
#include "xlme/data/tokenizer.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>

namespace xlme::data {
namespace {

namespace fs = std::filesystem;

// "de.txt.gz" -> "de"; "" when the name is not a monolingual text file.
std::string language_of(const std::string& file_name) {
  for (const std::string suffix : {".txt", ".txt.gz", ".txt.xz"}) {
    if (file_name.size() > suffix.size() &&
        file_name.compare(file_name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return file_name.substr(0, file_name.size() - suffix.size());
    }
  }
  return "";
}

int64_t count_nonempty_lines(const std::string& path) {
  LineReader reader(path);
  int64_t lines = 0;
  for (std::string line; reader.next(line);) lines += !line.empty();
  return lines;
}

}  // namespace

std::vector<int64_t> balanced_sample_counts(const std::vector<int64_t>& lines, double beta,
                                            int64_t total) {
  std::vector<double> weights(lines.size());
  for (size_t j = 0; j < lines.size(); ++j) {
    XLME_CHECK(lines[j] > 0, "language {} has no lines to sample from", j);
    weights[j] = std::pow(static_cast<double>(lines[j]), beta);
  }
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> counts(lines.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t assigned = 0;
  for (size_t j = 0; j < lines.size(); ++j) {
    const double exact = static_cast<double>(total) * weights[j] / sum;
    counts[j] = static_cast<int64_t>(std::floor(exact));
    assigned += counts[j];
    remainders.emplace_back(-(exact - std::floor(exact)), j);
  }
  std::sort(remainders.begin(), remainders.end());
  for (size_t k = 0; assigned < total && k < remainders.size(); ++k, ++assigned) {
    ++counts[remainders[k].second];
  }
  return counts;
}

std::vector<LanguageFile> find_mono_files(const std::string& dir,
                                          const std::vector<std::string>& languages) {
  const fs::path mono = fs::path(dir) / "mono";
  XLME_CHECK(fs::is_directory(mono),
             "corpus folder '{}' has no mono/ folder; it needs mono/<lang>.txt (or .txt.gz, "
             ".txt.xz) files, e.g. from scripts/prepare_demo_corpus.sh",
             dir);
  std::vector<LanguageFile> files;
  for (const auto& entry : fs::directory_iterator(mono)) {
    const std::string lang = language_of(entry.path().filename().string());
    if (lang.empty()) continue;
    if (!languages.empty() &&
        std::find(languages.begin(), languages.end(), lang) == languages.end()) {
      continue;
    }
    check_corpus_file(entry.path().string(), lang);
    files.push_back({lang, entry.path().string()});
  }
  std::sort(files.begin(), files.end(),
            [](const LanguageFile& a, const LanguageFile& b) { return a.language < b.language; });
  for (size_t i = 1; i < files.size(); ++i) {
    XLME_CHECK(files[i].language != files[i - 1].language,
               "language '{}' has two files, '{}' and '{}'; keep one", files[i].language,
               files[i - 1].path, files[i].path);
  }
  for (const auto& lang : languages) {
    XLME_CHECK(std::any_of(files.begin(), files.end(),
                           [&](const LanguageFile& f) { return f.language == lang; }),
               "language '{}' has no data: no {}/{}.txt, .txt.gz or .txt.xz; fix "
               "data.mono.languages or add the file",
               lang, mono.string(), lang);
  }
  XLME_CHECK(!files.empty(), "'{}' has no <lang>.txt, .txt.gz or .txt.xz files", mono.string());
  return files;
}

SpmTrainingReport train_sentencepiece(const SpmTrainingOptions& options) {
  XLME_CHECK(!options.out_model.empty(), "train-spm needs an output model path (--out)");
  const auto files = find_mono_files(options.corpus_dir, options.languages);
  SpmTrainingReport report;
  std::vector<int64_t> lines;
  for (const auto& file : files) {
    const int64_t m = count_nonempty_lines(file.path);
    XLME_CHECK(m > 0, "language '{}' has no data: '{}' has no non-empty lines", file.language,
               file.path);
    lines.push_back(m);
    report.languages.push_back({file.language, m, 0});
  }
  const int64_t total = std::min<int64_t>(options.spm.max_sentences,
                                          std::accumulate(lines.begin(), lines.end(), int64_t{0}));
  const auto counts = balanced_sample_counts(lines, options.spm.sampling_exponent, total);

  // The sample: language j gives every line counts[j] / m_j times, plus counts[j] % m_j lines
  // chosen uniformly without replacement (selection sampling, Knuth's Algorithm S: one pass,
  // O(1) memory).
  const std::string sample_path = options.out_model + ".sample-" + std::to_string(::getpid());
  fs::create_directories(fs::absolute(options.out_model).parent_path());
  {
    // Created anew (never through a link planted at its name), written through stdio.
    const int fd = create_own_file(sample_path, "the tokenizer's training sample");
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> sample(::fdopen(fd, "wb"), &std::fclose);
    if (!sample) ::close(fd);
    XLME_CHECK(sample != nullptr, "cannot write '{}': {}", sample_path, std::strerror(errno));
    std::mt19937_64 rng(static_cast<uint64_t>(options.seed));
    for (size_t j = 0; j < files.size(); ++j) {
      const int64_t copies = counts[j] / lines[j];
      int64_t extra = counts[j] % lines[j];
      int64_t remaining = lines[j];
      LineReader reader(files[j].path);
      for (std::string line; reader.next(line);) {
        if (line.empty()) continue;
        int64_t times = copies;
        if (extra > 0 && static_cast<int64_t>(rng() % static_cast<uint64_t>(remaining)) < extra) {
          ++times;
          --extra;
        }
        --remaining;
        for (int64_t t = 0; t < times; ++t) {
          std::fwrite(line.data(), 1, line.size(), sample.get());
          std::fputc('\n', sample.get());
        }
        report.languages[j].sampled += times;
      }
    }
    XLME_CHECK(std::fflush(sample.get()) == 0 && !std::ferror(sample.get()),
               "cannot write '{}' (disk full?): {}", sample_path, std::strerror(errno));
  }
  for (const auto& lang : report.languages) {
    spdlog::info("train-spm: {:<12} {:>10} lines -> {:>9} sampled", lang.language, lang.lines,
                 lang.sampled);
  }

  const std::vector<std::pair<std::string, std::string>> flags = {
      {"input", sample_path},
      {"model_type", options.spm.model_type},
      {"vocab_size", std::to_string(options.spm.vocab_size - 1)},  // <mask> is added after
      {"character_coverage", fmt::format("{}", options.spm.character_coverage)},
      {"bos_id", "0"},
      {"pad_id", "1"},
      {"eos_id", "2"},
      {"unk_id", "3"},
      {"input_sentence_size", "0"},  // already sampled
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(std::max<int64_t>(1, options.threads))},
  };
  std::string model;
  try {
    model = SentencePiece::train(flags, static_cast<unsigned>(options.seed));
  } catch (const Error& e) {
    fs::remove(sample_path);
    XLME_FAIL(
        "{} (data.spm.vocab_size = {} counts <mask> too: the trainer was asked for {} "
        "pieces; lower data.spm.vocab_size or give it more text)",
        e.what(), options.spm.vocab_size, options.spm.vocab_size - 1);
  }
  fs::remove(sample_path);
  write_file_atomic(options.out_model, model);

  const Tokenizer tokenizer(options.out_model, VocabLayout::kOwn);
  std::string vocab;
  for (int id = 0; id < tokenizer.sentencepiece().size(); ++id) {
    vocab += fmt::format("{}\t{}\n", id, tokenizer.sentencepiece().id_to_piece(id));
  }
  vocab += fmt::format("{}\t<mask>\n", tokenizer.special_ids().mask);
  fs::path vocab_path = options.out_model;
  vocab_path.replace_extension(".vocab");
  write_file_atomic(vocab_path.string(), vocab);
  report.vocab_size = tokenizer.vocab_size();
  return report;
}

}  // namespace xlme::data
