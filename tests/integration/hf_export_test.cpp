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
#include <regex>

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
const std::vector<std::string> kTexts = {"the quick brown fox", "Zürich 42 ☃ abc", "a"};

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
      const auto [python_code, python_out] =
          shell(quote(XLME_PYTHON) +
                " -c 'import torch, numpy, sentencepiece, safetensors, transformers'");
      XLME_CHECK(python_code == 0,
                 "XLME_PYTHON={} cannot import torch, numpy, sentencepiece, safetensors and "
                 "transformers, which the transformers export test needs: run scripts/setup.sh (it "
                 "installs requirements.txt into .venv), or configure with -DXLME_PYTHON=<a python "
                 "with them>:\n{}",
                 XLME_PYTHON, python_out);
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

  // Exports a checkpoint of the variant, runs the C++ encoder and the fine-tuning heads on a padded
  // batch, and test_hf_export.py on the export. With a generator exported too, the transformers
  // model ignores its tensors.
  void check(const ExportVariant& variant, bool xlmr_layout = false) {
    const std::string& name = variant.label;
    TempDir dir;
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
    ASSERT_EQ(run.code, 0) << run.err;

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
        write_finetuned_folder(dir.path() / "export", dir.path() / "heads" / head.kind, model,
                               head.classes);
      }
    }
    for (size_t i = 0; i < states.size(); ++i) {
      expected.tensors["hidden." + std::to_string(i)] = states[i];
    }
    write_safetensors(dir / "inputs.safetensors", inputs);
    write_safetensors(dir / "expected.safetensors", expected);
    const data::Tokenizer tokenizer(p.tokenizer_path, data::parse_vocab_layout(p.vocab_layout));
    nlohmann::json tokens = {{"texts", kTexts}, {"ids", nlohmann::json::array()}};
    for (const auto& text : kTexts) tokens["ids"].push_back(tokenizer.encode(text));
    xlme::testing::write_file(dir / "tokens.json", tokens.dump());

    const auto [code, out] = shell(
        "cd " + quote(XLME_SOURCE_DIR) + " && " + quote(XLME_PYTHON) +
        " tests/python/test_hf_export.py --model " + quote(dir / "export") + " --inputs " +
        quote(dir / "inputs.safetensors") + " --expected " + quote(dir / "expected.safetensors") +
        " --heads " + quote(dir / "heads") + " --tokens " + quote(dir / "tokens.json") +
        " --tolerance " + std::to_string(kHfTolerance));
    EXPECT_EQ(code, 0) << out;
    std::smatch match;
    const bool parsed = std::regex_search(out, match, std::regex(R"(\{"transformers": .*\})"));
    ASSERT_TRUE(parsed) << out;
    const auto report = nlohmann::json::parse(match[0].str());
    std::cout << "[ hf       ] " << name << ": " << report.dump() << std::endl;
    for (const char* path : {"from_pretrained", "from_config"}) {
      const auto diffs = report[path].get<std::vector<double>>();
      EXPECT_EQ(diffs.size(), states.size()) << path;
      for (size_t i = 0; i < diffs.size(); ++i) {
        EXPECT_LE(diffs[i], kHfTolerance) << name << " " << path << " hidden state " << i;
      }
    }
    for (const auto& head : kHeads) {
      ASSERT_TRUE(report["head_logits"].contains(head.kind)) << head.kind;
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

// Each variant of export_variants().
class TransformersExportOfVariant : public TransformersExport,
                                    public ::testing::WithParamInterface<ExportVariant> {};

TEST_P(TransformersExportOfVariant, MatchesTheCppEncoder) {
  check(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Variants, TransformersExportOfVariant,
                         ::testing::ValuesIn(xlme::testing::export_variants()),
                         xlme::testing::export_variant_name);

TEST_F(TransformersExport, XlmrVocabularyLayout) {
  check({"XlmrVocabularyLayout", "xlmr layout", {}, {}}, /*xlmr_layout=*/true);
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
