// xlme-parity-trace: trains a small model with xlme's Trainer on synthetic batches (some rows
// padded) and records what an independent implementation needs to repeat the run step by step
// (scripts/parity_pytorch.py): the initial weights, every micro-batch (inputs, labels, masks,
// padding, positions) with the generator's draws as the discriminator saw them, and after every
// step its terms, the gradient norm, the learning rate and every parameter.
//
//   xlme-parity-trace --out DIR [--steps N] [--seed S] [KEY=VALUE ...]
//   xlme-parity-trace --out DIR --config FILE [--steps N] [KEY=VALUE ...]
//
// Without --config: a small model (overrides below) on synthetic batches. With --config: that
// config's model on its shards (data.shards, data.tokenizer: the batches pretraining reads), with
// dropout off and fp32 on the CPU so that the step is deterministic.
// DIR/init.safetensors: "param.<name>" before the first step; metadata "config" (the resolved
// configuration as KEY=VALUE lines) and "parameters" (the names in the optimizer's order).
// DIR/step_<k>.safetensors (k = 1..N): "batch.<b>.<field>" for each micro-batch b of step k in the
// order the trainer ran them, "param.<name>" after the step; metadata "lr", "grad_norm", "loss"
// and "term.<name>" (the term's loss as the trainer reports it), written with 17 digits.
#include "xlme/checkpoint/safetensors.h"
#include "xlme/common/error.h"
#include "xlme/config/config.h"
#include "xlme/data/batches.h"
#include "xlme/data/synthetic.h"
#include "xlme/data/tokenizer.h"
#include "xlme/dist/communicator.h"
#include "xlme/train/distill.h"
#include "xlme/train/trainer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace xlme;

// SyntheticBatches with padding: row r of a micro-batch keeps its first T - (r % 4) * T / 8
// positions (the last real one </s>) and pads the rest, so that the attention's key mask, the
// losses' weights and the counts are exercised.
class PaddedSyntheticBatches : public data::SyntheticBatches {
 public:
  PaddedSyntheticBatches(const data::SpecialIds& special, int64_t batch, int64_t length,
                         double mask_ratio, uint64_t seed)
      : data::SyntheticBatches(special, batch, length, mask_ratio, seed), special_(special) {}

  data::Batch next(data::Task task) override {
    data::Batch b = data::SyntheticBatches::next(task);
    const int64_t rows = b.input_ids.size(0), length = b.input_ids.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t keep = length - (r % 4) * length / 8;
      if (keep >= length) continue;
      b.labels[r][keep - 1] = special_.eos;
      b.input_ids[r][keep - 1] = special_.eos;
      b.masked[r][keep - 1] = false;
      b.labels[r].narrow(0, keep, length - keep).fill_(special_.pad);
      b.input_ids[r].narrow(0, keep, length - keep).fill_(special_.pad);
      b.masked[r].narrow(0, keep, length - keep).fill_(false);
      b.padding[r].narrow(0, keep, length - keep).fill_(true);
    }
    b.real_tokens = b.padding.logical_not().sum().item<int64_t>();
    return b;
  }

 private:
  data::SpecialIds special_;
};

std::string number(double value) {
  return fmt::format("{:.17g}", value);
}

void add_parameters(checkpoint::SafetensorsContent& content, model::ElectraModel& model) {
  for (const auto& item : model->named_parameters()) {
    content.tensors["param." + item.key()] = item.value().detach().cpu().clone();
  }
}

int run(int argc, char** argv) {
  std::vector<std::string> user;
  std::string out, config_file;
  int64_t steps = 50;
  uint64_t seed = 1;
  // The small model of the synthetic trace.
  const std::vector<std::string> small_model = {"model.vocab_size=96",
                                                "model.hidden_size=32",
                                                "model.layers=2",
                                                "model.heads=2",
                                                "model.ffn_size=64",
                                                "model.max_positions=64",
                                                "model.generator.layers=1",
                                                "finetune.max_len=64",
                                                "model.dropout=0",
                                                "model.attention_dropout=0",
                                                "data.mono.max_len=24",
                                                "data.para.max_len=24",
                                                "train.warmup_steps=5",
                                                "train.lr=2e-3",
                                                "train.clip_norm=1.0",
                                                "train.precision=fp32",
                                                "train.micro_batch_tokens=192",
                                                "train.tokens_per_task=384",
                                                "run.device=cpu"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (arg == "--config" && i + 1 < argc) {
      config_file = argv[++i];
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::stoll(argv[++i]);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (arg.find('=') != std::string::npos && arg[0] != '-') {
      user.push_back(arg);
    } else {
      std::cerr << "usage: xlme-parity-trace --out DIR [--steps N] [--seed S] [KEY=VALUE ...]\n"
                << "xlme-parity-trace: unknown argument '" << arg << "'\n";
      return 2;
    }
  }
  XLME_CHECK(!out.empty(), "xlme-parity-trace needs --out DIR");
  // With --config, the file's model and data; only what makes the step deterministic is set.
  std::vector<std::string> overrides =
      config_file.empty() ? small_model
                          : std::vector<std::string>{"model.dropout=0", "model.attention_dropout=0",
                                                     "train.precision=fp32", "run.device=cpu"};
  overrides.insert(overrides.end(), user.begin(), user.end());
  overrides.push_back(fmt::format("train.steps={}", steps));
  config::Config config = config::load_config(config_file, overrides);
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (!config_file.empty()) {
    tokenizer = std::make_unique<data::Tokenizer>(
        config.data.tokenizer, data::parse_vocab_layout(config.data.vocab_layout));
    if (config.model.vocab_size == 0) config.model.vocab_size = tokenizer->vocab_size();
  }
  std::filesystem::create_directories(out);

  torch::manual_seed(seed);
  auto model = train::build_model(config);
  const auto special = data::SpecialIds::for_vocab(config.model.vocab_size);
  const int64_t length = config.data.mono.max_len;
  std::unique_ptr<data::BatchSource> source;
  if (tokenizer) {
    source = std::make_unique<data::ShardBatchSource>(
        data::BatchOptions::from_config(config, tokenizer.get(), 0, 1));
  } else {
    source =
        std::make_unique<PaddedSyntheticBatches>(special, config.train.micro_batch_tokens / length,
                                                 length, config.objectives.mask_ratio, seed + 1000);
  }
  auto comm =
      dist::Communicator::create(dist::LaunchInfo{}, torch::kCPU, "gloo", std::chrono::seconds(10));
  train::Trainer trainer(config, model, *source, comm);

  checkpoint::SafetensorsContent init;
  add_parameters(init, model);
  std::string names, lines;
  for (const auto& item : model->named_parameters()) names += item.key() + "\n";
  for (const auto& [key, value] : config::flat_values(config::to_yaml(config)))
    lines += key + "=" + value + "\n";
  init.metadata["parameters"] = names;
  init.metadata["config"] = lines;
  checkpoint::write_safetensors(out + "/init.safetensors", init);

  checkpoint::SafetensorsContent step;
  int64_t micro = 0;
  trainer.set_forward_observer([&](const data::Batch& batch, const model::ModelOutput& output) {
    const std::string p = fmt::format("batch.{}.", micro++);
    step.tensors[p + "task"] =
        torch::full({1}, batch.task == data::Task::kMono ? 0 : 1, torch::kInt64);
    step.tensors[p + "input_ids"] = batch.input_ids.clone();
    step.tensors[p + "labels"] = batch.labels.clone();
    step.tensors[p + "masked"] = batch.masked.clone();
    step.tensors[p + "padding"] = batch.padding.clone();
    step.tensors[p + "positions"] = batch.positions.clone();
    if (output.discriminator_input.defined()) {
      step.tensors[p + "discriminator_input"] = output.discriminator_input.detach().cpu().clone();
    }
  });
  for (int64_t k = 1; k <= steps; ++k) {
    step = {};
    micro = 0;
    const train::StepRecord record = trainer.train_step();
    XLME_CHECK(!record.skipped, "step {} was skipped (non-finite loss or gradient)", k);
    add_parameters(step, model);
    step.metadata["lr"] = number(record.lr);
    step.metadata["grad_norm"] = number(record.grad_norm);
    step.metadata["loss"] = number(record.loss);
    for (const auto& [name, summary] : record.terms) {
      step.metadata["term." + name] = number(summary.at("loss"));
    }
    checkpoint::write_safetensors(fmt::format("{}/step_{}.safetensors", out, k), step);
  }
  std::cout << "xlme-parity-trace: " << steps
            << " steps of objectives.set=" << config.objectives.set << " -> " << out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "xlme-parity-trace: " << e.what() << "\n";
    return 1;
  }
}
