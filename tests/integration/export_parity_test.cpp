// xlme-export end to end, and parity with the pure PyTorch reference: a tiny model of each
// architecture variant is trained a few steps and perturbed (so that LayerNorm, biases and gates
// are far from their initial values), saved by the trainer, exported by the binary, and run on a
// padded batch by C++ and by XLME_PYTHON scripts/xlme_reference.py, which reads the export
// with its own numpy safetensors reader (its command line, every variant in one process). Every
// hidden state (embeddings and each layer) must agree to 1e-4 at the real positions.
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"

#include "export_fixtures.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

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

  // Exports a checkpoint of the variant into `dir`, runs it on a padded batch in C++ (the generator
  // where the variant exports it, the discriminator otherwise) and returns the xlme_reference.py
  // case that compares the same batch (null when the export failed); `state_count` gets the
  // number of hidden states.
  static nlohmann::json prepare(const ExportVariant& variant, const fs::path& dir,
                                size_t* state_count) {
    const std::string& name = variant.name;
    const std::vector<std::string>& export_args = variant.export_args;
    const std::string encoder =
        xlme::testing::exports_generator(variant) ? "generator" : "discriminator";
    const auto config = xlme::testing::tiny_export_config(*tokenizer_, variant.overrides);
    auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
    std::vector<std::string> args{"--checkpoint", checkpoint.path, "--out", dir / "export"};
    args.insert(args.end(), export_args.begin(), export_args.end());
    const auto run = run_tool("xlme-export", args);
    EXPECT_EQ(run.code, 0) << name << ": " << run.err;
    if (run.code != 0) return nullptr;

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
    *state_count = states.size();
    return {{"name", name},
            {"args",
             {"--model", dir / "export", "--encoder", encoder, "--inputs",
              dir / "inputs.safetensors", "--compare", dir / "expected.safetensors", "--tolerance",
              std::to_string(kParityTolerance)}}};
  }

  // Every variant's export against scripts/xlme_reference.py, run as its command line runs it but
  // all in one process (tests/python/run_reference_cases.py); each variant is checked on its own:
  // exit code 0 and every hidden state within kParityTolerance of the C++ model's.
  static void check_variants(const std::vector<ExportVariant>& variants) {
    TempDir dir;
    nlohmann::json cases = nlohmann::json::array();
    std::map<std::string, size_t> state_counts;
    for (const auto& variant : variants) {
      auto c = prepare(variant, dir / variant.name, &state_counts[variant.name]);
      if (!c.is_null()) cases.push_back(std::move(c));
    }
    xlme::testing::write_file(dir / "cases.json", cases.dump(2));
    const auto [code, out] =
        shell("cd " + quote(XLME_SOURCE_DIR) + " && " + quote(kReferencePython) +
              " tests/python/run_reference_cases.py " + quote(dir / "cases.json"));
    ASSERT_EQ(code, 0) << out;
    std::set<std::string> reported;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("{\"case\": ", 0) != 0) continue;
      const auto result = nlohmann::json::parse(line);
      const std::string name = result["case"];
      const std::string output = result["output"];
      reported.insert(name);
      EXPECT_EQ(result["code"], 0) << name << ":\n" << output;
      std::smatch match;
      const bool parsed = std::regex_search(output, match, std::regex(R"(\{"max_abs_diff": .*\})"));
      EXPECT_TRUE(parsed) << name << ":\n" << output;
      if (!parsed) continue;
      const auto diffs =
          nlohmann::json::parse(match[0].str())["max_abs_diff"].get<std::vector<double>>();
      std::cout << "[ parity   ] " << name << ": max |diff| per hidden state "
                << nlohmann::json(diffs) << std::endl;
      EXPECT_EQ(diffs.size(), state_counts.at(name)) << name;
      for (size_t i = 0; i < diffs.size(); ++i) {
        EXPECT_LE(diffs[i], kParityTolerance) << name << " hidden state " << i;
      }
    }
    for (const auto& c : cases) {
      EXPECT_TRUE(reported.count(c["name"].get<std::string>())) << c["name"] << ":\n" << out;
    }
  }

  static TempDir* dir_;
  static std::string* tokenizer_;
};
TempDir* ExportParity::dir_ = nullptr;
std::string* ExportParity::tokenizer_ = nullptr;

// Each variant of export_variants(); a bf16 export runs the same bf16-rounded weights in fp32 on
// both sides.
TEST_F(ExportParity, EveryVariantMatchesTheReference) {
  check_variants(xlme::testing::export_variants());
}

TEST_F(ExportParity, DistilledStudent) {
  // A student half as wide as its teacher (objectives.set=distill): the encoder alone, exported
  // and loaded like any discriminator; the teacher is not part of it.
  TempDir dir;
  const auto teacher = xlme::testing::make_tiny_checkpoint(
      xlme::testing::tiny_export_config(*tokenizer_, {}), dir / "teacher");
  check_variants({{"DistilledStudent",
                   "distilled student",
                   {"objectives.set=distill", "distill.teacher=" + teacher.path,
                    "distill.relation_heads=4", "model.hidden_size=16"},
                   {}}});
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
  // A run folder stands for its newest valid checkpoint.
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
