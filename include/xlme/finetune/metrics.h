// XTREME's official metrics, as the official scripts compute them
// (docs/finetuning.md#xtremes-metric-quirks): accuracy, seqeval 0.0.12 chunk F1 (udpos, panx),
// SQuAD v1.1 and MLQA EM/F1, Tatoeba accuracy, BUCC margin mining with a dev-tuned threshold, and
// word-alignment extraction with AER. Scores are ×100.
#pragma once

#include "xlme/common/torch_fwd.h"
#include "xlme/finetune/examples.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace xlme::finetune {

// Percentage of positions where `predicted` equals `gold` (xnli, pawsx). Throws when the sizes
// differ or both are empty.
double accuracy(const std::vector<std::string>& gold, const std::vector<std::string>& predicted);

// ---- Tagging: seqeval 0.0.12 -------------------------------------------------------------------

// A chunk over the flattened corpus: `type` and the inclusive word range [begin, end].
struct Chunk {
  std::string type;
  int64_t begin = 0, end = 0;
  bool operator<(const Chunk& o) const {
    return begin != o.begin ? begin < o.begin : end != o.end ? end < o.end : type < o.type;
  }
  bool operator==(const Chunk& o) const {
    return begin == o.begin && end == o.end && type == o.type;
  }
};

// seqeval 0.0.12's get_entities: the sentences are flattened with an "O" after each one; a
// label's first character is its BIOES tag and its type is the part after the last '-' (so a POS
// tag is its own type, and runs of the same POS tag merge into one chunk; SCONJ/SYM act as S-,
// INTJ as I-). I-X after O or another type starts a chunk (lenient IOB). Throws on an empty label.
std::vector<Chunk> seqeval_chunks(const std::vector<std::vector<std::string>>& sentences);

struct TaggingScores {
  double precision = 0, recall = 0, f1 = 0;  // chunk-level micro scores ×100 (seqeval f1_score)
  double accuracy = 0;                       // token accuracy ×100 (seqeval accuracy_score)
  int64_t correct_chunks = 0, predicted_chunks = 0, gold_chunks = 0, tokens = 0;
};

// seqeval 0.0.12 f1_score / precision / recall / accuracy over whole corpora: XTREME's udpos "F1"
// and panx entity F1. Throws naming the sentence when the sentence counts or lengths differ.
TaggingScores seqeval_scores(const std::vector<std::vector<std::string>>& gold,
                             const std::vector<std::vector<std::string>>& predicted);

// ---- QA: SQuAD v1.1 and MLQA -------------------------------------------------------------------

// The answer normalization of the SQuAD v1.1 script: Python's str.lower, delete ASCII
// punctuation, replace whole-word a/an/the by a space, collapse whitespace (Python's str.split).
std::string squad_normalize(const std::string& text);

// The normalization of mlqa_evaluation_v1.py for answer language `lang` (en es de ar hi vi zh):
// lower, delete Unicode P* and ASCII punctuation, remove the language's articles (ar: every ال,
// even inside words), then tokens joined by single spaces: whitespace tokens, or for zh every
// U+4E00–U+9FA5 character on its own and the rest split on whitespace. Throws listing the
// languages for any other code.
std::string mlqa_normalize(const std::string& text, const std::string& lang);

// EM and token F1 (multiset overlap of whitespace tokens; 0 without overlap) of one prediction
// against one gold answer, on [0, 1]. `lang` empty: SQuAD v1.1 normalization, else MLQA's.
double qa_exact_match(const std::string& prediction, const std::string& gold,
                      const std::string& lang = "");
double qa_f1(const std::string& prediction, const std::string& gold, const std::string& lang = "");

struct QaScores {
  double exact_match = 0, f1 = 0;  // ×100, averaged over every gold question
  int64_t questions = 0, answered = 0;
};

// The official evaluate(): for each gold question, the max EM and F1 over its gold answers;
// averaged over ALL gold questions, so an unanswered one scores 0 (logged). Gold comes from
// read_squad_json(path, skip_mismatched = false). `lang` empty: SQuAD v1.1 (xquad, tydiqa), else
// MLQA's normalization for that language (mlqa).
QaScores qa_scores(const std::vector<QaExample>& gold,
                   const std::map<std::string, std::string>& predictions,
                   const std::string& lang = "");

// ---- Retrieval ---------------------------------------------------------------------------------

// Percentage of i with predicted[i] == gold[i]; an empty `gold` means the identity (LASER's
// line-aligned Tatoeba files).
double retrieval_accuracy(const std::vector<int64_t>& predicted,
                          const std::vector<int64_t>& gold = {});

// (Cosine nearest neighbours, XTREME's exact L2 index over normalized embeddings:
// eval::nearest_neighbours in xlme/eval/retrieval.h.)

// A mined pair of row indices with its margin score.
struct MinedPair {
  int64_t source = 0, target = 0;
  double score = 0;
};

// LASER's margin mining (mine_bitext, mode 'mine', retrieval 'max', margin 'ratio') over the rows
// as given: L2-normalize, k nearest neighbours by cosine both ways (k capped by the other side's
// size), score(x, y) = cos(x, y) / ((mean cos of x to its k NN + mean cos of y to its k NN) / 2),
// forward candidates (best-scoring y among x's k NN) and backward ones, pooled, sorted by score
// and accepted greedily when neither side is used yet. Only pairs with score > 0 are returned,
// best first. x [N, H], y [M, H].
std::vector<MinedPair> margin_mine(const at::Tensor& x, const at::Tensor& y, int64_t k = 4);

struct BuccCandidate {
  std::string source_id, english_id;
  double score = 0;
};

// BUCC candidates as XTREME's bucc pipeline builds them: identical sentence strings are deduped on
// each side before margin_mine; mined sentences map back to ids by exact (stripped) text, a
// sentence that occurs under several ids is dropped, and a repeated id pair keeps its max score.
// source_embeddings [corpus.source.size(), H], english_embeddings [corpus.english.size(), H].
std::vector<BuccCandidate> bucc_candidates(const BuccCorpus& corpus,
                                           const at::Tensor& source_embeddings,
                                           const at::Tensor& english_embeddings, int64_t k = 4);

// LASER's BuccOptimize: sort the candidates by score (descending, stable), cut after each one, and
// return the midpoint between the best-F1 cut's score and the next candidate's (the best cut's own
// score when it is the last candidate). Returns 0 when no candidate is gold.
double bucc_optimize_threshold(const std::vector<BuccCandidate>& candidates,
                               const std::vector<std::pair<std::string, std::string>>& gold);

// The id pairs of the candidates with score >= threshold, in candidate order.
std::vector<std::pair<std::string, std::string>> bucc_extract(
    const std::vector<BuccCandidate>& candidates, double threshold);

struct PrfScores {
  double precision = 0, recall = 0, f1 = 0;  // ×100
  int64_t correct = 0, predicted = 0, gold = 0;
};

// Set precision/recall/F1 of predicted against gold id pairs.
PrfScores pair_scores(const std::vector<std::pair<std::string, std::string>>& predicted,
                      const std::vector<std::pair<std::string, std::string>>& gold);

// ---- Word alignment ----------------------------------------------------------------------------

// Links (i, j) where j is the argmax of row i and i the argmax of column j of `similarity` [m, n]
// (SimAlign's "argmax": both directions intersected). Sorted.
std::vector<Link> align_argmax(const at::Tensor& similarity);

// A simple optimal-transport extraction: the entropic transport plan P between uniform marginals
// (Sinkhorn on exp(similarity / epsilon), `iterations` rounds), and the links where both
// conditionals m·P[i][j] (target given source) and n·P[i][j] (source given target) are at least
// `threshold`. similarity [m, n]. Sorted.
std::vector<Link> align_optimal_transport(const at::Tensor& similarity, double threshold = 0.1,
                                          double epsilon = 0.1, int64_t iterations = 100);

struct AerScores {
  double precision = 0, recall = 0, aer = 0;  // ×100: |A∩P|/|A|, |A∩S|/|S|, AER
};

// AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|) summed over the corpus, with S = gold.sure and
// P = S ∪ gold.possible. Throws when the pair counts differ.
AerScores alignment_error_rate(const std::vector<AlignedPair>& gold,
                               const std::vector<std::vector<Link>>& predicted);

}  // namespace xlme::finetune
