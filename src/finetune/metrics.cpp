#include "xlme/finetune/metrics.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/finetune/text.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace xlme::finetune {

namespace {
namespace xmetric {

// re.sub(r'\b(w1|w2|...)\b', ' ', text) with Python's Unicode \w: at each position, the first
// alternative that fits between two word boundaries is replaced by a space.
std::u32string remove_words(const std::u32string& in, const std::vector<std::u32string>& words) {
  auto boundary = [&](size_t i) {
    const bool before = i > 0 && text::is_word(in[i - 1]);
    const bool after = i < in.size() && text::is_word(in[i]);
    return before != after;
  };
  std::u32string out;
  size_t i = 0;
  while (i < in.size()) {
    size_t matched = 0;
    if (boundary(i)) {
      for (const auto& w : words) {
        if (in.compare(i, w.size(), w) == 0 && boundary(i + w.size())) {
          matched = w.size();
          break;
        }
      }
    }
    if (matched > 0) {
      out.push_back(U' ');
      i += matched;
    } else {
      out.push_back(in[i++]);
    }
  }
  return out;
}

std::vector<std::u32string> words_of(std::initializer_list<const char*> words) {
  std::vector<std::u32string> out;
  for (const char* w : words) out.push_back(text::decode_utf8(w));
  return out;
}

const std::vector<std::string>& mlqa_languages() {
  static const std::vector<std::string> langs = {"en", "es", "de", "ar", "hi", "vi", "zh"};
  return langs;
}

// mlqa_evaluation_v1.py's mixed_segmentation: every U+4E00–U+9FA5 or punctuation character is a
// token of its own, the rest is split on whitespace.
std::vector<std::u32string> mixed_segmentation(const std::u32string& in) {
  std::vector<std::u32string> out;
  std::u32string run;
  auto flush = [&] {
    for (auto& t : text::split(run)) out.push_back(std::move(t));
    run.clear();
  };
  for (const char32_t c : in) {
    if ((c >= 0x4E00 && c <= 0x9FA5) || text::is_punctuation(c) || text::is_ascii_punctuation(c)) {
      flush();
      out.push_back(std::u32string(1, c));
    } else {
      run.push_back(c);
    }
  }
  flush();
  return out;
}

std::u32string normalize(const std::string& answer, const std::string& lang) {
  if (!lang.empty()) {
    const auto& langs = mlqa_languages();
    XLME_CHECK(std::find(langs.begin(), langs.end(), lang) != langs.end(),
               "MLQA evaluation has no normalization for language '{}'; it knows: en es de ar hi "
               "vi zh",
               lang);
  }
  std::u32string s = text::lower(text::decode_utf8(answer));
  std::u32string kept;
  for (const char32_t c : s) {
    const bool punct = text::is_ascii_punctuation(c) || (!lang.empty() && text::is_punctuation(c));
    if (!punct) kept.push_back(c);
  }
  if (lang.empty() || lang == "en") {
    static const auto en = words_of({"a", "an", "the"});
    kept = remove_words(kept, en);
  } else if (lang == "es") {
    static const auto es = words_of({"un", "una", "unos", "unas", "el", "la", "los", "las"});
    kept = remove_words(kept, es);
  } else if (lang == "de") {
    static const auto de = words_of({"ein", "eine", "einen", "einem", "eines", "einer", "der",
                                     "die", "das", "den", "dem", "des"});
    kept = remove_words(kept, de);
  } else if (lang == "vi") {
    static const auto vi = words_of({"của", "là", "cái", "chiếc", "những"});
    kept = remove_words(kept, vi);
  } else if (lang == "ar") {
    // re.sub('\sال^|ال', ' ', text): the first alternative can never match ('^' after three
    // characters), so every ال is replaced, even inside a word.
    std::u32string out;
    for (size_t i = 0; i < kept.size(); ++i) {
      if (kept[i] == 0x627 && i + 1 < kept.size() && kept[i + 1] == 0x644) {
        out.push_back(U' ');
        ++i;
      } else {
        out.push_back(kept[i]);
      }
    }
    kept = std::move(out);
  }
  return text::join(lang == "zh" ? mixed_segmentation(kept) : text::split(kept));
}

double f1_tokens(const std::vector<std::u32string>& pred, const std::vector<std::u32string>& gold) {
  std::map<std::u32string, int64_t> counts;
  for (const auto& t : gold) ++counts[t];
  int64_t same = 0;
  for (const auto& t : pred) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double p = static_cast<double>(same) / static_cast<double>(pred.size());
  const double r = static_cast<double>(same) / static_cast<double>(gold.size());
  return 2 * p * r / (p + r);
}

// ---- seqeval 0.0.12 ----

bool end_of_chunk(char prev_tag, char tag, const std::string& prev_type, const std::string& type) {
  if (prev_tag == 'E' || prev_tag == 'S') return true;
  if ((prev_tag == 'B' || prev_tag == 'I') && (tag == 'B' || tag == 'S' || tag == 'O')) return true;
  return prev_tag != 'O' && prev_tag != '.' && prev_type != type;
}

bool start_of_chunk(char prev_tag, char tag, const std::string& prev_type,
                    const std::string& type) {
  if (tag == 'B' || tag == 'S') return true;
  if ((prev_tag == 'E' || prev_tag == 'S' || prev_tag == 'O') && (tag == 'E' || tag == 'I'))
    return true;
  return tag != 'O' && tag != '.' && prev_type != type;
}

// ---- Retrieval ----

torch::Tensor l2_normalized(const torch::Tensor& t, const char* what) {
  XLME_CHECK(t.dim() == 2 && t.size(0) > 0,
             "{} embeddings must be a non-empty [N, H] tensor, got "
             "shape {}",
             what, shape_text(t.sizes()));
  const auto f = t.to(torch::kFloat);
  return f / f.norm(2, 1, true).clamp_min(1e-12);
}

// The k largest inner products of every row of x with the rows of y: (values [N, k], indices
// [N, k]) on the CPU, computed in row blocks so that [block, M] stays small.
std::pair<torch::Tensor, torch::Tensor> top_k(const torch::Tensor& x, const torch::Tensor& y,
                                              int64_t k) {
  torch::NoGradGuard no_grad;
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 26) / std::max<int64_t>(1, y.size(0)));
  std::vector<torch::Tensor> values, indices;
  for (int64_t start = 0; start < x.size(0); start += block) {
    const auto sim = x.slice(0, start, std::min(x.size(0), start + block)).matmul(y.t());
    auto [v, i] = sim.topk(k, 1, true, true);
    values.push_back(v.cpu());
    indices.push_back(i.cpu());
  }
  return {torch::cat(values), torch::cat(indices)};
}

// Deduplicated sentences (first-occurrence order) and, for each, the last row that holds it (as
// LASER's unique_embeddings picks).
void unify(const std::vector<std::pair<std::string, std::string>>& side,
           std::vector<std::string>& sentences, std::vector<int64_t>& rows) {
  std::unordered_map<std::string, size_t> seen;
  for (size_t i = 0; i < side.size(); ++i) {
    const auto [it, fresh] = seen.emplace(side[i].second, sentences.size());
    if (fresh) {
      sentences.push_back(side[i].second);
      rows.push_back(static_cast<int64_t>(i));
    } else {
      rows[it->second] = static_cast<int64_t>(i);
    }
  }
}

// Stripped sentence -> id, without the sentences that occur under several ids.
std::unordered_map<std::string, std::string> sentence_to_id(
    const std::vector<std::pair<std::string, std::string>>& side) {
  std::unordered_map<std::string, std::string> map;
  std::unordered_set<std::string> repeated;
  for (const auto& [id, sentence] : side) {
    const std::string s = text::strip_ascii(sentence);
    if (!map.emplace(s, id).second) repeated.insert(s);
  }
  for (const auto& s : repeated) map.erase(s);
  return map;
}

std::set<std::pair<int64_t, int64_t>> link_set(const std::vector<Link>& links) {
  std::set<std::pair<int64_t, int64_t>> out;
  for (const auto& l : links) out.emplace(l.source, l.target);
  return out;
}

}  // namespace xmetric
}  // namespace

double accuracy(const std::vector<std::string>& gold, const std::vector<std::string>& predicted) {
  XLME_CHECK(gold.size() == predicted.size(), "accuracy: {} gold labels but {} predictions",
             gold.size(), predicted.size());
  XLME_CHECK(!gold.empty(), "accuracy: no examples to score");
  int64_t correct = 0;
  for (size_t i = 0; i < gold.size(); ++i) correct += gold[i] == predicted[i];
  return 100.0 * static_cast<double>(correct) / static_cast<double>(gold.size());
}

// ---- Tagging -----------------------------------------------------------------------------------

std::vector<Chunk> seqeval_chunks(const std::vector<std::vector<std::string>>& sentences) {
  std::vector<Chunk> chunks;
  char prev_tag = 'O';
  std::string prev_type;
  int64_t begin = 0, i = 0;
  auto step = [&](const std::string& label) {
    XLME_CHECK(!label.empty(), "seqeval: empty label at flattened position {}", i);
    const char tag = label[0];
    const size_t dash = label.rfind('-');
    std::string type = dash == std::string::npos ? label : label.substr(dash + 1);
    if (xmetric::end_of_chunk(prev_tag, tag, prev_type, type))
      chunks.push_back({prev_type, begin, i - 1});
    if (xmetric::start_of_chunk(prev_tag, tag, prev_type, type)) begin = i;
    prev_tag = tag;
    prev_type = std::move(type);
    ++i;
  };
  static const std::string kOutside = "O";
  for (const auto& sentence : sentences) {
    for (const auto& label : sentence) step(label);
    step(kOutside);  // seqeval appends 'O' after every sentence when flattening
  }
  step(kOutside);  // ... and one more after the whole sequence
  return chunks;
}

TaggingScores seqeval_scores(const std::vector<std::vector<std::string>>& gold,
                             const std::vector<std::vector<std::string>>& predicted) {
  XLME_CHECK(gold.size() == predicted.size(), "seqeval: {} gold sentences but {} predicted",
             gold.size(), predicted.size());
  TaggingScores s;
  int64_t correct_tokens = 0;
  for (size_t k = 0; k < gold.size(); ++k) {
    XLME_CHECK(gold[k].size() == predicted[k].size(),
               "seqeval: sentence {} has {} gold tags but "
               "{} predicted; predictions must be stitched back to whole sentences",
               k, gold[k].size(), predicted[k].size());
    for (size_t t = 0; t < gold[k].size(); ++t) correct_tokens += gold[k][t] == predicted[k][t];
    s.tokens += static_cast<int64_t>(gold[k].size());
  }
  const auto g = seqeval_chunks(gold), p = seqeval_chunks(predicted);
  const std::set<Chunk> gs(g.begin(), g.end()), ps(p.begin(), p.end());
  for (const auto& c : ps) s.correct_chunks += gs.count(c);
  s.gold_chunks = static_cast<int64_t>(gs.size());
  s.predicted_chunks = static_cast<int64_t>(ps.size());
  const double prec = s.predicted_chunks ? double(s.correct_chunks) / s.predicted_chunks : 0.0;
  const double rec = s.gold_chunks ? double(s.correct_chunks) / s.gold_chunks : 0.0;
  s.precision = 100.0 * prec;
  s.recall = 100.0 * rec;
  s.f1 = prec + rec > 0 ? 100.0 * 2 * prec * rec / (prec + rec) : 0.0;
  s.accuracy = s.tokens ? 100.0 * static_cast<double>(correct_tokens) / s.tokens : 0.0;
  return s;
}

// ---- QA ----------------------------------------------------------------------------------------

std::string squad_normalize(const std::string& answer) {
  return text::encode_utf8(xmetric::normalize(answer, ""));
}

std::string mlqa_normalize(const std::string& answer, const std::string& lang) {
  XLME_CHECK(!lang.empty(), "MLQA normalization needs the answer language (en es de ar hi vi zh)");
  return text::encode_utf8(xmetric::normalize(answer, lang));
}

double qa_exact_match(const std::string& prediction, const std::string& gold,
                      const std::string& lang) {
  return xmetric::normalize(prediction, lang) == xmetric::normalize(gold, lang) ? 1.0 : 0.0;
}

double qa_f1(const std::string& prediction, const std::string& gold, const std::string& lang) {
  return xmetric::f1_tokens(text::split(xmetric::normalize(prediction, lang)),
                            text::split(xmetric::normalize(gold, lang)));
}

QaScores qa_scores(const std::vector<QaExample>& gold,
                   const std::map<std::string, std::string>& predictions, const std::string& lang) {
  QaScores s;
  double em = 0, f1 = 0;
  bool any_gold_text = false;
  for (const auto& ex : gold) {
    for (const auto& a : ex.answers) any_gold_text = any_gold_text || !a.text.empty();
  }
  XLME_CHECK(gold.empty() || any_gold_text,
             "QA gold from '{}' has only empty answers: it is one "
             "of XTREME's blanked test files; score against the upstream file that carries the "
             "answers",
             gold.front().source.file);
  for (const auto& ex : gold) {
    ++s.questions;
    const auto it = predictions.find(ex.id);
    if (it == predictions.end()) continue;
    ++s.answered;
    double best_em = 0, best_f1 = 0;
    for (const auto& a : ex.answers) {
      best_em = std::max(best_em, qa_exact_match(it->second, a.text, lang));
      best_f1 = std::max(best_f1, qa_f1(it->second, a.text, lang));
    }
    em += best_em;
    f1 += best_f1;
  }
  if (s.answered < s.questions) {
    spdlog::warn("QA: {} of {} questions have no prediction and score 0", s.questions - s.answered,
                 s.questions);
  }
  if (s.questions > 0) {
    s.exact_match = 100.0 * em / static_cast<double>(s.questions);
    s.f1 = 100.0 * f1 / static_cast<double>(s.questions);
  }
  return s;
}

// ---- Retrieval ---------------------------------------------------------------------------------

double retrieval_accuracy(const std::vector<int64_t>& predicted, const std::vector<int64_t>& gold) {
  XLME_CHECK(gold.empty() || gold.size() == predicted.size(),
             "retrieval accuracy: {} predictions "
             "but {} gold indices",
             predicted.size(), gold.size());
  XLME_CHECK(!predicted.empty(), "retrieval accuracy: no predictions to score");
  int64_t correct = 0;
  for (size_t i = 0; i < predicted.size(); ++i)
    correct += predicted[i] == (gold.empty() ? static_cast<int64_t>(i) : gold[i]);
  return 100.0 * static_cast<double>(correct) / static_cast<double>(predicted.size());
}

std::vector<MinedPair> margin_mine(const torch::Tensor& x_in, const torch::Tensor& y_in,
                                   int64_t k) {
  torch::NoGradGuard no_grad;
  const auto x = xmetric::l2_normalized(x_in, "source");
  const auto y = xmetric::l2_normalized(y_in, "target");
  XLME_CHECK(x.size(1) == y.size(1), "margin mining: source width {} != target width {}", x.size(1),
             y.size(1));
  XLME_CHECK(k > 0, "margin mining: k must be positive, got {}", k);
  const int64_t n = x.size(0), m = y.size(0);
  const auto [x2y_sim, x2y_ind] = xmetric::top_k(x, y, std::min(k, m));
  const auto [y2x_sim, y2x_ind] = xmetric::top_k(y, x, std::min(k, n));
  const auto x2y_mean = x2y_sim.mean(1), y2x_mean = y2x_sim.mean(1);
  // Ratio margin: cos(x, y) / ((mean kNN cos of x + mean kNN cos of y) / 2).
  const auto fwd = x2y_sim / ((x2y_mean.unsqueeze(1) + y2x_mean.index({x2y_ind})) / 2);
  const auto bwd = y2x_sim / ((y2x_mean.unsqueeze(1) + x2y_mean.index({y2x_ind})) / 2);
  const auto [fwd_score, fwd_arg] = fwd.max(1);
  const auto [bwd_score, bwd_arg] = bwd.max(1);
  const auto fwd_best = x2y_ind.gather(1, fwd_arg.unsqueeze(1)).squeeze(1).contiguous();
  const auto bwd_best = y2x_ind.gather(1, bwd_arg.unsqueeze(1)).squeeze(1).contiguous();
  const auto fs = fwd_score.to(torch::kDouble).contiguous();
  const auto bs = bwd_score.to(torch::kDouble).contiguous();
  std::vector<MinedPair> pool;
  pool.reserve(static_cast<size_t>(n + m));
  for (int64_t i = 0; i < n; ++i)
    pool.push_back({i, fwd_best.data_ptr<int64_t>()[i], fs.data_ptr<double>()[i]});
  for (int64_t j = 0; j < m; ++j)
    pool.push_back({bwd_best.data_ptr<int64_t>()[j], j, bs.data_ptr<double>()[j]});
  std::stable_sort(pool.begin(), pool.end(),
                   [](const MinedPair& a, const MinedPair& b) { return a.score > b.score; });
  std::vector<bool> used_x(static_cast<size_t>(n), false), used_y(static_cast<size_t>(m), false);
  std::vector<MinedPair> mined;
  for (const auto& p : pool) {
    if (used_x[p.source] || used_y[p.target]) continue;
    used_x[p.source] = used_y[p.target] = true;
    if (p.score > 0) mined.push_back(p);  // LASER prints pairs above threshold 0
  }
  return mined;
}

std::vector<BuccCandidate> bucc_candidates(const BuccCorpus& corpus,
                                           const torch::Tensor& source_embeddings,
                                           const torch::Tensor& english_embeddings, int64_t k) {
  XLME_CHECK(source_embeddings.dim() == 2 &&
                 source_embeddings.size(0) == static_cast<int64_t>(corpus.source.size()) &&
                 english_embeddings.dim() == 2 &&
                 english_embeddings.size(0) == static_cast<int64_t>(corpus.english.size()),
             "bucc {}: embeddings have shapes {} and {} but the corpus has {} source and {} "
             "English sentences",
             corpus.language, shape_text(source_embeddings.sizes()),
             shape_text(english_embeddings.sizes()), corpus.source.size(), corpus.english.size());
  std::vector<std::string> src_sents, en_sents;
  std::vector<int64_t> src_rows, en_rows;
  xmetric::unify(corpus.source, src_sents, src_rows);
  xmetric::unify(corpus.english, en_sents, en_rows);
  const auto src_index = torch::tensor(src_rows, torch::kLong).to(source_embeddings.device());
  const auto en_index = torch::tensor(en_rows, torch::kLong).to(english_embeddings.device());
  const auto mined = margin_mine(source_embeddings.index_select(0, src_index),
                                 english_embeddings.index_select(0, en_index), k);
  const auto src_ids = xmetric::sentence_to_id(corpus.source);
  const auto en_ids = xmetric::sentence_to_id(corpus.english);
  std::vector<BuccCandidate> out;
  std::map<std::pair<std::string, std::string>, size_t> position;
  for (const auto& p : mined) {
    const auto s = src_ids.find(text::strip_ascii(src_sents[p.source]));
    const auto e = en_ids.find(text::strip_ascii(en_sents[p.target]));
    if (s == src_ids.end() || e == en_ids.end()) continue;
    const auto [it, fresh] = position.emplace(std::make_pair(s->second, e->second), out.size());
    if (fresh) {
      out.push_back({s->second, e->second, p.score});
    } else {
      out[it->second].score = std::max(out[it->second].score, p.score);
    }
  }
  return out;
}

double bucc_optimize_threshold(const std::vector<BuccCandidate>& candidates,
                               const std::vector<std::pair<std::string, std::string>>& gold) {
  XLME_CHECK(!gold.empty(), "BUCC threshold tuning needs the dev gold pairs; none were given");
  const std::set<std::pair<std::string, std::string>> gold_set(gold.begin(), gold.end());
  std::vector<BuccCandidate> items = candidates;
  std::stable_sort(items.begin(), items.end(), [](const BuccCandidate& a, const BuccCandidate& b) {
    return a.score > b.score;
  });
  int64_t extracted = 0, correct = 0;
  double best_f1 = 0, threshold = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    ++extracted;
    correct += gold_set.count({items[i].source_id, items[i].english_id});
    if (correct == 0) continue;
    const double p = static_cast<double>(correct) / static_cast<double>(extracted);
    const double r = static_cast<double>(correct) / static_cast<double>(gold_set.size());
    const double f1 = 2 * p * r / (p + r);
    if (f1 > best_f1) {
      best_f1 = f1;
      // LASER's midpoint; past the last candidate (an IndexError there) its own score.
      threshold = i + 1 < items.size() ? (items[i].score + items[i + 1].score) / 2 : items[i].score;
    }
  }
  return threshold;
}

std::vector<std::pair<std::string, std::string>> bucc_extract(
    const std::vector<BuccCandidate>& candidates, double threshold) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : candidates)
    if (c.score >= threshold) out.emplace_back(c.source_id, c.english_id);
  return out;
}

PrfScores pair_scores(const std::vector<std::pair<std::string, std::string>>& predicted,
                      const std::vector<std::pair<std::string, std::string>>& gold) {
  const std::set<std::pair<std::string, std::string>> gold_set(gold.begin(), gold.end());
  PrfScores s;
  s.predicted = static_cast<int64_t>(predicted.size());
  s.gold = static_cast<int64_t>(gold_set.size());
  const std::set<std::pair<std::string, std::string>> pred_set(predicted.begin(), predicted.end());
  for (const auto& p : pred_set) s.correct += gold_set.count(p);
  if (s.correct > 0) {
    const double p = static_cast<double>(s.correct) / static_cast<double>(s.predicted);
    const double r = static_cast<double>(s.correct) / static_cast<double>(s.gold);
    s.precision = 100.0 * p;
    s.recall = 100.0 * r;
    s.f1 = 100.0 * 2 * p * r / (p + r);
  }
  return s;
}

// ---- Word alignment ----------------------------------------------------------------------------

std::vector<Link> align_argmax(const torch::Tensor& similarity) {
  XLME_CHECK(similarity.dim() == 2 && similarity.size(0) > 0 && similarity.size(1) > 0,
             "alignment: the similarity matrix must be [m, n] with m, n > 0, got shape {}",
             shape_text(similarity.sizes()));
  const auto sim = similarity.to(torch::kCPU, torch::kDouble);
  const auto row_best = sim.argmax(1).contiguous();  // [m]
  const auto col_best = sim.argmax(0).contiguous();  // [n]
  std::vector<Link> links;
  for (int64_t i = 0; i < sim.size(0); ++i) {
    const int64_t j = row_best.data_ptr<int64_t>()[i];
    if (col_best.data_ptr<int64_t>()[j] == i) links.push_back({i, j});
  }
  return links;
}

std::vector<Link> align_optimal_transport(const torch::Tensor& similarity, double threshold,
                                          double epsilon, int64_t iterations) {
  XLME_CHECK(similarity.dim() == 2 && similarity.size(0) > 0 && similarity.size(1) > 0,
             "alignment: the similarity matrix must be [m, n] with m, n > 0, got shape {}",
             shape_text(similarity.sizes()));
  XLME_CHECK(epsilon > 0 && iterations > 0,
             "optimal transport: epsilon ({}) and iterations ({}) "
             "must be positive",
             epsilon, iterations);
  const auto sim = similarity.to(torch::kCPU, torch::kDouble);
  const int64_t m = sim.size(0), n = sim.size(1);
  const auto kernel = ((sim - sim.max()) / epsilon).exp();  // [m, n], max entry 1
  auto u = torch::ones({m}, torch::kDouble), v = torch::ones({n}, torch::kDouble);
  for (int64_t it = 0; it < iterations; ++it) {
    u = (1.0 / m) / kernel.matmul(v).clamp_min(1e-300);
    v = (1.0 / n) / kernel.t().matmul(u).clamp_min(1e-300);
  }
  const auto plan = (u.unsqueeze(1) * kernel * v.unsqueeze(0)).contiguous();  // rows sum to 1/m
  std::vector<Link> links;
  const double* p = plan.data_ptr<double>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double v_ij = p[i * n + j];
      if (v_ij * m >= threshold && v_ij * n >= threshold) links.push_back({i, j});
    }
  }
  return links;
}

AerScores alignment_error_rate(const std::vector<AlignedPair>& gold,
                               const std::vector<std::vector<Link>>& predicted) {
  XLME_CHECK(gold.size() == predicted.size(), "AER: {} gold sentence pairs but {} predicted",
             gold.size(), predicted.size());
  int64_t a_total = 0, s_total = 0, a_and_s = 0, a_and_p = 0;
  for (size_t k = 0; k < gold.size(); ++k) {
    const auto sure = xmetric::link_set(gold[k].sure);
    auto possible = xmetric::link_set(gold[k].possible);
    possible.insert(sure.begin(), sure.end());  // P ⊇ S
    const auto a = xmetric::link_set(predicted[k]);
    a_total += static_cast<int64_t>(a.size());
    s_total += static_cast<int64_t>(sure.size());
    for (const auto& l : a) {
      a_and_s += sure.count(l);
      a_and_p += possible.count(l);
    }
  }
  XLME_CHECK(a_total + s_total > 0, "AER: neither the prediction nor the gold has a sure link");
  AerScores s;
  s.precision = a_total ? 100.0 * static_cast<double>(a_and_p) / a_total : 0.0;
  s.recall = s_total ? 100.0 * static_cast<double>(a_and_s) / s_total : 0.0;
  s.aer = 100.0 * (1.0 - static_cast<double>(a_and_s + a_and_p) / (a_total + s_total));
  return s;
}

}  // namespace xlme::finetune
