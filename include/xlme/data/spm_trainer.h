// xlme-data train-spm: a SentencePiece model in xlme's own id layout, trained on sentences
// sampled per language with p_j ~ m_j^beta so that small languages get pieces (XLM-R: 0.3).
#pragma once

#include "xlme/config/config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::data {

// How many sentences each language contributes: `total` split with q_j = m_j^beta / sum m^beta
// (largest remainders, so the counts add up to `total`). lines[j] must be > 0.
std::vector<int64_t> balanced_sample_counts(const std::vector<int64_t>& lines, double beta,
                                            int64_t total);

// The monolingual files of a raw corpus: `dir`/mono/<lang>.txt[.gz|.xz], sorted by language,
// limited to `languages` when it is not empty. Throws xlme::Error for a missing or empty folder
// and a requested language without a file.
struct LanguageFile {
  std::string language;
  std::string path;
};
std::vector<LanguageFile> find_mono_files(const std::string& dir,
                                          const std::vector<std::string>& languages);

struct SpmTrainingOptions {
  std::string corpus_dir;              // the raw corpus: mono/<lang>.txt[.gz|.xz]
  std::vector<std::string> languages;  // empty = every file in mono/
  std::string out_model;               // <name>.model; <name>.vocab lists "id<TAB>piece"
  config::TokenizerTrainingConfig spm;
  int64_t seed = 1;
  int64_t threads = 1;
};

struct SpmLanguageSample {
  std::string language;
  int64_t lines = 0;    // m_j: non-empty lines in its file
  int64_t sampled = 0;  // sentences it gave the trainer
};

struct SpmTrainingReport {
  std::vector<SpmLanguageSample> languages;
  int64_t vocab_size = 0;  // layout ids, <mask> included
};

// Samples (a first pass counts lines, a second draws them: every line k times plus a uniform
// subset, so memory stays bounded), trains through the SentencePiece plugin with <s>=0,
// <pad>=1, </s>=2, <unk>=3 and spm.vocab_size - 1 pieces (<mask> is the last layout id), and
// writes the model and vocabulary atomically.
SpmTrainingReport train_sentencepiece(const SpmTrainingOptions& options);

}  // namespace xlme::data
