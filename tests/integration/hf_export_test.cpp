// HuggingFace `transformers` loads an xlme export: for each variant of the reference-parity test
// (export_parity_test.cpp), a tiny trained checkpoint is exported by the binary and
// tests/python/test_hf_export.py builds it through AutoConfig / AutoModel.from_config
// (trust_remote_code) from the folder, with the weights read by the reference loader's
// safetensors reader (and AutoModel.from_pretrained where the `safetensors` package imports).
// Every hidden state must equal the C++ encoder's within 1e-4 at the real positions; the
// sequence, token and QA heads train one step; AutoTokenizer gives the C++ tokenizer's ids.
// transformers 4.29.2 comes from ../shared/peer (XLME_PEER_DIR overrides), unpacked into the
// build folder once; the test skips only where those sources are absent.
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/data/tokenizer.h"

#include "export_fixtures.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
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

constexpr const char* kHfPython = "/usr/bin/python3";
constexpr double kHfTolerance = 1e-4;
constexpr const char* kTransformersArchive = "transformers-4.29.2-src.tar.xz";
constexpr const char* kHubArchive = "huggingface_hub-0.14.1-src.tar.xz";

// PYTHONPATH with transformers' and huggingface_hub's sources, unpacked from the peer's archives
// into <build>/peer once (under a temporary name, then renamed: parallel tests race safely).
// Empty, with `why` set, where the archives are absent.
std::string prepare_transformers(std::string& why) {
  const char* env = std::getenv("XLME_PEER_DIR");
  const fs::path peer = env ? fs::path(env) : fs::path(XLME_SOURCE_DIR) / ".." / "shared" / "peer";
  if (!fs::is_regular_file(peer / kTransformersArchive) ||
      !fs::is_regular_file(peer / kHubArchive)) {
    why = "no " + std::string(kTransformersArchive) + " and " + kHubArchive + " in " +
          peer.string() +
          " (../shared/peer beside the checkout, or XLME_PEER_DIR): the transformers export test "
          "needs transformers 4.29.2's sources";
    return "";
  }
  const fs::path dest = fs::path(XLME_BINARY_DIR) / "peer";
  const fs::path marker = dest / "transformers-4.29.2" / "src" / "transformers" / "__init__.py";
  if (!fs::exists(marker)) {
    const fs::path tmp = dest.string() + ".tmp-" + std::to_string(::getpid());
    fs::create_directories(tmp);
    for (const char* archive : {kTransformersArchive, kHubArchive}) {
      const auto [code, out] =
          shell("tar -xJf " + quote(peer / archive) + " -C " + quote(tmp.string()));
      if (code != 0) {
        why = "cannot unpack " + (peer / archive).string() + ": " + out;
        return "";
      }
    }
    std::error_code ec;
    fs::rename(tmp, dest, ec);  // fails where another test got there first
    fs::remove_all(tmp, ec);
  }
  return (dest / "transformers-4.29.2" / "src").string() + ":" +
         (dest / "huggingface_hub-0.14.1" / "src").string();
}

// Text in the tiny tokenizer's letters, plus characters it has never seen (<unk>).
const std::vector<std::string> kTexts = {"the quick brown fox", "Zürich 42 ☃ abc", "a"};

class TransformersExport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
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

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(setup_.check());
    std::string why;
    pythonpath_ = prepare_transformers(why);
    if (pythonpath_.empty()) GTEST_SKIP() << why;
    const auto [code, out] = shell("PYTHONPATH=" + quote(pythonpath_) + " " + kHfPython +
                                   " -c 'import torch, numpy, sentencepiece, transformers'");
    ASSERT_EQ(code, 0) << kHfPython
                       << " cannot import torch, numpy, sentencepiece and transformers (with its "
                          "dependencies), which the transformers export test needs; run "
                          "scripts/setup.sh (it installs the Debian packages):\n"
                       << out;
  }

  // Exports a checkpoint of the variant, runs the C++ encoder and the transformers checks on a
  // padded batch; returns the largest |difference| per hidden state (from_config). With a
  // generator exported too, the transformers model ignores its tensors.
  std::vector<double> check(const ExportVariant& variant, bool xlmr_layout = false) {
    const std::string& name = variant.label;
    const std::vector<std::string>& export_args = variant.export_args;
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
    args.insert(args.end(), export_args.begin(), export_args.end());
    const auto run = run_tool("xlme-export", args);
    EXPECT_EQ(run.code, 0) << run.err;
    if (run.code != 0) return {};

    Pretrained p = load_pretrained(dir / "export");
    const auto batch = parity_batch(p.special_ids, /*length=*/24);
    std::vector<torch::Tensor> states;
    {
      torch::NoGradGuard no_grad;
      states =
          p.discriminator->discriminator->hidden_states(batch.ids, batch.positions, batch.padding);
    }
    SafetensorsContent inputs, expected;
    inputs.tensors = {
        {"input_ids", batch.ids}, {"positions", batch.positions}, {"padding", batch.padding}};
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
        "cd " + quote(XLME_SOURCE_DIR) + " && PYTHONPATH=" + quote(pythonpath_) + " " + kHfPython +
        " tests/python/test_hf_export.py --model " + quote(dir / "export") + " --inputs " +
        quote(dir / "inputs.safetensors") + " --expected " + quote(dir / "expected.safetensors") +
        " --tokens " + quote(dir / "tokens.json") + " --tolerance " + std::to_string(kHfTolerance));
    EXPECT_EQ(code, 0) << out;
    std::smatch match;
    const bool parsed = std::regex_search(out, match, std::regex(R"(\{"transformers": .*\})"));
    EXPECT_TRUE(parsed) << out;
    if (!parsed) return {};
    const auto report = nlohmann::json::parse(match[0].str());
    const auto diffs = report["max_abs_diff"].get<std::vector<double>>();
    std::cout << "[ hf       ] " << name << ": " << report.dump() << std::endl;
    EXPECT_EQ(diffs.size(), states.size());
    for (size_t i = 0; i < diffs.size(); ++i) {
      EXPECT_LE(diffs[i], kHfTolerance) << name << " hidden state " << i;
    }
    return diffs;
  }

  std::string pythonpath_;
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
