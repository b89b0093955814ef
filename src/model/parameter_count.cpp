#include "xlme/model/parameter_count.h"

#include <fmt/format.h>

#include <sstream>

namespace xlme::model {

std::vector<ModuleParameters> parameter_counts(const torch::nn::Module& model) {
  std::vector<ModuleParameters> counts;
  for (const auto& child : model.named_children()) {
    int64_t n = 0;
    for (const auto& p : child.value()->parameters()) n += p.numel();
    counts.push_back({child.key(), n});
  }
  return counts;
}

namespace {

int64_t linear_count(int64_t in, int64_t out) {
  return in * out + out;
}

int64_t encoder_count(const config::ModelArgs& o) {
  const int64_t h = o.hidden_size, head_dim = o.hidden_size / o.heads;
  const auto& rp = o.relative_position;
  int64_t attention = 4 * linear_count(h, h) + 2 * h;  // q, k, v, output; attention_norm
  if (rp.enabled && !rp.shared_across_layers) attention += o.heads * rp.num_buckets;  // d
  if (rp.enabled && rp.gated) attention += 2 * o.heads * head_dim + o.heads;          // u, v, w
  // VECO's cross-attention (q, k, v, output; cross_attention_norm), shared with the attention.
  if (o.cross_attention) attention += 4 * linear_count(h, h) + 2 * h;
  const int64_t ffn = linear_count(h, o.ffn_size) + linear_count(o.ffn_size, h) + 2 * h;
  // Shared sub-layers (model.share_layers) are counted once.
  int64_t n = (o.shares_attention() ? 1 : o.layers) * attention +
              (o.shares_ffn() ? 1 : o.layers) * ffn + 2 * o.embedding_size;  // embedding_norm
  if (o.embedding_size != h) n += linear_count(o.embedding_size, h);
  if (o.embedding_sharing == config::EmbeddingSharing::kGdes) {
    n += o.vocab_size * o.embedding_size;
    if (o.absolute_positions) n += o.max_positions * o.embedding_size;
  }
  if (rp.enabled && rp.shared_across_layers) n += o.heads * rp.num_buckets;
  if (o.norm == config::Norm::kPre) n += 2 * h;
  return n;
}

int64_t generator_head_count(const config::ModelArgs& o) {
  return linear_count(o.hidden_size, o.embedding_size) + 2 * o.embedding_size + o.vocab_size;
}

}  // namespace

std::vector<ModuleParameters> analytic_parameter_counts(const config::ModelConfig& config,
                                                        Architecture architecture) {
  const auto disc = config::discriminator_args(config);
  int64_t embeddings = disc.vocab_size * disc.embedding_size;
  if (disc.absolute_positions) embeddings += disc.max_positions * disc.embedding_size;
  if (architecture == Architecture::kEncoder) {
    return {{"embeddings", embeddings}, {"discriminator", encoder_count(disc)}};
  }
  if (architecture == Architecture::kMaskedLm) {
    return {{"embeddings", embeddings},
            {"discriminator", encoder_count(disc)},
            {"mlm_head", generator_head_count(disc)}};
  }
  const auto gen = config::generator_args(config);
  return {{"embeddings", embeddings},
          {"generator", encoder_count(gen)},
          {"discriminator", encoder_count(disc)},
          {"generator_head", generator_head_count(gen)},
          {"discriminator_head",
           linear_count(disc.hidden_size, disc.hidden_size) + linear_count(disc.hidden_size, 1)}};
}

int64_t count_of(const std::vector<ModuleParameters>& counts, const std::string& module) {
  for (const auto& c : counts) {
    if (c.module == module) return c.count;
  }
  return 0;
}

int64_t total_count(const std::vector<ModuleParameters>& counts) {
  int64_t n = 0;
  for (const auto& c : counts) n += c.count;
  return n;
}

namespace {

std::string with_thousands(int64_t n) {  // 277473936 -> "277,473,936"
  std::string digits = std::to_string(n);
  for (auto i = static_cast<int64_t>(digits.size()) - 3; i > 0; i -= 3) {
    digits.insert(static_cast<size_t>(i), ",");
  }
  return digits;
}

}  // namespace

std::string format_parameter_table(const std::vector<ModuleParameters>& counts) {
  std::ostringstream out;
  auto line = [&](const std::string& name, int64_t n) {
    out << fmt::format("{:<36} {:>15} {:>9.1f}M\n", name, with_thousands(n),
                       static_cast<double>(n) / 1e6);
  };
  out << fmt::format("{:<36} {:>15} {:>10}\n", "module", "parameters", "");
  for (const auto& c : counts) line(c.module, c.count);
  line("total", total_count(counts));
  line("discriminator + embeddings (kept)",
       count_of(counts, "embeddings") + count_of(counts, "discriminator"));
  return out.str();
}

}  // namespace xlme::model
