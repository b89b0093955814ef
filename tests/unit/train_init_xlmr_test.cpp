// --init-from with a HuggingFace XLM-R checkpoint folder: a tiny XLM-R-shaped model.safetensors
// written here (RoBERTa's names with the "roberta." prefix, positions from row 2, one token type,
// a pooler and an LM head) maps onto the discriminator and the shared embeddings; the relative
// bias, the gates and the generator keep their initialization, and the report says so.
#include "xlme/checkpoint/safetensors.h"
#include "xlme/checkpoint/weights.h"
#include "xlme/train/init.h"

#include "hostile_fixtures.h"
#include "memory_fixtures.h"
#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::TempDir;

// XLM-R's tensors for a model of `c`'s sizes, random.
std::map<std::string, torch::Tensor> tiny_xlmr_tensors(const config::ModelConfig& m) {
  torch::manual_seed(5);
  const int64_t h = m.hidden_size, f = m.ffn_size;
  std::map<std::string, torch::Tensor> t = {
      {"roberta.embeddings.word_embeddings.weight", torch::randn({m.vocab_size, h})},
      {"roberta.embeddings.position_embeddings.weight", torch::randn({m.max_positions + 2, h})},
      {"roberta.embeddings.token_type_embeddings.weight", torch::randn({1, h})},
      {"roberta.embeddings.LayerNorm.weight", torch::randn({h})},
      {"roberta.embeddings.LayerNorm.bias", torch::randn({h})},
      {"roberta.pooler.dense.weight", torch::randn({h, h})},
      {"lm_head.dense.weight", torch::randn({h, h})}};
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "roberta.encoder.layer." + std::to_string(i) + ".";
    for (const char* p :
         {"attention.self.query.", "attention.self.key.", "attention.self.value.",
          "attention.output.dense.", "attention.output.LayerNorm.", "output.LayerNorm."}) {
      const bool square = std::string(p).find("LayerNorm") == std::string::npos;
      t[l + p + "weight"] = square ? torch::randn({h, h}) : torch::randn({h});
      t[l + p + "bias"] = torch::randn({h});
    }
    t[l + "intermediate.dense.weight"] = torch::randn({f, h});
    t[l + "intermediate.dense.bias"] = torch::randn({f});
    t[l + "output.dense.weight"] = torch::randn({h, f});
    t[l + "output.dense.bias"] = torch::randn({h});
  }
  return t;
}

TEST(InitFromXlmr, MapsNamesFoldsPositionsAndReports) {
  TempDir dir;
  auto c = xlme::testing::tiny_train_config(4, 1, 0.0);
  c.model.layers = 2;
  const auto hf = tiny_xlmr_tensors(c.model);
  const std::string folder = dir / "xlmr";
  xlme::testing::write_file(
      folder + "/config.json",
      R"({"model_type": "xlm-roberta", "architectures": ["XLMRobertaForMaskedLM"]})");
  checkpoint::SafetensorsContent content;
  content.tensors = hf;
  checkpoint::write_safetensors(folder + "/model.safetensors", content);

  const auto weights = init_source_weights(folder);
  auto model = xlme::testing::make_tiny_model(c, 2);
  const auto untouched = xlme::testing::make_tiny_model(c, 2);
  const InitReport report = init_weights(model, weights, "all", folder);

  // 1 token table + 1 position table + the embedding LayerNorm (2) + 16 tensors per layer.
  EXPECT_EQ(report.matched.size(), 4u + 16u * 2u);
  EXPECT_EQ(report.unexpected,
            (std::vector<std::string>{"lm_head.dense.weight", "pooler.dense.weight"}));
  const auto params = model->named_parameters();
  auto expect_from = [&](const std::string& xlme_name, const std::string& hf_name) {
    EXPECT_TRUE(torch::equal(params[xlme_name], hf.at(hf_name))) << xlme_name << " <- " << hf_name;
  };
  expect_from("embeddings.token.weight", "roberta.embeddings.word_embeddings.weight");
  expect_from("discriminator.embedding_norm.bias", "roberta.embeddings.LayerNorm.bias");
  expect_from("discriminator.layers.1.attention.key.weight",
              "roberta.encoder.layer.1.attention.self.key.weight");
  expect_from("discriminator.layers.1.attention.output.bias",
              "roberta.encoder.layer.1.attention.output.dense.bias");
  expect_from("discriminator.layers.0.attention_norm.weight",
              "roberta.encoder.layer.0.attention.output.LayerNorm.weight");
  expect_from("discriminator.layers.1.ffn.intermediate.weight",
              "roberta.encoder.layer.1.intermediate.dense.weight");
  expect_from("discriminator.layers.1.ffn.output.weight",
              "roberta.encoder.layer.1.output.dense.weight");
  expect_from("discriminator.layers.1.ffn_norm.bias",
              "roberta.encoder.layer.1.output.LayerNorm.bias");
  // Position i of xlme is XLM-R's position i + 2 plus its only token type.
  const auto& positions = hf.at("roberta.embeddings.position_embeddings.weight");
  const auto expected_positions = positions.narrow(0, 2, c.model.max_positions) +
                                  hf.at("roberta.embeddings.token_type_embeddings.weight")[0];
  EXPECT_TRUE(torch::allclose(params["embeddings.position.weight"], expected_positions, 0, 0));

  // What XLM-R has not: at initialization, named in the report.
  const auto before = untouched->named_parameters();
  for (const char* name :
       {"discriminator.layers.0.attention.relative_bias", "discriminator.layers.1.attention.gate_u",
        "discriminator_head.dense.weight", "generator.layers.0.ffn.output.weight"}) {
    EXPECT_TRUE(torch::equal(params[name], before[name])) << name;
    EXPECT_NE(std::find(report.missing.begin(), report.missing.end(), name), report.missing.end())
        << name;
  }
  EXPECT_TRUE(contains_all(format_report(report, folder, "all"),
                           {"36 tensors loaded", "missing there (kept at initialization)",
                            "discriminator.layers.0.attention.relative_bias",
                            "unexpected (ignored): lm_head.dense.weight, pooler.dense.weight"}));

  // A model of other sizes: the shape error names the key.
  auto wide = c;
  wide.model.ffn_size = 48;
  auto other = xlme::testing::make_tiny_model(wide, 2);
  EXPECT_TRUE(contains_all(
      error_message([&] { init_weights(other, weights, "all", folder); }),
      {"discriminator.layers.0.ffn.intermediate.bias", "shape [64] there but [48] in this model"}));
}

// What the file declares is checked against the model before anything is read: a tensor the model
// lacks is never read (an extra one declared as 8 GiB on a sparse file costs nothing) and is
// reported as unexpected; a table larger than the model's or of another type is refused by name.
TEST(InitFromXlmr, ChecksWhatTheFileDeclaresAgainstTheModelBeforeReading) {
  TempDir dir;
  auto c = xlme::testing::tiny_train_config(4, 1, 0.0);
  c.model.layers = 2;
  const std::string folder = dir / "xlmr";
  xlme::testing::write_file(folder + "/config.json", R"({"model_type": "xlm-roberta"})");
  const std::string file = folder + "/model.safetensors";
  auto write = [&](std::map<std::string, torch::Tensor> tensors) {
    checkpoint::SafetensorsContent content;
    content.tensors = std::move(tensors);
    checkpoint::write_safetensors(file, content);
  };
  write(tiny_xlmr_tensors(c.model));
  xlme::testing::declare_unwritten_tensor(file, "lm_head.decoder.weight", int64_t{1} << 31);
  auto model = xlme::testing::make_tiny_model(c, 2);
  const auto expected = checkpoint::weight_specs(*model);
  const int64_t before = xlme::testing::peak_rss_mib();
  const auto weights = init_source_weights(folder, expected);
  EXPECT_LT(xlme::testing::peak_rss_mib() - before, 256) << "the 8 GiB tensor was read";
  const InitReport report = init_weights(model, weights, "all", folder);
  EXPECT_EQ(report.matched.size(), 4u + 16u * 2u);
  EXPECT_EQ(report.unexpected,
            (std::vector<std::string>{"lm_head.decoder.weight", "lm_head.dense.weight",
                                      "pooler.dense.weight"}));
  // The same tensors read with and without the model's shapes.
  const auto unbounded = tiny_xlmr_tensors(c.model);
  EXPECT_TRUE(torch::equal(weights.at("discriminator.layers.1.ffn.output.weight"),
                           unbounded.at("roberta.encoder.layer.1.output.dense.weight")));

  // A token table declared larger than the model's: refused from the header, naming it.
  auto tensors = tiny_xlmr_tensors(c.model);
  tensors["roberta.embeddings.word_embeddings.weight"] =
      torch::zeros({c.model.vocab_size + 1, c.model.hidden_size});
  write(tensors);
  EXPECT_TRUE(contains_all(
      error_message([&] { init_source_weights(folder, expected); }),
      {"--init-from " + file,
       "roberta.embeddings.word_embeddings.weight has shape [" +
           std::to_string(c.model.vocab_size + 1) + ", ",
       "this model's embeddings.token.weight is [" + std::to_string(c.model.vocab_size) + ", "}));
  // An integer table where floats are expected.
  tensors = tiny_xlmr_tensors(c.model);
  tensors["roberta.encoder.layer.0.output.dense.weight"] =
      tensors["roberta.encoder.layer.0.output.dense.weight"].to(torch::kInt64);
  write(tensors);
  EXPECT_TRUE(contains_all(
      error_message([&] { init_source_weights(folder, expected); }),
      {"roberta.encoder.layer.0.output.dense.weight is stored as Long", "F32, F16 or BF16"}));
}

TEST(InitFromXlmr, NamesWhatIsMissing) {
  TempDir dir;
  const std::string folder = dir / "xlmr";
  xlme::testing::write_file(folder + "/config.json", R"({"model_type": "xlm-roberta"})");
  xlme::testing::write_file(folder + "/pytorch_model.bin", "not read");
  EXPECT_TRUE(contains_all(error_message([&] { init_source_weights(folder); }),
                           {"--init-from " + folder, "no model.safetensors there",
                            "pytorch_model.bin cannot be read here"}));
}

}  // namespace
}  // namespace xlme::train
