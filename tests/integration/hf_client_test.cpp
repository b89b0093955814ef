// What a HuggingFace user does with an export beyond loading the encoder
// (docs/export.md#loading-an-export-with-huggingface-transformers): tiny trained checkpoints are
// exported by the binary (one with the generator in xlme's own vocabulary layout, one in XLM-R's
// with a BPE SentencePiece model, the masked-LM baseline's) and tests/python/test_hf_client.py, run
// once and offline by the project's Python (XLME_PYTHON), checks the masked-LM and pre-training
// heads against the C++ model's logits, padding-side independence, the fast tokenizer against the
// C++ tokenizer's ids (hostile text included) and transformers' Trainer; each check is asserted on
// its own. xlme's own encoder is checked for padding-side independence here too.
#include "xlme/checkpoint/export_folder.h"
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/data/tokenizer.h"
#include "xlme/export/transformers.h"

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
using checkpoint::PretrainedOptions;
using checkpoint::SafetensorsContent;
using checkpoint::write_safetensors;
using xlme::testing::quote;
using xlme::testing::read_file;
using xlme::testing::run_tool;
using xlme::testing::shell;
using xlme::testing::TempDir;

constexpr double kTolerance = 1e-4;

// The tokenizer's texts: words of the tiny models' letters, the C++ tokenizer tests' probes and
// text that SentencePiece's normalization rewrites (spaces, NFKC forms, combining marks, control
// and zero-width characters, U+2581 itself, characters no piece holds).
const std::vector<std::string> kTokenizerTexts = {
    "the quick brown fox",
    "Zürich 42 ☃ abc",
    "das grüne Haus über den Fluss",
    "дом и река над городом",
    "μικρό σπίτι και νερό",
    "unseen 漢字",
    "Licht und Wasser ñ",
    "  leading, inner   and trailing spaces  ",
    "ＦＵＬＬ ｗｉｄｔｈ ① ﬁ ﬂ Ⅻ",
    "e\u0301 cafe\u0301 cafe\u0301\u0301",
    "tab\there\u00a0nbsp\u3000ideographic",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "\u2581already \u2581\u2581marked\u2581",
    "emoji 👍🏽 👨‍👩‍👧 ok",
    "a",
    "",
    " ",
};

// Writes the C++ tokenizer's ids of every text.
nlohmann::json cpp_tokens(const std::string& model, data::VocabLayout layout) {
  const data::Tokenizer tokenizer(model, layout);
  nlohmann::json tokens = {{"texts", kTokenizerTexts}, {"ids", nlohmann::json::array()}};
  for (const auto& text : kTokenizerTexts) tokens["ids"].push_back(tokenizer.encode(text));
  return tokens;
}

// The rows of right-padded `ids` ([B, T], `padding` true at <pad>) with the padding on the left.
std::pair<torch::Tensor, torch::Tensor> left_padded(const torch::Tensor& ids,
                                                    const torch::Tensor& padding, int64_t pad) {
  auto out = torch::full_like(ids, pad);
  auto left = torch::ones_like(padding);
  const int64_t length = ids.size(1);
  for (int64_t row = 0; row < ids.size(0); ++row) {
    const int64_t real = length - padding[row].sum().item<int64_t>();
    out[row].narrow(0, length - real, real).copy_(ids[row].narrow(0, 0, real));
    left[row].narrow(0, length - real, real).fill_(false);
  }
  return {out, left};
}

// The report of test_hf_client.py's `check`, expected to have passed.
void expect_passed(const nlohmann::json& report, const char* check) {
  ASSERT_TRUE(report.contains(check)) << report.dump();
  const auto& r = report[check];
  EXPECT_TRUE(r.value("ok", false)) << check << ": " << r.dump(2);
}

// One test (three small exports, one Python process: importing torch and transformers takes
// seconds), each check asserted on its own:
//   masked_lm: AutoModelForMaskedLM is the generator with its head (the masked-LM baseline's
//     encoder with its MLM head) and pipeline("fill-mask") ranks as its logits do;
//     AutoModelForPreTraining is the discriminator with its replaced-token head; all give the
//     C++ logits within 1e-4. Without the generator, AutoModelForMaskedLM says how to get it.
//   padding: left and right padding give the same outputs (position ids from the attention mask);
//     pad ids without an attention_mask give transformers' own warning. xlme's own
//     DiscriminatorModel is checked the same way here.
//   tokenizer: the export's tokenizer.json gives the C++ tokenizer's ids in both layouts,
//     word_ids() and offsets; the token-classification pipeline gives spans.
//   trainer: transformers' Trainer (accelerate pinned in requirements.txt) fine-tunes the token
//     head; saved and reloaded, it predicts the same.
TEST(HfClient, HeadsPaddingFastTokenizerAndTrainer) {
  TempDir dir;
  const auto own = xlme::testing::train_tiny_tokenizer(dir / "tok");
  const auto config = xlme::testing::tiny_export_config(
      own, {"model.generator.hidden_size=16", "model.generator.heads=2"});
  const auto checkpoint = xlme::testing::make_tiny_checkpoint(config, dir / "run");
  auto run = run_tool("xlme-export", {"--checkpoint", checkpoint.path, "--out", dir / "export",
                                      "--with-generator"});
  ASSERT_EQ(run.code, 0) << run.err;

  // XLM-R's layout: spm_train's default ids (<unk>=0, <s>=1, </s>=2), a BPE model, as
  // sentencepiece.bpe.model.
  const auto [spm_code, spm_out] =
      shell("spm_train --input=" + quote(dir / "tok/corpus/mono/xx.txt") +
            " --model_prefix=" + quote(dir / "xlmr") + " --vocab_size=70 --model_type=bpe");
  ASSERT_EQ(spm_code, 0) << spm_out;
  auto xlmr = xlme::testing::tiny_export_config(own, {});
  xlmr.data.tokenizer = dir / "xlmr.model";
  xlmr.data.vocab_layout = "xlmr";
  xlmr.model.vocab_size =
      data::Tokenizer(dir / "xlmr.model", data::VocabLayout::kXlmr).vocab_size();
  const auto xlmr_checkpoint = xlme::testing::make_tiny_checkpoint(xlmr, dir / "xlmr-run");
  run =
      run_tool("xlme-export", {"--checkpoint", xlmr_checkpoint.path, "--out", dir / "xlmr-export"});
  ASSERT_EQ(run.code, 0) << run.err;
  // The masked-LM baseline, whose encoder and MLM head are AutoModelForMaskedLM too.
  const auto mlm_checkpoint = xlme::testing::make_tiny_checkpoint(
      xlme::testing::tiny_export_config(own, {"objectives.set=mlm"}), dir / "mlm-run");
  run = run_tool("xlme-export", {"--checkpoint", mlm_checkpoint.path, "--out", dir / "mlm-export",
                                 "--with-generator"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_TRUE(fs::is_regular_file(fs::path(dir / "export") / kTokenizerJsonFile));
  EXPECT_TRUE(fs::is_regular_file(fs::path(dir / "xlmr-export") / kTokenizerJsonFile));

  PretrainedOptions options;
  options.with_generator = true;
  Pretrained p = load_pretrained(dir / "export", options);
  Pretrained baseline = load_pretrained(dir / "mlm-export", options);
  const auto batch = xlme::testing::parity_batch(p.special_ids, /*length=*/24);
  SafetensorsContent expected;
  {
    torch::NoGradGuard no_grad;
    const auto generated = p.electra->generator(batch.ids, batch.positions, batch.padding);
    const auto& table = p.electra->embeddings->token->weight;
    const auto hidden = p.discriminator->forward(batch.ids, {}, batch.padding);
    expected.tensors = {
        {"input_ids", batch.ids},
        {"padding", batch.padding},
        {"gen_logits", p.electra->generator_head(generated, table)},
        {"rtd_logits", p.discriminator->rtd_logits(hidden)},
        {"mlm_logits",
         baseline.electra->mlm_head(baseline.discriminator->forward(batch.ids, {}, batch.padding),
                                    baseline.electra->embeddings->token->weight)}};
    // xlme's own encoder on the same rows padded on the left, at the real tokens.
    const auto [ids, padding] = left_padded(batch.ids, batch.padding, p.special_ids.pad);
    const auto left = p.discriminator->forward(ids, {}, padding);
    const double diff =
        (left.index({padding.logical_not()}) - hidden.index({batch.padding.logical_not()}))
            .abs()
            .max()
            .item<double>();
    EXPECT_LE(diff, 1e-5) << "xlme's DiscriminatorModel: left padding changes the outputs";
  }
  write_safetensors(dir / "expected.safetensors", expected);
  const nlohmann::json tokens = {
      {"own", cpp_tokens(own, data::VocabLayout::kOwn)},
      {"xlmr", cpp_tokens(dir / "xlmr.model", data::VocabLayout::kXlmr)}};
  xlme::testing::write_file(dir / "tokens.json", tokens.dump());

  const auto [code, out] =
      shell("cd " + quote(XLME_SOURCE_DIR) + " && " + quote(XLME_PYTHON) +
            " tests/python/test_hf_client.py --model " + quote(dir / "export") + " --xlmr-model " +
            quote(dir / "xlmr-export") + " --mlm-model " + quote(dir / "mlm-export") +
            " --expected " + quote(dir / "expected.safetensors") + " --tokens " +
            quote(dir / "tokens.json") + " --tolerance " + std::to_string(kTolerance));
  std::smatch match;
  ASSERT_TRUE(std::regex_search(out, match, std::regex(R"(\{"transformers": .*\})")))
      << "test_hf_client.py printed no report (exit code " << code << "):\n"
      << out;
  const auto report = nlohmann::json::parse(match[0].str());
  std::cout << "[ hf       ] " << report.dump() << std::endl;
  EXPECT_EQ(code, 0) << out;
  for (const char* check : {"masked_lm", "padding", "tokenizer", "trainer"}) {
    expect_passed(report, check);
  }
  if (report.contains("masked_lm") && report["masked_lm"].value("ok", false)) {
    EXPECT_LE(report["masked_lm"]["generator_logits"].get<double>(), kTolerance);
    EXPECT_LE(report["masked_lm"]["rtd_logits"].get<double>(), kTolerance);
    EXPECT_LE(report["masked_lm"]["mlm_baseline_logits"].get<double>(), kTolerance);
  }
}

}  // namespace
}  // namespace xlme::export_
