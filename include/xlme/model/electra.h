// The XLM-E model (ELECTRA): a generator and a discriminator sharing token and position
// embeddings, the generator head at masked positions, replacement sampling, the discriminator
// head. It returns logits and what the objectives need; it never computes a loss
// (docs/ARCHITECTURE.md#model). The same code builds the baselines: objectives.set mlm / mlm+tlm
// have no generator and put an MLM head on the discriminator-sized encoder.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/model/encoder.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace xlme::model {

// kElectra: generator + discriminator (objectives.set xlme, xlme-mono); kMaskedLm: one encoder
// with an MLM head (mlm, mlm+tlm); kEncoder: the discriminator-sized encoder alone, the student
// of a frozen teacher (distill).
enum class Architecture { kElectra, kMaskedLm, kEncoder };

// objectives.set -> architecture, from its row of objectives::objective_sets(); throws on an
// unknown set, listing the known ones.
Architecture architecture_for(const std::string& objective_set);

// What the model reads from a data::Batch, plus the masked positions as flat indices so that the
// model can gather them without a device-to-host synchronization.
struct ModelInputs {
  torch::Tensor input_ids;     // [B, T] int64: tokens with the selected positions masked
  torch::Tensor labels;        // [B, T] int64: the original tokens
  torch::Tensor padding;       // [B, T] bool: true at <pad>
  torch::Tensor positions;     // [B, T] int64: absolute position ids
  torch::Tensor masked_index;  // [N] int64: b * T + t of each masked position, ascending
  // After padded_masked(): [N] bool, true at the masked positions; the entries after them repeat a
  // position that is not masked, and their targets are ignored (kIgnoredTarget). Undefined: every
  // entry of masked_index is a masked position.
  torch::Tensor masked_real;
  // VECO (model.cross_attention): the micro-batch's two sides x and y (data::split_pair), each
  // with the fields above, which are then left undefined here; empty otherwise (the fields above
  // are then the model's input).
  std::vector<ModelInputs> sides;

  // Computes masked_index where the batch lives: call it on the host batch, before to().
  static ModelInputs from(const data::Batch& batch);
  // The same for VECO: only `sides`, from data::split_pair of the host batch.
  static ModelInputs from_pair(const data::Batch& batch, const data::SpecialIds& ids);
  // The same inputs with masked_index padded to `capacity` entries (masked_real says which are
  // real), so that the generator's rows have one shape whatever the number of masked tokens (CUDA
  // graphs replay one shape). The model computes the same losses, gradients and draws as without
  // it. Host tensors only, not VECO's sides; `capacity` is at least the masked count and at most
  // B x T (masked_capacity()).
  ModelInputs padded_masked(int64_t capacity) const;
  ModelInputs to(const torch::Device& device, bool non_blocking = true) const;
  // The same tensors in pinned (page-locked) host memory: a non-blocking copy to a GPU from them
  // is queued without waiting for the device. Needs CUDA.
  ModelInputs pinned() const;
};

// The target of a generator row that padded_masked() added: the row adds nothing to the loss,
// the accuracy or the counts (LibTorch's cross_entropy ignores it).
constexpr int64_t kIgnoredTarget = -100;

// The most masked tokens a [rows, length] micro-batch can hold when each row masks
// floor(ratio x n + u) of its n maskable tokens (data::mask_row, u in [0, 1)): a padding capacity
// that every such micro-batch fits.
int64_t masked_capacity(int64_t rows, int64_t length, double ratio);

// An MLM head's logits at masked positions and the original tokens there.
struct MaskedPrediction {
  torch::Tensor logits;   // [N, V]
  torch::Tensor targets;  // [N] int64
};

// Everything the objectives read. N = masked positions in the micro-batch.
struct ModelOutput {
  torch::Tensor generator_logits;   // [N, V]: generator (or MLM head) at masked positions
  torch::Tensor generator_targets;  // [N] int64: the original tokens there (or kIgnoredTarget)
  torch::Tensor sampled;            // [N] int64: replacements drawn from the generator
  // kElectra: the generator's summed loss and correct count, computed with the draws (one pass
  // of ops::masked_lm); undefined otherwise (the objectives compute them from the logits).
  torch::Tensor generator_loss_sum;
  torch::Tensor generator_correct;
  torch::Tensor discriminator_input;   // [B, T] int64: originals with the replacements put in
  torch::Tensor replaced;              // [B, T] bool: discriminator input != original
  torch::Tensor discriminator_logits;  // [B, T]: one logit per token (replaced vs original)
  torch::Tensor padding;               // [B, T] bool: true at <pad>
  // kEncoder (distillation), on the unmasked input (ModelInputs::labels): the projections of the
  // student's last layer and of the teacher's distilled layer (the teacher's without gradient),
  // and both last hidden states [B, T, width] when the teacher reads them (Teacher::hidden).
  AttentionProjections student_attention;
  AttentionProjections teacher_attention;
  torch::Tensor student_hidden;
  torch::Tensor teacher_hidden;
  // VECO: the MLM head at the masked positions of x given x^, x given x^ and y^, y given y^, and y
  // given y^ and x^ (the order of the set's terms).
  std::vector<MaskedPrediction> pair_predictions;
};

// The frozen teacher of a distillation student (docs/pretraining.md#distillation): a pre-trained
// discriminator whose parameters require no gradient, run in eval mode under no-grad. It is not
// a registered module of the student: not in its parameters (the optimizer), checkpoints or
// broadcasts.
struct Teacher {
  std::shared_ptr<torch::nn::Module> model;  // the whole teacher: embeddings and encoder
  Encoder encoder{nullptr};                  // its discriminator encoder
  int64_t layer = 0;    // 1..layers: the layer whose relations the student's last layer mimics
  bool hidden = false;  // also the last hidden states of both (distill.hidden_cosine > 0)
};

// dense [hidden -> E] -> GELU -> LayerNorm -> tied projection onto the token table + bias.
class GeneratorHeadImpl : public torch::nn::Module {
 public:
  GeneratorHeadImpl(int64_t hidden_size, int64_t embedding_size, int64_t vocab_size,
                    double layer_norm_eps, double init_std);

  // hidden: [N, hidden]; token_table: [V, E] -> logits [N, V].
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& token_table);

  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::Tensor output_bias;  // [V]
};
TORCH_MODULE(GeneratorHead);

// dense [hidden -> hidden] -> GELU -> output [hidden -> 1].
class DiscriminatorHeadImpl : public torch::nn::Module {
 public:
  DiscriminatorHeadImpl(int64_t hidden_size, double init_std);

  torch::Tensor forward(const torch::Tensor& hidden);  // [B, T, hidden] -> [B, T]

  torch::nn::Linear dense{nullptr}, output{nullptr};
};
TORCH_MODULE(DiscriminatorHead);

// One draw per row from softmax(logits / temperature) computed in float32 (float64 logits stay
// float64) whatever the logits' dtype, never a special id; no gradient: ops::sample (reference:
// inverse CDF on the CPU, Gumbel-max elsewhere; fused on CUDA: the Triton kernel).
// logits: [N, V] -> [N] int64.
torch::Tensor sample_replacements(const torch::Tensor& logits, double temperature,
                                  const data::SpecialIds& special);

// Registered modules (export-key prefixes): embeddings, generator, discriminator, generator_head
// (kElectra) or mlm_head (kMaskedLm), discriminator_head (kElectra); kEncoder: embeddings and
// discriminator only. VECO is kMaskedLm with model.cross_attention: its discriminator has the
// cross-attention modules, and forward() runs both sides of each pair twice (self-attention only,
// then with cross-attention to the other side's last hidden states).
class ElectraModelImpl : public torch::nn::Module {
 public:
  // model.vocab_size must be resolved (non-zero); special ids default to the XLM-R layout.
  ElectraModelImpl(const config::ModelConfig& config, Architecture architecture);
  ElectraModelImpl(const config::ModelConfig& config, Architecture architecture,
                   const data::SpecialIds& special);

  ModelOutput forward(const ModelInputs& inputs);

  // The model's input for a host batch (ModelInputs::from, or from_pair with cross-attention).
  ModelInputs inputs(const data::Batch& batch) const;
  // Whether the encoder has VECO's cross-attention modules (model.cross_attention).
  bool cross_attention() const { return discriminator->args().cross_attention; }

  Architecture architecture() const { return architecture_; }
  const data::SpecialIds& special_ids() const { return special_; }

  // kEncoder only: freezes `teacher` (no gradient, eval mode) and runs it beside the student in
  // every forward(), on the inputs' device (it is moved there at the first forward on another).
  void set_teacher(Teacher teacher);
  // The teacher; null without one.
  const Teacher* teacher() const { return teacher_.model ? &teacher_ : nullptr; }

  SharedEmbeddings embeddings{nullptr};
  Encoder generator{nullptr};  // kElectra only
  Encoder discriminator{nullptr};
  GeneratorHead generator_head{nullptr};          // kElectra only
  GeneratorHead mlm_head{nullptr};                // kMaskedLm only
  DiscriminatorHead discriminator_head{nullptr};  // kElectra only

 private:
  Architecture architecture_;
  data::SpecialIds special_;
  double temperature_;
  Teacher teacher_;
  torch::Device teacher_device_ = torch::kCPU;
};
TORCH_MODULE(ElectraModel);

}  // namespace xlme::model
