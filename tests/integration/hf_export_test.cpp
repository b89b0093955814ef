// HuggingFace `transformers` loads an xlme export as its users load it: for each variant of the
// reference-parity test (export_parity_test.cpp), a tiny trained checkpoint is exported by the
// binary and tests/python/test_hf_export.py, run offline by the project's Python (XLME_PYTHON: the
// transformers and safetensors of requirements.txt), calls AutoModel.from_pretrained and
// AutoTokenizer.from_pretrained(trust_remote_code=True) on the export folder itself. Every hidden
// state must equal the C++ encoder's within 1e-4 at the real positions (also through from_config
// and the reference's own safetensors reader); the sequence, token and QA heads train one step
// from the export; each head, fine-tuned by xlme's C++ FinetuneModel and written beside the export
// under its parameter names, loads through from_pretrained and gives the C++ model's logits within
// 1e-4; AutoTokenizer gives the C++ tokenizer's ids.
#include "xlme/checkpoint/export_folder.h"
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/data/tokenizer.h"
#include "xlme/finetune/model.h"

#include "export_fixtures.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace xlme::export_ {
namespace {

namespace fs = std::filesystem;
using checkpoint::load_pretrained;
using checkpoint::Pretrained;
using checkpoint::SafetensorsContent;
using checkpoint::write_safetensors;
using xlme::testing::contains_all;
using xlme::testing::ExportVariant;
using xlme::testing::parity_batch;
using xlme::testing::quote;
using xlme::testing::read_file;
using xlme::testing::run_tool;
using xlme::testing::shell;
using xlme::testing::TempDir;

constexpr double kHfTolerance = 1e-4;
// The N(0, std) of the fine-tuned heads' weights and biases: logits of order one, biases that
// count (a new head's are N(0, init_std) and zero).
constexpr double kHeadStd = 0.2;

// Text in the tiny tokenizer's letters, plus characters it has never seen (<unk>).
const std::vector<std::string> kExportTexts = {"the quick brown fox", "Zürich 42 ☃ abc", "a"};

// A fine-tuning head the test compares: the folder name test_hf_export.py reads, the head of
// xlme-finetune's FinetuneModel and its classes (extractive QA: a token head with start, end).
struct HeadCase {
  const char* kind;
  finetune::HeadKind head;
  int64_t classes;
};
constexpr HeadCase kHeads[] = {{"sequence", finetune::HeadKind::kSequence, 3},
                               {"token", finetune::HeadKind::kToken, 3},
                               {"qa", finetune::HeadKind::kToken, 2}};

// The export folder with the weights of the fine-tuned `model` (FinetuneModel's names:
// embeddings.*, discriminator.*, head.*; float32, as config.json then says) and its number of
// classes: a fine-tuned model as transformers loads it.
void write_finetuned_folder(const fs::path& export_dir, const fs::path& out,
                            const finetune::FinetuneModel& model, int64_t classes) {
  fs::create_directories(out.parent_path());
  fs::copy(export_dir, out, fs::copy_options::recursive);
  SafetensorsContent weights;
  weights.tensors = checkpoint::named_weights(*model);
  weights.metadata = {{"format", "pt"}};
  write_safetensors(out / checkpoint::kExportWeightsFile, weights);
  const auto config_path = out / checkpoint::kExportConfigFile;
  auto config = nlohmann::ordered_json::parse(read_file(config_path));
  config["dtype"] = config["torch_dtype"] = "float32";
  config["num_labels"] = classes;
  xlme::testing::write_file(config_path, config.dump(2));
}

class TransformersExport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      const std::string lacks = xlme::testing::python_lacks(
          XLME_PYTHON, "torch numpy sentencepiece safetensors transformers");
      XLME_CHECK(lacks.empty(), "{}", lacks);
      dir_ = new TempDir();
      own_tokenizer_ = new std::string(xlme::testing::train_tiny_tokenizer(*dir_ / "tok"));
      // XLM-R's layout: spm_train's default ids (<unk>=0, <s>=1, </s>=2), as
      // sentencepiece.bpe.model.
      xlmr_tokenizer_ = new std::string(*dir_ / "xlmr.model");
      const auto [code, out] =
          shell("spm_train --input=" + quote(*dir_ / "tok/corpus/mono/xx.txt") +
                " --model_prefix=" + quote(*dir_ / "xlmr") + " --vocab_size=70 --model_type=bpe");
      XLME_CHECK(code == 0, "spm_train failed: {}", out);
    });
  }
  static void TearDownTestSuite() {
    delete own_tokenizer_;
    delete xlmr_tokenizer_;
    delete dir_;
  }
  inline static xlme::testing::SuiteSetUp setup_;

  void SetUp() override { ASSERT_NO_FATAL_FAILURE(setup_.check()); }

  // Exports a checkpoint of the variant into `dir`, runs the C++ encoder and the fine-tuning heads
  // on a padded batch, and writes what test_hf_export.py compares; returns the case it reads
  // (null when the export failed). With a generator exported too, the transformers model ignores
  // its tensors.
  static nlohmann::json prepare(const ExportVariant& variant, const fs::path& dir, bool xlmr_layout,
                                size_t* state_count) {
    auto config = xlme::testing::tiny_export_config(*own_tokenizer_, variant.overrides);
    if (xlmr_layout) {
      config.data.tokenizer = *xlmr_tokenizer_;
      config.data.vocab_layout = "xlmr";
      config.model.vocab_size =
          data::Tokenizer(*xlmr_tokenizer_, data::VocabLayout::kXlmr).vocab_size();
    }
    const auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
    std::vector<std::string> args{"--checkpoint", checkpoint.path, "--out", dir / "export"};
    args.insert(args.end(), variant.export_args.begin(), variant.export_args.end());
    const auto run = run_tool("xlme-export", args);
    EXPECT_EQ(run.code, 0) << variant.name << ": " << run.err;
    if (run.code != 0) return nullptr;

    Pretrained p = load_pretrained(dir / "export");
    const auto batch = parity_batch(p.special_ids, /*length=*/24);
    SafetensorsContent inputs, expected;
    inputs.tensors = {
        {"input_ids", batch.ids}, {"positions", batch.positions}, {"padding", batch.padding}};
    std::vector<torch::Tensor> states;
    {
      torch::NoGradGuard no_grad;
      states =
          p.discriminator->discriminator->hidden_states(batch.ids, batch.positions, batch.padding);
      torch::manual_seed(17);
      for (const auto& head : kHeads) {
        finetune::FinetuneModel model(p.discriminator->embeddings, p.discriminator->discriminator,
                                      head.head, head.classes, /*dropout=*/0.1);
        for (auto& item : model->named_parameters()) {
          if (item.key().rfind("head.", 0) == 0) item.value().normal_(0.0, kHeadStd);
        }
        model->eval();
        expected.tensors[std::string("logits.") + head.kind] =
            model->forward(batch.ids, batch.positions, batch.padding);
        write_finetuned_folder(dir / "export", dir / "heads" / head.kind, model, head.classes);
      }
    }
    for (size_t i = 0; i < states.size(); ++i) {
      expected.tensors["hidden." + std::to_string(i)] = states[i];
    }
    *state_count = states.size();
    write_safetensors(dir / "inputs.safetensors", inputs);
    write_safetensors(dir / "expected.safetensors", expected);
    const data::Tokenizer tokenizer(p.tokenizer_path, data::parse_vocab_layout(p.vocab_layout));
    nlohmann::json tokens = {{"texts", kExportTexts}, {"ids", nlohmann::json::array()}};
    for (const auto& text : kExportTexts) tokens["ids"].push_back(tokenizer.encode(text));
    xlme::testing::write_file(dir / "tokens.json", tokens.dump());
    return {{"name", variant.name},
            {"model", dir / "export"},
            {"inputs", dir / "inputs.safetensors"},
            {"expected", dir / "expected.safetensors"},
            {"heads", dir / "heads"},
            {"tokens", dir / "tokens.json"}};
  }

  // One case's report from test_hf_export.py against the C++ side.
  static void check_report(const nlohmann::json& report, size_t state_count) {
    const std::string name = report["case"];
    std::cout << "[ hf       ] " << name << ": " << report.dump() << std::endl;
    ASSERT_FALSE(report.contains("error")) << name << ": " << report["error"].get<std::string>();
    for (const char* path : {"from_pretrained", "from_config"}) {
      const auto diffs = report[path].get<std::vector<double>>();
      EXPECT_EQ(diffs.size(), state_count) << name << " " << path;
      for (size_t i = 0; i < diffs.size(); ++i) {
        EXPECT_LE(diffs[i], kHfTolerance) << name << " " << path << " hidden state " << i;
      }
    }
    for (const auto& head : kHeads) {
      ASSERT_TRUE(report["head_logits"].contains(head.kind)) << name << " " << head.kind;
      EXPECT_LE(report["head_logits"][head.kind].get<double>(), kHfTolerance)
          << name << " " << head.kind << " head";
    }
  }

  static TempDir* dir_;
  static std::string* own_tokenizer_;
  static std::string* xlmr_tokenizer_;
};
TempDir* TransformersExport::dir_ = nullptr;
std::string* TransformersExport::own_tokenizer_ = nullptr;
std::string* TransformersExport::xlmr_tokenizer_ = nullptr;

// Each variant of export_variants(), and XLM-R's vocabulary layout, in one Python process (its
// imports cost more than the checks of a tiny export); each case is reported and asserted alone.
TEST_F(TransformersExport, EveryVariantMatchesTheCppModels) {
  TempDir dir;
  auto variants = xlme::testing::export_variants();
  variants.push_back({"XlmrVocabularyLayout", "xlmr layout", {}, {}});
  nlohmann::json cases = nlohmann::json::array();
  std::map<std::string, size_t> state_counts;
  for (const auto& variant : variants) {
    const bool xlmr_layout = variant.name == "XlmrVocabularyLayout";
    auto c = prepare(variant, dir / variant.name, xlmr_layout, &state_counts[variant.name]);
    if (!c.is_null()) cases.push_back(std::move(c));
  }
  xlme::testing::write_file(dir / "cases.json", cases.dump(2));
  const auto [code, out] =
      shell("cd " + quote(XLME_SOURCE_DIR) + " && " + quote(XLME_PYTHON) +
            " tests/python/test_hf_export.py --cases " + quote(dir / "cases.json") +
            " --tolerance " + std::to_string(kHfTolerance));
  EXPECT_EQ(code, 0) << out;
  std::set<std::string> reported;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"case\": ", 0) != 0) continue;
    const auto report = nlohmann::json::parse(line);
    reported.insert(report["case"].get<std::string>());
    check_report(report, state_counts.at(report["case"].get<std::string>()));
  }
  for (const auto& c : cases) {
    EXPECT_TRUE(reported.count(c["name"].get<std::string>())) << c["name"] << ":\n" << out;
  }
}

// Needs no transformers: what xlme-export writes for it.
TEST(TransformersExportFolder, ConfigNamesTheRemoteCodeCopiedFromTheRepository) {
  TempDir dir;
  const auto tokenizer_model = xlme::testing::train_tiny_tokenizer(dir / "tok");
  const auto config = xlme::testing::tiny_export_config(tokenizer_model, {});
  const auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
  const auto run = run_tool("xlme-export", {"--checkpoint", checkpoint.path, "--out", dir / "e"});
  ASSERT_EQ(run.code, 0) << run.err;
  const auto json = nlohmann::json::parse(read_file(dir / "e/config.json"));
  EXPECT_EQ(json["model_type"], "xlme");
  EXPECT_EQ(json["architectures"], nlohmann::json::array({"XlmeModel"}));
  EXPECT_EQ(json["auto_map"]["AutoModelForTokenClassification"],
            "modeling_xlme.XlmeForTokenClassification");
  EXPECT_EQ(json["format"], "xlme-export");  // still the reference loader's folder
  const auto tokenizer = nlohmann::json::parse(read_file(dir / "e/tokenizer_config.json"));
  EXPECT_EQ(tokenizer["vocab_layout"], "own");
  // The remote code is the repository's, byte for byte.
  for (const char* file : {"hf/configuration_xlme.py", "hf/modeling_xlme.py",
                           "hf/tokenization_xlme.py", "xlme_reference.py"}) {
    EXPECT_EQ(read_file(dir / "e" / fs::path(file).filename()),
              read_file(std::string(XLME_SOURCE_DIR) + "/scripts/" + file))
        << file;
  }
  EXPECT_TRUE(contains_all(read_file(dir / "e/README.md"),
                           {"AutoModel.from_pretrained(", "trust_remote_code=True"}));
  // A re-export of the export reads its own config.json back.
  const auto again = run_tool("xlme-export", {"--checkpoint", dir / "e", "--out", dir / "e2"});
  EXPECT_EQ(again.code, 0) << again.err;
}

}  // namespace
}  // namespace xlme::export_
