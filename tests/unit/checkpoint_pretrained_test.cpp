// Pre-trained weights from a checkpoint and from an export folder (strict: every mismatch is an
// error naming it), and the export folder itself: its files, config.json, the model card, dtype,
// the generator on request, and the refusal to overwrite.
#include "xlme/checkpoint/export_folder.h"
#include "xlme/checkpoint/pretrained.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/export/export.h"

#include "export_fixtures.h"
#include "hostile_fixtures.h"
#include "memory_fixtures.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <iterator>
#include <set>
#include <thread>

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

class PretrainedWeights : public xlme::testing::TinyCheckpointSuite<PretrainedWeights> {
 public:
  static constexpr double kPerturb = 0.1;
  // Two train records around the checkpoint's step 3, and a validation record.
  static void prepare() {
    write_file(suite_dir() / "run/metrics.jsonl",
               "{\"step\": 1, \"kind\": \"train\", \"total_loss\": 9.5}\n"
               "{\"step\": 3, \"kind\": \"train\", \"total_loss\": 7.25, \"accuracy/mlm\": 0.125}\n"
               "{\"step\": 3, \"kind\": \"validation\", \"loss/mlm\": 6.5}\n"
               "{\"step\": 5, \"kind\": \"train\", \"total_loss\": 1.0}\n"
               "{\"step\": 6, \"kind\"\n");
  }

 protected:
  // An export of the suite's checkpoint into a fresh folder of `dir`.
  static std::string exported(const TempDir& dir, bool with_generator = false,
                              const std::string& dtype = "fp32") {
    export_::ExportOptions o;
    o.checkpoint = checkpoint();
    o.out_dir = dir / "export";
    o.with_generator = with_generator;
    o.dtype = dtype;
    export_::export_model(o);
    return o.out_dir;
  }

  static void expect_discriminator_weights(Pretrained& p) {
    const auto expected = tiny_checkpoint().model->named_parameters();
    for (const auto& item : p.discriminator->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
    }
  }
};

TEST_F(PretrainedWeights, LoadsACheckpoint) {
  Pretrained p = load_pretrained(checkpoint());
  EXPECT_EQ(p.source, PretrainedSource::kCheckpoint);
  EXPECT_EQ(p.step, 3);
  EXPECT_EQ(p.tokens_seen, 3 * 2 * 2 * 16);  // 3 steps x 2 tasks x 2 rows x 16 tokens
  EXPECT_EQ(p.model.vocab_size, 80);
  EXPECT_EQ(p.special_ids.mask, 79);
  EXPECT_EQ(p.objective_set, "xlme");
  EXPECT_EQ(p.vocab_layout, "own");
  EXPECT_EQ(p.tokenizer_path, checkpoint() + "/tokenizer.model");
  ASSERT_TRUE(p.run_config.has_value());
  EXPECT_FALSE(p.discriminator->discriminator_head.is_empty());
  EXPECT_TRUE(p.electra.is_empty());
  expect_discriminator_weights(p);
  EXPECT_FALSE(p.discriminator->is_training());

  PretrainedOptions o;
  o.with_generator = true;
  p = load_pretrained(checkpoint(), o);
  xlme::testing::expect_same_parameters(p.electra, tiny_checkpoint().model, 0);
}

TEST_F(PretrainedWeights, LoadsAnExportInEitherDtype) {
  TempDir dir;
  Pretrained p = load_pretrained(exported(dir));
  EXPECT_EQ(p.source, PretrainedSource::kExport);
  EXPECT_EQ(p.step, 3);
  EXPECT_EQ(p.tokens_seen, 192);
  EXPECT_EQ(p.tokenizer_path, dir / "export/spm.model");
  EXPECT_FALSE(p.run_config.has_value());
  expect_discriminator_weights(p);
  EXPECT_TRUE(contains_all(
      error_message([&] {
        PretrainedOptions o;
        o.with_generator = true;
        load_pretrained(dir / "export", o);
      }),
      {"export '" + (dir / "export") + "' has no generator weights", "--with-generator"}));

  TempDir bf16_dir;
  p = load_pretrained(exported(bf16_dir, /*with_generator=*/false, "bf16"));
  EXPECT_EQ(p.dtype, "bfloat16");
  const auto expected = tiny_checkpoint().model->named_parameters();
  for (const auto& item : p.discriminator->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(
        torch::equal(item.value(), expected[item.key()].to(torch::kBFloat16).to(torch::kFloat32)))
        << item.key();
  }
}

TEST_F(PretrainedWeights, WritesTheExportFolder) {
  TempDir dir;
  const std::string out = exported(dir);
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(out)) files.insert(entry.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{
                       ".xlme-export", "README.md", "config.json", "configuration_xlme.py",
                       "model.safetensors", "modeling_xlme.py", "spm.model", "tokenization_xlme.py",
                       "tokenizer.json", "tokenizer_config.json", "xlme_reference.py"}));
  EXPECT_EQ(read_file(out + "/spm.model"), read_file(tokenizer()));
  // Nothing else next to it: the temporary folder was renamed.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), {}), 1);

  const auto weights = read_safetensors(out + "/model.safetensors");
  EXPECT_EQ(weights.metadata.at("format"), "pt");
  std::set<std::string> names;
  for (const auto& [name, tensor] : weights.tensors) {
    names.insert(name);
    EXPECT_EQ(tensor.scalar_type(), torch::kFloat32) << name;
  }
  std::set<std::string> expected;
  for (const auto& item : tiny_checkpoint().model->named_parameters()) {
    if (!is_generator_weight(item.key())) expected.insert(item.key());
  }
  EXPECT_EQ(names, expected);
  EXPECT_GT(names.count("discriminator_head.output.weight"), 0u);

  const auto config = nlohmann::json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(config["format"], "xlme-export");
  EXPECT_EQ(config["format_version"], 1);
  EXPECT_EQ(config["xlme_version"], XLME_VERSION);
  EXPECT_EQ(config["vocab_size"], 80);
  EXPECT_EQ(config["special_ids"]["mask"], 79);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["layers"], 2);
  EXPECT_EQ(config["heads"], 4);
  EXPECT_EQ(config["ffn_size"], 48);
  EXPECT_EQ(config["embedding_size"], 32);
  EXPECT_EQ(config["factorized_embeddings"], false);
  EXPECT_EQ(config["norm"], "post");
  EXPECT_EQ(config["layer_norm_eps"], 1e-5);
  EXPECT_EQ(config["relative_position"]["gated"], true);
  EXPECT_EQ(config["relative_position"]["num_buckets"], 32);
  EXPECT_EQ(config["relative_position"]["max_distance"], 128);
  EXPECT_EQ(config["generator"]["exported"], false);
  EXPECT_EQ(config["generator"]["hidden_size"], 32);
  EXPECT_EQ(config["objective_set"], "xlme");
  EXPECT_EQ(config["training"]["step"], 3);

  const std::string card = read_file(out + "/README.md");
  EXPECT_TRUE(contains_all(
      card, {"3 steps, 192 tokens seen", "2 layers, hidden 32, 4 heads",
             "gated, one table per layer, 32 buckets, max distance 128", "80 ids, own layout",
             "every language in the shards", "- train: step 3, total_loss 7.25, accuracy/mlm 0.125",
             "- validation: step 3, loss/mlm 6.5", "load_model("}));
  EXPECT_EQ(card.find("total_loss 1"), std::string::npos) << card;  // step 5 is after the export
}

TEST_F(PretrainedWeights, ExportsTheGeneratorOnRequestInBf16) {
  TempDir dir;
  const std::string out = exported(dir, /*with_generator=*/true, "bf16");
  const auto weights = read_safetensors(out + "/model.safetensors");
  EXPECT_EQ(weights.tensors.size(), tiny_checkpoint().model->named_parameters().size());
  EXPECT_EQ(weights.tensors.at("generator_head.output_bias").scalar_type(), torch::kBFloat16);
  PretrainedOptions o;
  o.with_generator = true;
  const Pretrained p = load_pretrained(out, o);
  EXPECT_EQ(p.electra->named_parameters().size(), weights.tensors.size());
  EXPECT_TRUE(contains_all(read_file(out + "/README.md"), {"bfloat16", "generator + head"}));
}

TEST_F(PretrainedWeights, RefusesToOverwriteUnlessForced) {
  TempDir dir;
  fs::create_directories(dir / "export");  // an empty folder is fine
  exported(dir);
  export_::ExportOptions o;
  o.checkpoint = checkpoint();
  o.out_dir = dir / "export";
  EXPECT_TRUE(contains_all(error_message([&] { export_::export_model(o); }),
                           {"export folder '" + (dir / "export") +
                            "' exists and is not empty; pass --force to replace it"}));
  // --force replaces an export folder xlme wrote, never a file it did not write.
  write_file(dir / "export/stale.txt", "old");
  o.force = true;
  EXPECT_TRUE(contains_all(error_message([&] { export_::export_model(o); }),
                           {"--force refuses to replace", "it holds 'stale.txt'"}));
  EXPECT_EQ(read_file(dir / "export/stale.txt"), "old");
  fs::remove(dir / "export/stale.txt");
  const auto before = fs::last_write_time(dir / "export/model.safetensors");
  export_::export_model(o);
  EXPECT_TRUE(fs::exists(dir / "export/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "export/.xlme-export"));
  EXPECT_GE(fs::last_write_time(dir / "export/model.safetensors"), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), {}), 1);

  o.checkpoint.clear();
  EXPECT_TRUE(contains_all(error_message([&] { export_::export_model(o); }),
                           {"no checkpoint to export: pass --checkpoint DIR"}));
}

TEST_F(PretrainedWeights, ACheckpointWithoutTokenizerNeedsOne) {
  TempDir dir;
  auto c = xlme::testing::tiny_export_config(tokenizer(), {});
  c.data.tokenizer.clear();
  const auto checkpoint = xlme::testing::make_tiny_checkpoint(c, dir / "run");
  export_::ExportOptions o;
  o.checkpoint = checkpoint.path;
  o.out_dir = dir / "export";
  EXPECT_TRUE(contains_all(error_message([&] { export_::export_model(o); }),
                           {"holds no tokenizer.model", "--set data.tokenizer=FILE"}));
  EXPECT_FALSE(fs::exists(dir / "export"));
  o.fallback_tokenizer = tokenizer();
  export_::export_model(o);
  EXPECT_EQ(read_file(dir / "export/spm.model"), read_file(tokenizer()));
}

// --- strictness: each mismatch is named ---------------------------------------------------------

// Rewrites an export's model.safetensors after `edit`.
void edit_weights(const std::string& folder,
                  const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
  auto content = read_safetensors(folder + "/model.safetensors");
  edit(content.tensors);
  write_safetensors(folder + "/model.safetensors", content);
}

void edit_config(const std::string& folder, const std::function<void(nlohmann::json&)>& edit) {
  auto config = nlohmann::json::parse(read_file(folder + "/config.json"));
  edit(config);
  write_file(folder + "/config.json", config.dump(2));
}

TEST_F(PretrainedWeights, MissingUnexpectedAndMisshapenWeightsAreNamed) {
  TempDir dir;
  const std::string out = exported(dir);
  const std::string weights = out + "/model.safetensors";
  const auto original = read_safetensors(weights);

  edit_weights(out, [](auto& t) { t.erase("discriminator.layers.1.attention.gate_u"); });
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"'" + weights +
                            "' lacks 1 weight(s) that the model of its config "
                            "needs: discriminator.layers.1.attention.gate_u"}));

  write_safetensors(weights, original);
  edit_weights(out, [](auto& t) {
    t["discriminator.layers.2.ffn.output.weight"] = torch::zeros({2});
    t["pooler.weight"] = torch::zeros({2});
  });
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"has 2 weight(s) that the model of its config does not have: "
                            "discriminator.layers.2.ffn.output.weight, pooler.weight"}));

  write_safetensors(weights, original);
  edit_weights(out, [](auto& t) { t["generator_head.output_bias"] = torch::zeros({80}); });
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"does not have: generator_head.output_bias"}));

  write_safetensors(weights, original);
  edit_weights(out, [](auto& t) { t["discriminator.embedding_norm.weight"] = torch::ones({31}); });
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"whose shape differs from the model of its config: "
                            "discriminator.embedding_norm.weight ([31] stored, [32] expected)"}));
}

TEST_F(PretrainedWeights, MistypedTablesAreRefusedNamingTheTensor) {
  // The same values as int64 or float64 where fp32 is expected: they fine-tuned without a word.
  TempDir dir;
  const std::string out = exported(dir);
  const std::string weights = out + "/model.safetensors";
  const auto original = read_safetensors(weights);
  for (const auto& [dtype, name] :
       {std::pair{torch::kInt64, "Long"}, {torch::kFloat64, "Double"}}) {
    write_safetensors(weights, original);
    edit_weights(out, [&, dtype = dtype](auto& t) {
      t["embeddings.token.weight"] = t["embeddings.token.weight"].to(dtype);
    });
    EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                             {"'" + weights +
                                  "' has weights whose dtype differs from the model of "
                                  "its config: embeddings.token.weight (" +
                                  std::string(name) + " stored, Float expected)",
                              "no conversion applies"}));
  }
  // The documented conversion: a bf16 export (config.json's dtype) loads into fp32 weights.
  TempDir other;
  Pretrained p = load_pretrained(exported(other, false, "bf16"));
  EXPECT_EQ(p.dtype, "bfloat16");
  EXPECT_EQ(p.discriminator->embeddings->token->weight.scalar_type(), torch::kFloat32);
}

TEST_F(PretrainedWeights, AnExtraTensorDeclaredHugeIsRefusedUnread) {
  // One extra tensor declared as 1 GiB on a sparse file: refused by name, never allocated.
  TempDir dir;
  const std::string out = exported(dir);
  const std::string weights = out + "/model.safetensors";
  const int64_t values = int64_t{1} << 28;
  xlme::testing::declare_unwritten_tensor(weights, "extra.weight", values);
  const auto declared = read_safetensors_header(weights);
  ASSERT_EQ(declared.tensors.at("extra.weight").shape, std::vector<int64_t>{values});
  const int64_t before = xlme::testing::peak_rss_mib();
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"'" + weights +
                            "' has 1 weight(s) that the model of its config does "
                            "not have: extra.weight; nothing of them was read"}));
  EXPECT_LT(xlme::testing::peak_rss_mib() - before, 256) << "the 1 GiB tensor was read";
}

TEST_F(PretrainedWeights, ARunFolderReadWhileItsRunPrunesLoadsTheNewestCheckpointLeft) {
  // A run saving every step with keep_last 1, imitated: each new step's folder appears and the
  // previous one is removed, every 50 ms (faster than any real run trains and saves), while the
  // run folder is loaded again and again. A loader that chose
  // a checkpoint then lost it to pruning failed with "tokenizer.model is missing".
  TempDir dir;
  const std::string run = dir / "run";
  fs::create_directories(run + "/checkpoints");
  const std::string source = checkpoint();
  const auto folder = [&](int step) { return run + fmt::format("/checkpoints/step_{:08d}", step); };
  const auto place = [&](int step) {
    const std::string tmp = folder(step) + ".tmp";
    fs::copy(source, tmp, fs::copy_options::recursive);
    // The manifest records the step of the folder's name.
    std::string manifest = read_file(tmp + "/manifest.yaml");
    const size_t at = manifest.find("step: ");
    manifest.replace(at, manifest.find('\n', at) - at, fmt::format("step: {}", step));
    write_file(tmp + "/manifest.yaml", manifest);
    fs::rename(tmp, folder(step));
  };
  place(1000);
  std::atomic<bool> stop{false};
  std::string pruner_failure;
  std::thread pruner([&] {
    try {
      for (int step = 1001; !stop; ++step) {
        place(step);
        fs::remove_all(folder(step - 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (const std::exception& e) {
      pruner_failure = e.what();
    }
  });
  int loaded = 0;
  std::string failure;
  for (int i = 0; i < 20 && failure.empty(); ++i) {
    try {
      Pretrained p = load_pretrained_resolved(run);
      // The tokenizer stays readable after its checkpoint is pruned.
      EXPECT_FALSE(read_file(p.tokenizer_file).empty());
      ++loaded;
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  stop = true;
  pruner.join();
  EXPECT_EQ(loaded, 20) << failure;
  EXPECT_EQ(pruner_failure, "");
}

TEST_F(PretrainedWeights, VocabularyAndSpecialIdMismatchesAreNamed) {
  TempDir dir;
  const std::string out = exported(dir);
  const std::string config = out + "/config.json";
  const std::string original = read_file(config);

  edit_config(out, [](auto& c) { c["vocab_size"] = 81; });
  EXPECT_TRUE(
      contains_all(error_message([&] { load_pretrained(out); }),
                   {"vocabulary size mismatch: embeddings.token.weight in '" + out +
                    "/model.safetensors' has 80 rows but '" + config + "' says vocab_size 81"}));

  write_file(config, original);
  edit_config(out, [](auto& c) { c["special_ids"]["mask"] = 5; });
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"special id mismatch: <mask> is 5 in '" + config +
                            "' but 79 in the tokenizer '" + out + "/spm.model' (own layout)"}));

  // A tokenizer of another size than the weights and the config, in an export made before
  // config.json recorded spm.model's CRC32 (with the record, the swap is named first: the
  // hostile export suite's ASwappedTokenizerOfTheSameSizeIsNamedByEveryLoader).
  write_file(config, original);
  edit_config(out, [](auto& c) { c.erase("spm_model"); });
  {
    TempDir other;
    xlme::testing::write_file(other / "corpus/mono/xx.txt",
                              read_file(suite_dir() / "tok/corpus/mono/xx.txt"));
    data::SpmTrainingOptions o;
    o.corpus_dir = other / "corpus";
    o.out_model = other / "spm.model";
    o.spm.vocab_size = 70;
    o.spm.character_coverage = 1.0;
    data::train_sentencepiece(o);
    fs::copy_file(other / "spm.model", out + "/spm.model", fs::copy_options::overwrite_existing);
  }
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"vocabulary size mismatch: the tokenizer '" + out +
                            "/spm.model' (own layout) has 70 ids (<mask> included) but '" + config +
                            "' says vocab_size 80"}));
}

TEST_F(PretrainedWeights, FoldersThatAreNotModelsAreNamed) {
  TempDir dir;
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(dir / "none"); }),
                           {"pre-trained model folder '" + (dir / "none") + "' not found"}));
  fs::create_directories(dir / "empty");
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(dir / "empty"); }),
                           {"'" + (dir / "empty") + "' is neither a pre-training checkpoint"}));
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(suite_dir() / "run"); }),
                           {"is a run folder; pass one of its checkpoints"}));

  const std::string out = exported(dir);
  edit_config(out, [](auto& c) { c["relative_position"].erase("gated"); });
  EXPECT_TRUE(
      contains_all(error_message([&] { load_pretrained(out); }), {"export config '" + out +
                                                                  "/config.json' has no "
                                                                  "'relative_position.gated'"}));
  edit_config(out, [](auto& c) { c["format_version"] = 2; });
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(out); }),
                           {"has format version 2", "reads versions up to 1"}));

  // A damaged checkpoint is refused by its manifest.
  TempDir copy;
  fs::copy(checkpoint(), copy / "step", fs::copy_options::recursive);
  write_file(copy / "step/model.pt", "garbage");
  EXPECT_TRUE(contains_all(error_message([&] { load_pretrained(copy / "step"); }),
                           {"model.pt is truncated"}));
}

// finetune.init and the like: a run folder stands for its newest valid checkpoint.
TEST_F(PretrainedWeights, ARunFolderResolvesToItsNewestValidCheckpoint) {
  EXPECT_EQ(resolve_pretrained_folder(suite_dir() / "run"), checkpoint());
  EXPECT_EQ(resolve_pretrained_folder(checkpoint()), checkpoint());
  TempDir dir;
  fs::copy(suite_dir() / "run", dir / "run", fs::copy_options::recursive);
  const std::string newer = dir / "run/checkpoints/step_99999999";
  fs::copy(checkpoint(), newer, fs::copy_options::recursive);
  write_file(newer + "/model.pt", "garbage");  // damaged: skipped
  const std::string valid = dir / ("run/checkpoints/" + fs::path(checkpoint()).filename().string());
  EXPECT_EQ(resolve_pretrained_folder(dir / "run"), valid);
  fs::remove_all(valid);
  EXPECT_TRUE(contains_all(error_message([&] { resolve_pretrained_folder(dir / "run"); }),
                           {"run folder " + (dir / "run") + " has no valid checkpoint under " +
                            (dir / "run/checkpoints")}));
}

// The dotted keys of a JSON object's values (objects are descended into).
void collect_json_keys(const nlohmann::json& j, const std::string& prefix,
                       std::set<std::string>& out) {
  for (const auto& [key, value] : j.items()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      collect_json_keys(value, name, out);
    } else {
      out.insert(name);
    }
  }
}

// config.json's keys are the export format's (written through ModelConfig::visit, which must not
// add or drop any: xlme_reference.py and the transformers code read them).
TEST(ExportedConfig, HoldsExactlyTheExportFormatsKeys) {
  ExportedConfig e;
  e.model.vocab_size = 1000;
  e.special_ids = data::SpecialIds::for_vocab(1000);
  std::set<std::string> keys;
  collect_json_keys(nlohmann::json::parse(to_json(e)), "", keys);
  EXPECT_EQ(keys, (std::set<std::string>{"format",
                                         "format_version",
                                         "xlme_version",
                                         "architecture",
                                         "objective_set",
                                         "dtype",
                                         "vocab_size",
                                         "vocab_layout",
                                         "special_ids.bos",
                                         "special_ids.pad",
                                         "special_ids.eos",
                                         "special_ids.unk",
                                         "special_ids.mask",
                                         "hidden_size",
                                         "layers",
                                         "heads",
                                         "ffn_size",
                                         "activation",
                                         "embedding_size",
                                         "factorized_embeddings",
                                         "embedding_sharing",
                                         "share_layers",
                                         "cross_attention",
                                         "max_positions",
                                         "absolute_positions",
                                         "norm",
                                         "layer_norm_eps",
                                         "relative_position.enabled",
                                         "relative_position.gated",
                                         "relative_position.shared_across_layers",
                                         "relative_position.num_buckets",
                                         "relative_position.max_distance",
                                         "dropout",
                                         "attention_dropout",
                                         "init_std",
                                         "rtd_head",
                                         "generator.exported",
                                         "generator.layers",
                                         "generator.hidden_size",
                                         "generator.heads",
                                         "generator.ffn_size",
                                         "generator.sampling_temperature",
                                         "training.step",
                                         "training.tokens_seen"}));
  // The first three name the format before anything else is read.
  const auto ordered = nlohmann::ordered_json::parse(to_json(e));
  EXPECT_EQ(ordered.begin().key(), "format");
  EXPECT_EQ(std::next(ordered.begin()).key(), "format_version");
  EXPECT_EQ(std::next(ordered.begin(), 2).key(), "xlme_version");
  // Exports made before layer sharing have no share_layers: read as none.
  auto old = nlohmann::ordered_json::parse(to_json(e));
  old.erase("share_layers");
  EXPECT_EQ(parse_exported_config(old.dump(), "old.json").model.share_layers,
            config::LayerSharing::kNone);
  // ... and those made before VECO no cross_attention: read as false (plugged out).
  old.erase("cross_attention");
  EXPECT_FALSE(parse_exported_config(old.dump(), "old.json").model.cross_attention);
}

TEST(ExportedConfig, ReadsBackWhatItWrites) {
  ExportedConfig e;
  e.model.vocab_size = 1000;
  e.model.embedding_size = 128;
  e.model.norm = config::Norm::kPre;
  e.model.layer_norm_eps = 1e-12;
  e.model.relative_position.shared_across_layers = true;
  e.model.relative_position.gated = false;
  e.model.generator.hidden_size = 384;  // a multiple of the 12 heads, as a config must have
  e.special_ids = data::SpecialIds::for_vocab(1000);
  e.vocab_layout = "xlmr";
  e.objective_set = "mlm";
  e.rtd_head = false;
  e.step = 7;
  e.tokens_seen = 12345678901;
  const auto back = parse_exported_config(to_json(e), "c.json");
  EXPECT_EQ(back.model.vocab_size, 1000);
  EXPECT_EQ(back.model.embedding_size, 128);
  EXPECT_EQ(back.model.norm, config::Norm::kPre);
  EXPECT_EQ(back.model.layer_norm_eps, 1e-12);
  EXPECT_TRUE(back.model.relative_position.shared_across_layers);
  EXPECT_FALSE(back.model.relative_position.gated);
  EXPECT_EQ(back.model.generator.hidden_size, 384);
  EXPECT_EQ(back.model.generator.heads, 12);  // resolved from the discriminator's
  EXPECT_EQ(back.special_ids.mask, 999);
  EXPECT_EQ(back.vocab_layout, "xlmr");
  EXPECT_EQ(back.objective_set, "mlm");
  EXPECT_FALSE(back.rtd_head);
  EXPECT_EQ(back.tokens_seen, 12345678901);
  EXPECT_TRUE(contains_all(error_message([] { parse_exported_config("{", "c.json"); }),
                           {"export config 'c.json' is not valid JSON"}));
  EXPECT_TRUE(
      contains_all(error_message([] { parse_exported_config(R"({"format": "other"})", "c.json"); }),
                   {"'c.json' has format 'other', not 'xlme-export'"}));
}

}  // namespace
}  // namespace xlme::checkpoint
