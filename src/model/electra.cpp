#include "xlme/model/electra.h"

#include "xlme/common/error.h"
#include "xlme/config/objective_set.h"
#include "xlme/data/pair_sides.h"
#include "xlme/model/linear.h"
#include "xlme/ops/masked_lm.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace xlme::model {

Architecture architecture_for(const std::string& objective_set) {
  const auto& set = objectives::objective_set(objective_set);
  if (set.distillation) return Architecture::kEncoder;
  return set.discriminator ? Architecture::kElectra : Architecture::kMaskedLm;
}

ModelInputs ModelInputs::from(const data::Batch& batch) {
  ModelInputs in;
  in.input_ids = batch.input_ids;
  in.labels = batch.labels;
  in.padding = batch.padding;
  in.positions = batch.positions;
  in.masked_index = batch.masked.reshape(-1).nonzero().squeeze(1);
  return in;
}

int64_t masked_capacity(int64_t rows, int64_t length, double ratio) {
  const auto per_row = static_cast<int64_t>(std::floor(ratio * static_cast<double>(length))) + 1;
  return rows * std::min(length, per_row);
}

ModelInputs ModelInputs::padded_masked(int64_t capacity) const {
  XLME_CHECK(sides.empty() && masked_index.defined() && masked_index.device().is_cpu(),
             "padded_masked takes a host micro-batch's inputs without VECO's sides");
  const int64_t count = masked_index.size(0);
  const int64_t positions = labels.numel();
  XLME_CHECK(count <= capacity && capacity <= positions,
             "padded_masked: a capacity of {} masked positions for a micro-batch of {} positions "
             "with {} masked (model::masked_capacity bounds them)",
             capacity, positions, count);
  ModelInputs out = *this;
  out.masked_real = torch::zeros({capacity}, torch::kBool);
  out.masked_real.narrow(0, 0, count).fill_(true);
  if (count == capacity) {
    out.masked_index = masked_index.clone();
    return out;
  }
  // The filler: the first position that is not masked (there is one: count < capacity <= B x T).
  const auto ascending = masked_index.contiguous();
  const int64_t* index = ascending.data_ptr<int64_t>();
  int64_t filler = 0;
  for (int64_t i = 0; i < count && index[i] == filler; ++i) ++filler;
  out.masked_index =
      torch::cat({masked_index, torch::full({capacity - count}, filler, masked_index.options())});
  return out;
}

ModelInputs ModelInputs::from_pair(const data::Batch& batch, const data::SpecialIds& ids) {
  const auto sides = data::split_pair(batch, ids);
  ModelInputs in;
  in.sides = {from(sides.x), from(sides.y)};
  return in;
}

ModelInputs ModelInputs::to(const torch::Device& device, bool non_blocking) const {
  ModelInputs out;
  for (const auto& side : sides) out.sides.push_back(side.to(device, non_blocking));
  const auto move = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(device, non_blocking) : t;  // VECO: only the sides are set
  };
  out.input_ids = move(input_ids);
  out.labels = move(labels);
  out.padding = move(padding);
  out.positions = move(positions);
  out.masked_index = move(masked_index);
  out.masked_real = move(masked_real);
  return out;
}

ModelInputs ModelInputs::pinned() const {
  ModelInputs out;
  for (const auto& side : sides) out.sides.push_back(side.pinned());
  const auto pin = [](const torch::Tensor& t) { return t.defined() ? t.pin_memory() : t; };
  out.input_ids = pin(input_ids);
  out.labels = pin(labels);
  out.padding = pin(padding);
  out.positions = pin(positions);
  out.masked_index = pin(masked_index);
  out.masked_real = pin(masked_real);
  return out;
}

GeneratorHeadImpl::GeneratorHeadImpl(int64_t hidden_size, int64_t embedding_size,
                                     int64_t vocab_size, double layer_norm_eps, double init_std) {
  dense = register_module("dense", torch::nn::Linear(hidden_size, embedding_size));
  norm = register_module(
      "norm",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({embedding_size}).eps(layer_norm_eps)));
  output_bias = register_parameter("output_bias", torch::zeros({vocab_size}));
  init_normal({&dense}, init_std);
}

torch::Tensor GeneratorHeadImpl::forward(const torch::Tensor& hidden,
                                         const torch::Tensor& token_table) {
  // Logits [N, V] in rows padded for the masked-LM op where that makes its loads 16 bytes wide.
  return linear(norm(torch::gelu(linear(dense, hidden))), token_table, output_bias,
                ops::logits_row_multiple(hidden.device()));
}

DiscriminatorHeadImpl::DiscriminatorHeadImpl(int64_t hidden_size, double init_std) {
  dense = register_module("dense", torch::nn::Linear(hidden_size, hidden_size));
  output = register_module("output", torch::nn::Linear(hidden_size, 1));
  init_normal({&dense, &output}, init_std);
}

torch::Tensor DiscriminatorHeadImpl::forward(const torch::Tensor& hidden) {
  return linear(output, torch::gelu(linear(dense, hidden))).squeeze(-1);
}

ops::Sampling replacement_sampling(double temperature, const data::SpecialIds& special) {
  return ops::Sampling{temperature,
                       {special.bos, special.pad, special.eos, special.unk, special.mask}};
}

torch::Tensor sample_replacements(const torch::Tensor& logits, double temperature,
                                  const data::SpecialIds& special) {
  return ops::sample(logits, replacement_sampling(temperature, special));
}

ElectraModelImpl::ElectraModelImpl(const config::ModelConfig& config, Architecture architecture)
    : ElectraModelImpl(config, architecture, data::SpecialIds::for_vocab(config.vocab_size)) {}

ElectraModelImpl::ElectraModelImpl(const config::ModelConfig& config, Architecture architecture,
                                   const data::SpecialIds& special)
    : architecture_(architecture),
      special_(special),
      temperature_(config.generator.sampling_temperature) {
  XLME_CHECK(config.vocab_size > 0,
             "model.vocab_size is {} (= the tokenizer's size) and must be resolved before the "
             "model is built; set model.vocab_size or data.tokenizer",
             config.vocab_size);
  const auto disc = config::discriminator_args(config);
  auto buckets = std::make_shared<BucketCache>(disc.relative_position.num_buckets,
                                               disc.relative_position.max_distance);
  embeddings = register_module("embeddings", SharedEmbeddings(disc));
  if (architecture == Architecture::kElectra) {
    const auto gen = config::generator_args(config);
    generator = register_module("generator", Encoder(gen, embeddings, buckets));
    discriminator = register_module("discriminator", Encoder(disc, embeddings, buckets));
    generator_head = register_module(
        "generator_head", GeneratorHead(gen.hidden_size, gen.embedding_size, gen.vocab_size,
                                        gen.layer_norm_eps, gen.init_std));
    discriminator_head =
        register_module("discriminator_head", DiscriminatorHead(disc.hidden_size, disc.init_std));
  } else if (architecture == Architecture::kEncoder) {
    discriminator = register_module("discriminator", Encoder(disc, embeddings, buckets));
  } else {
    discriminator = register_module("discriminator", Encoder(disc, embeddings, buckets));
    mlm_head = register_module("mlm_head",
                               GeneratorHead(disc.hidden_size, disc.embedding_size, disc.vocab_size,
                                             disc.layer_norm_eps, disc.init_std));
  }
}

namespace {

// What distillation reads from `encoder` on input_ids: the projections of layer `layer` (1-based)
// and, with `hidden`, the last hidden states. Without `hidden` the layers from `layer` up are not
// run: the projections need only the layer's input.
void distillation_view(EncoderImpl& encoder, const ModelInputs& in, int64_t layer, bool hidden,
                       AttentionProjections& attention, torch::Tensor& last) {
  const int64_t run = hidden ? encoder.args().layers : layer - 1;
  const auto states = encoder.hidden_states(in.labels, in.positions, in.padding, run);
  attention = encoder.layer(layer - 1).projections(states[static_cast<size_t>(layer - 1)]);
  if (hidden) last = states.back();
}

// hidden: [B, T, H], masked_index: [N] -> [N, H]. Gathering before the head keeps the vocabulary
// projection to the masked positions (~15% of the tokens).
torch::Tensor gather_masked(const torch::Tensor& hidden, const torch::Tensor& masked_index) {
  return hidden.reshape({-1, hidden.size(-1)}).index_select(0, masked_index);
}

}  // namespace

ModelInputs ElectraModelImpl::inputs(const data::Batch& batch) const {
  return cross_attention() ? ModelInputs::from_pair(batch, special_) : ModelInputs::from(batch);
}

void ElectraModelImpl::set_teacher(Teacher teacher) {
  XLME_CHECK(architecture_ == Architecture::kEncoder,
             "only a distillation student (objectives.set=distill) takes a teacher");
  XLME_CHECK(teacher.model && teacher.encoder,
             "the teacher needs its model and its discriminator encoder");
  const int64_t layers = teacher.encoder->args().layers;
  XLME_CHECK(teacher.layer >= 1 && teacher.layer <= layers,
             "teacher layer {} is not one of the teacher's layers 1..{}", teacher.layer, layers);
  for (auto& p : teacher.model->parameters()) p.set_requires_grad(false);
  teacher.model->eval();
  teacher_device_ = teacher.model->parameters().front().device();
  teacher_ = std::move(teacher);
}

ModelOutput ElectraModelImpl::forward(const ModelInputs& in) {
  ModelOutput out;
  out.padding = in.padding;
  if (architecture_ == Architecture::kEncoder) {
    XLME_CHECK(teacher_.model,
               "objectives.set=distill: the student has no teacher; train::build_model loads "
               "distill.teacher");
    distillation_view(*discriminator, in, discriminator->args().layers, teacher_.hidden,
                      out.student_attention, out.student_hidden);
    if (teacher_device_ != in.labels.device()) {
      teacher_.model->to(in.labels.device());
      teacher_device_ = in.labels.device();
    }
    torch::NoGradGuard no_grad;
    distillation_view(*teacher_.encoder, in, teacher_.layer, teacher_.hidden, out.teacher_attention,
                      out.teacher_hidden);
    return out;
  }
  const auto& table = embeddings->token->weight;
  if (cross_attention()) {
    XLME_CHECK(in.sides.size() == 2,
               "a model with cross-attention (objectives.set=veco) reads both sides of each pair; "
               "make its input with inputs(batch)");
    const auto& x = in.sides[0];
    const auto& y = in.sides[1];
    auto& encoder = *discriminator;
    // Self-attention only (H), then with cross-attention to the other side's last H (S); the
    // context keeps its gradient, so S's terms also train the other side's H pass.
    const auto hx = encoder.forward(x.input_ids, x.positions, x.padding);
    const auto hy = encoder.forward(y.input_ids, y.positions, y.padding);
    const auto sx =
        encoder.forward_with_context(x.input_ids, x.positions, x.padding, hy, y.padding);
    const auto sy =
        encoder.forward_with_context(y.input_ids, y.positions, y.padding, hx, x.padding);
    auto predict = [&](const torch::Tensor& hidden, const ModelInputs& side) {
      return MaskedPrediction{mlm_head(gather_masked(hidden, side.masked_index), table),
                              side.labels.reshape(-1).index_select(0, side.masked_index)};
    };
    out.pair_predictions = {predict(hx, x), predict(sx, x), predict(hy, y), predict(sy, y)};
    return out;
  }
  // The original tokens at the masked positions; padded_masked()'s filler entries are ignored.
  const auto originals = in.labels.reshape(-1).index_select(0, in.masked_index);
  out.generator_targets = in.masked_real.defined()
                              ? originals.masked_fill(in.masked_real.logical_not(), kIgnoredTarget)
                              : originals;
  if (architecture_ == Architecture::kMaskedLm) {
    const auto hidden = discriminator(in.input_ids, in.positions, in.padding);
    out.generator_logits = mlm_head(gather_masked(hidden, in.masked_index), table);
    return out;
  }
  const auto generated = generator(in.input_ids, in.positions, in.padding);
  out.generator_logits = generator_head(gather_masked(generated, in.masked_index), table);
  // The generator's loss, accuracy and draws in one op (ops/masked_lm.h): with the fused kernel,
  // one pass over the logits.
  const auto sampling = replacement_sampling(temperature_, special_);
  auto lm = ops::masked_lm(out.generator_logits, out.generator_targets, &sampling);
  out.generator_loss_sum = lm.loss_sum;
  out.generator_correct = lm.correct;
  out.sampled = lm.sampled;
  // The discriminator sees the originals with the samples put in; a sample equal to the
  // original is therefore labelled original. A filler entry puts its position's original back.
  const auto put =
      in.masked_real.defined() ? torch::where(in.masked_real, out.sampled, originals) : out.sampled;
  out.discriminator_input =
      in.labels.reshape(-1).index_copy(0, in.masked_index, put).view_as(in.labels);
  out.replaced = out.discriminator_input != in.labels;
  const auto hidden = discriminator(out.discriminator_input, in.positions, in.padding);
  out.discriminator_logits = discriminator_head(hidden);
  return out;
}

}  // namespace xlme::model
