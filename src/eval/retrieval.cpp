#include "xlme/eval/retrieval.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/data/text.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace xlme::eval {
namespace {}  // namespace

std::vector<int64_t> sentence_ids(const data::Tokenizer& tokenizer, const std::string& text,
                                  int64_t max_len) {
  XLME_CHECK(max_len >= 2, "sentence max_len must be >= 2 (<s> and </s>), got {}", max_len);
  const auto& special = tokenizer.special_ids();
  const std::string_view bounded =
      data::utf8_prefix(text, static_cast<size_t>(max_len * data::kMaxBytesPerPiece));
  const std::vector<int32_t> pieces = tokenizer.encode(std::string(bounded));
  const auto kept = std::min<size_t>(pieces.size(), static_cast<size_t>(max_len - 2));
  std::vector<int64_t> ids;
  ids.reserve(kept + 2);
  ids.push_back(special.bos);
  ids.insert(ids.end(), pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(kept));
  ids.push_back(special.eos);
  return ids;
}

std::vector<std::vector<int64_t>> sentence_ids(const data::Tokenizer& tokenizer,
                                               const std::vector<std::string>& texts,
                                               int64_t max_len) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(texts.size());
  const auto bound = static_cast<size_t>(max_len * data::kMaxBytesPerPiece);
  int64_t cut = 0, first = 0;
  for (const auto& text : texts) {
    if (text.size() > bound && cut++ == 0) first = static_cast<int64_t>(out.size()) + 1;
    out.push_back(sentence_ids(tokenizer, text, max_len));
  }
  if (cut > 0) {
    spdlog::warn(
        "{} sentence(s) longer than {} bytes ({} bytes per token of max_len {}) were cut to that "
        "length before tokenization, the first at line {} of its file",
        cut, bound, data::kMaxBytesPerPiece, max_len, first);
  }
  return out;
}

std::vector<torch::Tensor> sentence_embeddings(model::Encoder& encoder,
                                               const std::vector<std::vector<int64_t>>& ids,
                                               const EmbeddingOptions& options) {
  XLME_CHECK(options.batch_size >= 1, "sentence_embeddings: batch_size must be >= 1, got {}",
             options.batch_size);
  const int64_t depth = encoder->args().layers;
  std::vector<int64_t> layers = options.layers;
  if (layers.empty()) {
    layers.resize(static_cast<size_t>(depth) + 1);
    std::iota(layers.begin(), layers.end(), 0);
  }
  for (const int64_t layer : layers) {
    XLME_CHECK(layer >= 0 && layer <= depth,
               "sentence_embeddings: layer {} requested, but the encoder has layers 0 (embeddings) "
               "to {}",
               layer, depth);
  }
  const int64_t up_to = *std::max_element(layers.begin(), layers.end());
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t hidden = encoder->args().hidden_size;
  std::vector<torch::Tensor> out;
  for (size_t l = 0; l < layers.size(); ++l) out.push_back(torch::zeros({n, hidden}));  // [N, H]
  if (n == 0) return out;
  for (int64_t i = 0; i < n; ++i) {
    XLME_CHECK(!ids[static_cast<size_t>(i)].empty(),
               "sentence_embeddings: sentence #{} has no ids; wrap every sentence in <s> ... </s>",
               i);
  }

  // Longest first, so that the first batch shows the peak memory at once.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ids[static_cast<size_t>(a)].size() > ids[static_cast<size_t>(b)].size();
  });

  const bool was_training = encoder->is_training();
  encoder->eval();
  torch::NoGradGuard no_grad;
  for (int64_t begin = 0; begin < n; begin += options.batch_size) {
    const int64_t end = std::min(n, begin + options.batch_size);
    const int64_t rows = end - begin;
    const auto width = static_cast<int64_t>(ids[static_cast<size_t>(order[begin])].size());
    auto input = torch::full({rows, width}, options.pad_id, torch::kLong);  // [B, T]
    auto padding = torch::ones({rows, width}, torch::kBool);                // [B, T]
    auto* in = input.data_ptr<int64_t>();
    auto* pad = padding.data_ptr<bool>();
    for (int64_t r = 0; r < rows; ++r) {
      const auto& sentence = ids[static_cast<size_t>(order[begin + r])];
      std::copy(sentence.begin(), sentence.end(), in + r * width);
      std::fill(pad + r * width, pad + r * width + static_cast<int64_t>(sentence.size()), false);
    }
    auto positions = torch::arange(width, torch::kLong).expand({rows, width}).contiguous();
    const auto device_padding = padding.to(options.device);
    const auto states = encoder->hidden_states(input.to(options.device),
                                               positions.to(options.device), device_padding, up_to);
    // Mean over the real positions: [B, T, H] * [B, T, 1] summed over T / real counts.
    const auto real = device_padding.logical_not().unsqueeze(-1).to(torch::kFloat32);
    const auto counts = real.sum(1);  // [B, 1]
    const auto index = torch::tensor(
        std::vector<int64_t>(order.begin() + begin, order.begin() + end), torch::kLong);
    for (size_t l = 0; l < layers.size(); ++l) {
      const auto pooled = (states[static_cast<size_t>(layers[l])].to(torch::kFloat32) * real)
                              .sum(1)
                              .div(counts)
                              .cpu();  // [B, H]
      out[l].index_copy_(0, index, pooled);
    }
  }
  encoder->train(was_training);
  return out;
}

torch::Tensor nearest_neighbours(const torch::Tensor& queries, const torch::Tensor& candidates) {
  XLME_CHECK(queries.dim() == 2 && candidates.dim() == 2 && queries.size(1) == candidates.size(1),
             "nearest_neighbours needs [N, H] queries and [M, H] candidates of the same width; got "
             "{} and {}",
             shape_text(queries.sizes()), shape_text(candidates.sizes()));
  XLME_CHECK(candidates.size(0) > 0, "nearest_neighbours: no candidates");
  auto unit = [](const torch::Tensor& x) {
    const auto d = x.detach().to(torch::kCPU, torch::kFloat64);
    return d / d.norm(2, 1, /*keepdim=*/true).clamp_min(1e-300);  // a zero row stays zero
  };
  const auto q = unit(queries), c = unit(candidates);
  const int64_t m = c.size(0);
  // At most ~32M similarities (256 MB) at a time.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 25) / m);
  const auto column = torch::arange(m, torch::kLong).unsqueeze(0);  // [1, M]
  std::vector<torch::Tensor> parts;
  for (int64_t begin = 0; begin < q.size(0); begin += block) {
    const auto sim = q.slice(0, begin, std::min(q.size(0), begin + block)).matmul(c.t());  // [b, M]
    const auto best = std::get<0>(sim.max(1, /*keepdim=*/true));
    // Lowest index among the maxima, whatever argmax's own tie rule.
    parts.push_back(torch::where(sim == best, column, m).amin(1));
  }
  return parts.empty() ? torch::empty({0}, torch::kLong) : torch::cat(parts);
}

RetrievalAccuracy retrieval_accuracy(const torch::Tensor& a, const torch::Tensor& b) {
  XLME_CHECK(a.dim() == 2 && a.sizes() == b.sizes() && a.size(0) > 0,
             "retrieval_accuracy needs two non-empty [N, H] tensors of the same shape (row i of "
             "one translates row i of the other); got {} and {}",
             shape_text(a.sizes()), shape_text(b.sizes()));
  const auto expected = torch::arange(a.size(0), torch::kLong);
  auto share = [&](const torch::Tensor& found) {
    return found.eq(expected).to(torch::kFloat64).mean().item<double>();
  };
  RetrievalAccuracy r;
  r.a_to_b = share(nearest_neighbours(a, b));
  r.b_to_a = share(nearest_neighbours(b, a));
  r.mean = (r.a_to_b + r.b_to_a) / 2;
  return r;
}

}  // namespace xlme::eval
