// Benchmark: forward + backward of one XLM-E micro-batch (generator, sampling, discriminator,
// MLM + lambda * RTD loss) on the CPU, and the share of that step spent in self-attention, the
// feed-forward blocks and the generator head, each timed alone (forward + backward) on the same
// shapes. With --kernels: each of xlme's own CPU kernels against LibTorch's operations
// (XLME_OPS's switch, ops/registry.h) on the config's shapes, forward + backward,
// the median of --rounds interleaved rounds of --steps runs each.
//
//   OMP_WAIT_POLICY=PASSIVE xlme-bench-model --config configs/model/tiny.yaml --vocab 8000
//       [--batch 16] [--length 128] [--steps 5] [--threads 0] [--kernels] [--rounds 5]
#include "timing.h"
#include "xlme/common/runtime.h"
#include "xlme/config/config.h"
#include "xlme/model/electra.h"
#include "xlme/model/parameter_count.h"
#include "xlme/objectives/objectives.h"
#include "xlme/ops/dropout.h"
#include "xlme/ops/registry.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

// Forward + backward of `fn(x)` with x: [B, T, hidden] requiring a gradient.
void forward_backward(const torch::Tensor& x,
                      const std::function<torch::Tensor(torch::Tensor)>& fn) {
  const auto out = fn(x);
  out.backward(torch::ones_like(out));
}

// One own kernel against LibTorch's operations: `run` timed with every own kernel on, and with
// `libtorch` (an XLME_OPS value) in force.
struct KernelCase {
  std::string name;
  std::string libtorch;
  std::function<void()> run;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void time_kernels(const std::vector<KernelCase>& cases, int steps, int rounds) {
  fmt::print("{:<28} {:<20} {:>11} {:>9} {:>7}\n", "kernel", "LibTorch (switch)", "LibTorch ms",
             "ours ms", "ratio");
  for (const auto& c : cases) {
    std::vector<double> ours, libtorch;
    for (int r = 0; r < rounds; ++r) {
      for (const bool own : {true, false}) {
        xlme::ops::set_ops(own ? "" : c.libtorch);
        (own ? ours : libtorch).push_back(xlme::bench::time_ms(steps, c.run));
      }
    }
    xlme::ops::set_ops("");
    const double a = median(libtorch), b = median(ours);
    fmt::print("{:<28} {:<20} {:>11.2f} {:>9.2f} {:>6.2f}x\n", c.name, c.libtorch, a, b, a / b);
  }
}

// The kernel cases on `cfg`'s shapes: `batch` x `length` tokens.
std::vector<KernelCase> kernel_cases(const xlme::config::Config& cfg, int64_t batch,
                                     int64_t length) {
  namespace m = xlme::model;
  const int64_t hidden = cfg.model.hidden_size, heads = cfg.model.heads;
  const double p = cfg.model.dropout;
  torch::manual_seed(0);
  // Attention's probabilities (float32 under autocast too) and a sub-layer's bf16 output.
  const auto probs = torch::rand({batch, heads, length, length}).requires_grad_(true);
  const auto y = torch::randn({batch, length, hidden}).requires_grad_(true);
  return {
      {"dropout (probabilities)", "dropout=reference",
       [=] { xlme::ops::dropout(probs, p, true).sum().backward(); }},
      {"dropout (bf16 activations)", "dropout=reference",
       [=] { xlme::ops::dropout(y.to(torch::kBFloat16), p, true).sum().backward(); }},
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"XLM-E forward + backward time on the CPU, with time shares per component"};
  std::string config_path = "configs/model/tiny.yaml";
  int64_t vocab = 8000, batch = 16, length = 128;
  int steps = 5, threads = 0, rounds = 5;
  bool kernels = false;
  cli.add_option("--config", config_path, "model config (configs/model/*.yaml)");
  cli.add_option("--vocab", vocab, "vocabulary size");
  cli.add_option("--batch", batch, "sequences per micro-batch");
  cli.add_option("--length", length, "tokens per sequence");
  cli.add_option("--steps", steps, "timed steps");
  cli.add_option("--threads", threads, "LibTorch threads (0: all cores)");
  cli.add_flag("--kernels", kernels, "time each own CPU kernel against LibTorch's operations");
  cli.add_option("--rounds", rounds, "interleaved rounds of --kernels (the median is printed)");
  CLI11_PARSE(cli, argc, argv);

  const auto settings = xlme::runtime::configure_threads(threads);
  const auto cfg =
      xlme::config::load_config(config_path, {"model.vocab_size=" + std::to_string(vocab)});
  if (kernels) {
    fmt::print("{}: [B, T] = [{}, {}]; threads {} LibTorch\n", config_path, batch, length,
               settings.intra_op);
    time_kernels(kernel_cases(cfg, batch, length), steps, rounds);
    return 0;
  }
  torch::manual_seed(0);
  xlme::model::ElectraModel model(cfg.model, xlme::model::Architecture::kElectra);
  model->train();
  const xlme::objectives::Objectives objectives(cfg.objectives);

  // A full micro-batch, 15% of the positions masked.
  const auto special = model->special_ids();
  xlme::data::Batch b;
  b.labels = torch::randint(5, vocab - 1, {batch, length}, torch::kInt64);
  b.masked = torch::rand({batch, length}) < cfg.objectives.mask_ratio;
  b.input_ids = b.labels.masked_fill(b.masked, special.mask);
  b.padding = torch::zeros({batch, length}, torch::kBool);
  b.positions = torch::arange(length).repeat({batch, 1});
  const auto inputs = xlme::model::ModelInputs::from(b);
  const int64_t masked = inputs.masked_index.size(0);

  const double step_ms = xlme::bench::time_ms(steps, [&] {
    model->zero_grad();
    const auto out = model->forward(inputs);
    const auto terms = objectives.compute(out, xlme::data::Task::kMono);
    std::map<std::string, torch::Tensor> norms;
    for (const auto& t : terms) norms[t.name] = t.count;
    xlme::objectives::weighted_loss(terms, norms).backward();
  });

  // Components, on the same shapes as in the step.
  double attention_ms = 0, ffn_ms = 0;
  for (auto* encoder : {&model->generator, &model->discriminator}) {
    const auto& o = (*encoder)->args();
    const auto& rp = o.relative_position;
    auto x = torch::randn({batch, length, o.hidden_size}).requires_grad_(true);
    torch::Tensor buckets, shared;
    xlme::model::BucketCache cache(rp.num_buckets, rp.max_distance);
    if (rp.enabled) buckets = cache.get(length, torch::kCPU);
    if (rp.enabled && rp.shared_across_layers) {
      shared = xlme::model::toeplitz_bias((*encoder)->relative_bias, buckets);
    }
    for (const auto& module : *(*encoder)->layers) {
      auto layer = std::dynamic_pointer_cast<xlme::model::EncoderLayerImpl>(module);
      attention_ms += xlme::bench::time_ms(steps, [&] {
        forward_backward(x, [&](const torch::Tensor& in) {
          auto table = shared;
          if (rp.enabled && !rp.shared_across_layers) {
            table = xlme::model::toeplitz_bias(layer->attention->relative_bias, buckets);
          }
          return layer->attention->forward(in, b.padding, table);
        });
      });
      ffn_ms += xlme::bench::time_ms(steps, [&] {
        forward_backward(x, [&](const torch::Tensor& in) { return layer->ffn->forward(in); });
      });
    }
  }
  const auto gen = model->generator->args();
  auto hidden = torch::randn({masked, gen.hidden_size}).requires_grad_(true);
  const auto targets = inputs.labels.view(-1).index_select(0, inputs.masked_index);
  const double head_ms = xlme::bench::time_ms(steps, [&] {
    const auto logits = model->generator_head->forward(hidden, model->embeddings->token->weight);
    xlme::model::sample_replacements(logits, 1.0, special);
    xlme::objectives::generator_term("mlm", logits, targets).loss_sum.backward();
  });

  const auto counts = xlme::model::parameter_counts(*model);
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  fmt::print("{}: vocab {}, {} parameters; micro-batch {} x {} tokens, {} masked\n", config_path,
             vocab, xlme::model::total_count(counts), batch, length, masked);
  fmt::print("threads {} LibTorch (BLAS: {}), OMP_WAIT_POLICY={}\n", settings.intra_op,
             xlme::runtime::blas_name(), policy ? policy : "(unset)");
  fmt::print("forward + backward step {:8.1f} ms   ({:.0f} tokens/s)\n", step_ms,
             static_cast<double>(batch * length) / step_ms * 1000.0);
  auto share = [&](const char* name, double ms) {
    fmt::print("  {:<40} {:8.1f} ms  {:5.1f}%\n", name, ms, 100.0 * ms / step_ms);
  };
  share("self-attention (all layers, both)", attention_ms);
  share("feed-forward (all layers, both)", ffn_ms);
  share("generator head + sampling + MLM loss", head_ms);
  share("rest (embeddings, norms, disc. head, ...)", step_ms - attention_ms - ffn_ms - head_ms);
  return 0;
}
