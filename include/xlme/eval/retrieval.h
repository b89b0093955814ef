// Cross-lingual sentence retrieval (XTREME's BUCC and Tatoeba, and the pre-training probe):
// sentences as whole <s> ... </s> sequences, mean-pooled hidden states of one encoder layer (or
// of every layer at once, for layer sweeps), and accuracy@1 of cosine nearest neighbours.
#pragma once

#include "xlme/data/tokenizer.h"
#include "xlme/model/encoder.h"

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::eval {

// <s> pieces </s> of one sentence, at most `max_len` ids (>= 2): a longer sentence keeps its
// first max_len - 2 pieces and still ends with </s>. The text is cut to max_len *
// data::kMaxBytesPerPiece bytes before tokenization (the many-sentence form warns with the count).
std::vector<int64_t> sentence_ids(const data::Tokenizer& tokenizer, const std::string& text,
                                  int64_t max_len);
std::vector<std::vector<int64_t>> sentence_ids(const data::Tokenizer& tokenizer,
                                               const std::vector<std::string>& texts,
                                               int64_t max_len);

struct EmbeddingOptions {
  // Hidden states to pool: 0 = the embedding output, 1..L = after that layer. Empty: every one,
  // 0..L. Only the layers up to the highest requested one are run.
  std::vector<int64_t> layers;
  int64_t batch_size = 64;  // sentences per forward pass
  int64_t pad_id = 1;       // <pad>
  torch::Device device = torch::kCPU;
};

// One [N, H] float32 CPU tensor per requested layer (in options.layers order; 0..L when empty):
// row i is the mean over sentence i's positions (specials included, padding excluded) of that
// layer's hidden state. The encoder runs in eval mode without gradients (its training flag is
// restored afterwards), on sentences sorted by length so that batches carry little padding;
// rows come back in the input order. Empty sentences are an error.
std::vector<torch::Tensor> sentence_embeddings(model::Encoder& encoder,
                                               const std::vector<std::vector<int64_t>>& ids,
                                               const EmbeddingOptions& options);

// For every row of `queries` [N, H] the index of its cosine nearest neighbour among the rows of
// `candidates` [M, H] -> [N] int64. Ties go to the lowest candidate index; a zero vector has
// cosine 0 with everything. Computed in float64 on the CPU, in row blocks of bounded memory.
torch::Tensor nearest_neighbours(const torch::Tensor& queries, const torch::Tensor& candidates);

struct RetrievalAccuracy {
  double a_to_b = 0;  // share of i whose nearest b is b_i
  double b_to_a = 0;  // share of i whose nearest a is a_i
  double mean = 0;    // (a_to_b + b_to_a) / 2
};

// Accuracy@1 of aligned rows: a [N, H] and b [N, H], row i of a translates row i of b.
RetrievalAccuracy retrieval_accuracy(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace xlme::eval
