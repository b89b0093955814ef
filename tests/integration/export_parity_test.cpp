// xlme-export end to end, and parity with the pure PyTorch reference: a tiny model of each
// architecture variant is trained a few steps and perturbed (so that LayerNorm, biases and gates
// are far from their initial values), saved by the trainer, exported by the binary, and run on a
// padded batch by C++ and by XLME_PYTHON scripts/xlme_reference.py, which reads the export
// with its own numpy safetensors reader. Every hidden state (embeddings and each layer) must agree
// to 1e-4 at the real positions.
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"

#include "export_fixtures.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <regex>

namespace xlme::export_ {
namespace {

namespace fs = std::filesystem;
using checkpoint::load_pretrained;
using checkpoint::Pretrained;
using checkpoint::PretrainedOptions;
using checkpoint::SafetensorsContent;
using checkpoint::write_safetensors;
using xlme::testing::contains_all;
using xlme::testing::ExportVariant;
using xlme::testing::parity_batch;
using xlme::testing::quote;
using xlme::testing::run_tool;
using xlme::testing::shell;
using xlme::testing::TempDir;

const char* const kReferencePython = XLME_PYTHON;
constexpr double kParityTolerance = 1e-4;

class ExportParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      tokenizer_ = new std::string(xlme::testing::train_tiny_tokenizer(*dir_ / "tok"));
    });
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete dir_;
  }
  inline static xlme::testing::SuiteSetUp setup_;

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(setup_.check());
    const std::string lacks = xlme::testing::python_lacks(kReferencePython, "torch numpy");
    ASSERT_TRUE(lacks.empty()) << lacks;
  }

  // Exports a checkpoint of the variant, runs both sides on a padded batch (the generator where
  // the variant exports it, the discriminator otherwise) and returns the reference's largest
  // |difference| per hidden state.
  std::vector<double> parity(const ExportVariant& variant) {
    const std::string& name = variant.label;
    const std::vector<std::string>& export_args = variant.export_args;
    const std::string encoder =
        xlme::testing::exports_generator(variant) ? "generator" : "discriminator";
    TempDir dir;
    const auto config = xlme::testing::tiny_export_config(*tokenizer_, variant.overrides);
    auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
    std::vector<std::string> args{"--checkpoint", checkpoint.path, "--out", dir / "export"};
    args.insert(args.end(), export_args.begin(), export_args.end());
    const auto run = run_tool("xlme-export", args);
    EXPECT_EQ(run.code, 0) << run.err;
    if (run.code != 0) return {};

    PretrainedOptions options;
    options.with_generator = encoder == "generator";
    Pretrained p = load_pretrained(dir / "export", options);
    const auto batch = parity_batch(p.special_ids, /*length=*/24);
    std::vector<torch::Tensor> states, trained;
    {
      torch::NoGradGuard no_grad;
      auto& source = encoder == "generator" ? p.electra->generator : p.discriminator->discriminator;
      states = source->hidden_states(batch.ids, batch.positions, batch.padding);
      // fp32 exports hold the trained weights exactly: the same numbers as the trained model.
      auto& original =
          encoder == "generator" ? checkpoint.model->generator : checkpoint.model->discriminator;
      trained = original->hidden_states(batch.ids, batch.positions, batch.padding);
    }
    const bool fp32 =
        std::find(export_args.begin(), export_args.end(), "bf16") == export_args.end();
    for (size_t i = 0; fp32 && i < states.size(); ++i) {
      EXPECT_TRUE(torch::allclose(states[i], trained[i], 0, 1e-6)) << name << " state " << i;
    }
    SafetensorsContent inputs, expected;
    inputs.tensors = {
        {"input_ids", batch.ids}, {"positions", batch.positions}, {"padding", batch.padding}};
    for (size_t i = 0; i < states.size(); ++i) {
      expected.tensors["hidden." + std::to_string(i)] = states[i];
    }
    write_safetensors(dir / "inputs.safetensors", inputs);
    write_safetensors(dir / "expected.safetensors", expected);

    const auto [code, out] = shell(
        "cd " + quote(XLME_SOURCE_DIR) + " && " + kReferencePython +
        " scripts/xlme_reference.py --model " + quote(dir / "export") + " --encoder " + encoder +
        " --inputs " + quote(dir / "inputs.safetensors") + " --compare " +
        quote(dir / "expected.safetensors") + " --tolerance " + std::to_string(kParityTolerance));
    std::smatch match;
    const bool parsed = std::regex_search(out, match, std::regex(R"(\{"max_abs_diff": .*\})"));
    EXPECT_TRUE(parsed) << out;
    if (!parsed) return {};
    const auto report = nlohmann::json::parse(match[0].str());
    const auto diffs = report["max_abs_diff"].get<std::vector<double>>();
    std::cout << "[ parity   ] " << name << ": max |diff| per hidden state "
              << nlohmann::json(diffs) << std::endl;
    EXPECT_EQ(code, 0) << out;
    EXPECT_EQ(diffs.size(), states.size());
    for (size_t i = 0; i < diffs.size(); ++i) {
      EXPECT_LE(diffs[i], kParityTolerance) << name << " hidden state " << i;
    }
    return diffs;
  }

  static TempDir* dir_;
  static std::string* tokenizer_;
};
TempDir* ExportParity::dir_ = nullptr;
std::string* ExportParity::tokenizer_ = nullptr;

// Each variant of export_variants(); a bf16 export runs the same bf16-rounded weights in fp32 on
// both sides.
class ExportParityOfVariant : public ExportParity,
                              public ::testing::WithParamInterface<ExportVariant> {};

TEST_P(ExportParityOfVariant, MatchesTheReference) {
  parity(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Variants, ExportParityOfVariant,
                         ::testing::ValuesIn(xlme::testing::export_variants()),
                         xlme::testing::export_variant_name);

TEST_F(ExportParity, DistilledStudent) {
  // A student half as wide as its teacher (objectives.set=distill): the encoder alone, exported
  // and loaded like any discriminator; the teacher is not part of it.
  TempDir dir;
  const auto teacher = xlme::testing::make_tiny_checkpoint(
      xlme::testing::tiny_export_config(*tokenizer_, {}), dir / "teacher");
  parity({"DistilledStudent",
          "distilled student",
          {"objectives.set=distill", "distill.teacher=" + teacher.path, "distill.relation_heads=4",
           "model.hidden_size=16"},
          {}});
}

TEST_F(ExportParity, TheBinaryRefusesToOverwriteAndNamesBadInput) {
  TempDir dir;
  const auto config = xlme::testing::tiny_export_config(*tokenizer_, {});
  const auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
  auto r = run_tool("xlme-export", {"--set", "export.checkpoint=" + checkpoint.path, "--set",
                                    "export.out_dir=" + (dir / "export")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"exported", "tensors", "to " + (dir / "export")}));
  r = run_tool("xlme-export", {"--checkpoint", checkpoint.path, "--out", dir / "export"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"exists and is not empty; pass --force"}));
  r = run_tool("xlme-export",
               {"--checkpoint", checkpoint.path, "--out", dir / "export", "--force"});
  EXPECT_EQ(r.code, 0) << r.err;
  // A run folder stands for its newest valid checkpoint (issue 37 point 9).
  r = run_tool("xlme-export", {"--checkpoint", dir / "run", "--out", dir / "other"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"run folder " + (dir / "run") +
                                   ": exporting its newest valid checkpoint " + checkpoint.path}));
  r = run_tool("xlme-export", {"--out", dir / "other"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"no checkpoint to export: pass --checkpoint DIR"}));
  r = run_tool("xlme-export", {"--checkpoint", checkpoint.path, "--dtype", "fp8"});
  EXPECT_EQ(r.code, 2);

  // The reference prints hidden states for ids given on the command line.
  const auto [code, out] = shell("cd " + quote(XLME_SOURCE_DIR) + " && " + kReferencePython +
                                 " scripts/xlme_reference.py --model " + quote(dir / "export") +
                                 " --ids '0 17 42 2' --ids '0 5 2'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(contains_all(out, {"hidden.0: shape [2, 4, 32]", "hidden.2: shape [2, 4, 32]"}));
}

}  // namespace
}  // namespace xlme::export_
