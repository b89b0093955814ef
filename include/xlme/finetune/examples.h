// What XTREME's files hold, one struct per task kind (docs/finetuning.md#xtremes-protocol). Readers
// (finetune/{pair,tagging,qa,retrieval}_io.h) produce these, featurization (finetune/features.h)
// turns them into model inputs, metrics (finetune/metrics.h) score predictions against them. All
// text is UTF-8.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace xlme::finetune {

// Where an example came from, for error messages and prediction files: "download/xnli/dev-de.tsv"
// and its 1-based line (the first line of a sentence for CoNLL files; 0 for JSON).
struct Source {
  std::string file;
  int64_t line = 0;
};

// A labelled sentence pair (xnli, pawsx). `label` is empty where the file carries none (test).
struct PairExample {
  std::string text_a, text_b, label;
  Source source;
};

// A sentence of words with one tag per word (udpos, panx). `tags` is empty where the file carries
// none (processed test files), otherwise words.size() == tags.size().
struct TaggedSentence {
  std::vector<std::string> words, tags;
  Source source;
};

// One gold answer: its text and the byte offset of its first character in the UTF-8 context
// (readers convert SQuAD's code-point `answer_start`).
struct QaAnswer {
  std::string text;
  int64_t start = 0;
};

// One SQuAD-format question with its paragraph (xquad, mlqa, tydiqa). Blanked files give one
// answer with empty text.
struct QaExample {
  std::string id, question, context;
  std::vector<QaAnswer> answers;
  Source source;
};

// Line-aligned sentences of two languages (Tatoeba; the demo corpus's held-out pairs): line i of
// `source` translates line i of `target` when `aligned` (LASER originals), otherwise the target
// side is in an unknown order (XTREME's sorted English file).
struct SentencePairs {
  std::string source_language, target_language;
  std::vector<std::string> source, target;
  bool aligned = true;
};

// BUCC 2018 for one language pair and split: sentences with their ids on both sides and, where
// known, the gold id pairs (source id, English id).
struct BuccCorpus {
  std::string language;  // de, fr, ru or zh; the other side is English
  std::vector<std::pair<std::string, std::string>> source, english;  // (id, sentence)
  std::vector<std::pair<std::string, std::string>> gold;             // (source id, English id)
};

// A word-alignment link between source word i and target word j (0-based, Pharaoh "i-j").
struct Link {
  int64_t source = 0, target = 0;
  bool operator<(const Link& o) const {
    return source != o.source ? source < o.source : target < o.target;
  }
  bool operator==(const Link& o) const { return source == o.source && target == o.target; }
};

// A sentence pair with gold alignments: `sure` links are also possible (S ⊆ P); `possible` holds
// only the links marked possible ("p"), so P = sure ∪ possible.
struct AlignedPair {
  std::vector<std::string> source_words, target_words;
  std::vector<Link> sure, possible;
};

}  // namespace xlme::finetune
