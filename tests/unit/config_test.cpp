// Config: defaults, files with includes, --set overrides and their priority, the YAML round trip,
// every error path with its message, and the shipped configs under configs/.
#include "xlme/config/config.h"
#include "xlme/config/yaml_file.h"

#include "config/yaml_io.h"
#include "test_util.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>

namespace xlme::config {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::TempDir;
using xlme::testing::write_file;

std::string shipped(const std::string& relative) {
  return (std::filesystem::path(XLME_SOURCE_DIR) / "configs" / relative).string();
}

TEST(ConfigDefaults, AreThePapersBaseRecipe) {
  const Config c = load_config("");
  EXPECT_EQ(c.model.hidden_size, 768);
  EXPECT_EQ(c.model.layers, 12);
  EXPECT_EQ(c.model.heads, 12);
  EXPECT_EQ(c.model.ffn_size, 3072);
  EXPECT_EQ(c.model.generator.layers, 4);
  EXPECT_EQ(c.model.relative_position.num_buckets, 32);
  EXPECT_EQ(c.model.relative_position.max_distance, 128);
  EXPECT_TRUE(c.model.relative_position.gated);
  EXPECT_EQ(c.objectives.set, "xlme");
  EXPECT_DOUBLE_EQ(c.objectives.rtd_weight, 50.0);
  EXPECT_DOUBLE_EQ(c.train.lr, 5e-4);
  EXPECT_DOUBLE_EQ(c.train.adam_beta2, 0.98);
  EXPECT_DOUBLE_EQ(c.train.adam_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.train.clip_norm, 2.0);
  EXPECT_EQ(c.train.warmup_steps, 10000);
  EXPECT_EQ(c.train.steps, 125000);
  EXPECT_DOUBLE_EQ(c.data.mono.sampling_exponent, 0.7);
  EXPECT_DOUBLE_EQ(c.data.spm.sampling_exponent, 0.3);
  EXPECT_EQ(c.finetune.seeds, std::vector<int64_t>{1});
}

TEST(ConfigFile, SetsOnlyTheKeysItNames) {
  TempDir dir;
  write_file(dir / "c.yaml",
             "model:\n  layers: 6\n  norm: pre\n  relative_position:\n    gated: false\n"
             "data:\n  mono:\n    languages: [de, fr, zh_CN]\ntrain:\n  lr: 1e-4\n");
  const Config c = load_config(dir / "c.yaml");
  EXPECT_EQ(c.model.layers, 6);
  EXPECT_EQ(c.model.norm, Norm::kPre);
  EXPECT_FALSE(c.model.relative_position.gated);
  EXPECT_TRUE(c.model.relative_position.enabled);  // untouched sibling keeps its default
  EXPECT_EQ(c.data.mono.languages, (std::vector<std::string>{"de", "fr", "zh_CN"}));
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-4);
  EXPECT_EQ(c.model.hidden_size, 768);
}

TEST(ConfigFile, EmptyFileIsAllDefaults) {
  TempDir dir;
  write_file(dir / "empty.yaml", "# nothing but a comment\n");
  EXPECT_EQ(to_yaml(load_config(dir / "empty.yaml")), to_yaml(load_config("")));
}

TEST(ConfigFile, IntegersWrittenAsRealsAreAccepted) {
  TempDir dir;
  write_file(dir / "c.yaml",
             "train:\n  tokens_per_task: 1e6\n  steps: 2048.0\n  warmup_steps: 1.0e2\n");
  const Config c = load_config(dir / "c.yaml");
  EXPECT_EQ(c.train.tokens_per_task, 1000000);
  EXPECT_EQ(c.train.steps, 2048);
  EXPECT_EQ(c.train.warmup_steps, 100);
}

TEST(ConfigInclude, LaterFilesAndTheIncludingFileWin) {
  TempDir dir;
  write_file(dir / "model/a.yaml", "model:\n  layers: 2\n  hidden_size: 64\n  heads: 2\n");
  write_file(dir / "model/b.yaml", "model:\n  layers: 3\n  ffn_size: 128\n");
  write_file(dir / "run/c.yaml",
             "include: [../model/a.yaml, ../model/b.yaml]\nmodel:\n  ffn_size: 256\n");
  const Config c = load_config(dir / "run/c.yaml");
  EXPECT_EQ(c.model.hidden_size, 64);  // from a
  EXPECT_EQ(c.model.layers, 3);        // b after a
  EXPECT_EQ(c.model.ffn_size, 256);    // the including file last
}

TEST(ConfigInclude, SingleFileAndNestedIncludes) {
  TempDir dir;
  write_file(dir / "a.yaml", "train:\n  steps: 7\n  warmup_steps: 1\n");
  write_file(dir / "sub/b.yaml", "include: ../a.yaml\ntrain:\n  warmup_steps: 2\n");
  write_file(dir / "c.yaml", "include: sub/b.yaml\n");
  const Config c = load_config(dir / "c.yaml");
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.warmup_steps, 2);
}

TEST(ConfigInclude, CycleIsAnError) {
  TempDir dir;
  write_file(dir / "a.yaml", "include: b.yaml\n");
  write_file(dir / "b.yaml", "include: a.yaml\n");
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir / "a.yaml"); }),
                           {"include cycle", "a.yaml", "b.yaml"}));
}

TEST(ConfigInclude, MissingIncludedFileNamesBothFiles) {
  TempDir dir;
  write_file(dir / "a.yaml", "include: [nope.yaml]\n");
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir / "a.yaml"); }),
                           {dir / "a.yaml:1", "included file 'nope.yaml' not found"}));
}

TEST(ConfigOverride, SetBeatsFileBeatsDefault) {
  TempDir dir;
  write_file(dir / "c.yaml", "model:\n  layers: 6\n  heads: 6\ntrain:\n  lr: 1e-4\n");
  const Config c =
      load_config(dir / "c.yaml", {"model.layers=8", "train.lr=3e-4", "model.layers=9"});
  EXPECT_EQ(c.model.layers, 9);  // the last --set of a key wins
  EXPECT_EQ(c.model.heads, 6);   // file
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.model.ffn_size, 3072);  // default
}

TEST(ConfigOverride, ListsBoolsAndVerbatimStrings) {
  const Config c = load_config(
      "", {"data.para.languages=[en-de, en-fr]", "model.relative_position.enabled=false",
           "run.out_dir=runs/my run #1: final", "finetune.seeds=[1, 2, 3]", "finetune.init="});
  EXPECT_EQ(c.data.para.languages, (std::vector<std::string>{"en-de", "en-fr"}));
  EXPECT_FALSE(c.model.relative_position.enabled);
  EXPECT_EQ(c.run.out_dir, "runs/my run #1: final");
  EXPECT_EQ(c.finetune.seeds, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.finetune.init, "");
}

TEST(ConfigRoundTrip, ResolvedConfigReadsBackIdentically) {
  Config c = load_config("", {"model.layers=3", "model.heads=4", "model.hidden_size=64"});
  c.train.lr = 1.0 / 3.0;
  c.model.dropout = 0.1 + 0.2;  // not exactly 0.3: needs all 17 digits
  c.train.adam_eps = 1e-12;
  c.run.out_dir = "runs/with space/and \"quotes\" and \\ and # and: colon";
  c.data.tokenizer = "yes";  // a YAML 1.1 boolean word
  c.finetune.init = "123";   // a number-looking string
  c.export_.checkpoint = "";
  c.data.mono.languages = {"de", "zh_CN", "true", "-x", "[a]", "日本語", ""};
  c.finetune.seeds = {0, 42, 2147483647};
  TempDir dir;
  save_config(c, dir / "resolved.yaml");
  const Config back = load_config(dir / "resolved.yaml");
  EXPECT_EQ(to_yaml(back), to_yaml(c));
  EXPECT_EQ(back.train.lr, c.train.lr);  // bit-exact, not approximately
  EXPECT_EQ(back.model.dropout, c.model.dropout);
  EXPECT_EQ(back.train.adam_eps, c.train.adam_eps);
  EXPECT_EQ(back.run.out_dir, c.run.out_dir);
  EXPECT_EQ(back.data.tokenizer, "yes");
  EXPECT_EQ(back.finetune.init, "123");
  EXPECT_EQ(back.data.mono.languages, c.data.mono.languages);
  EXPECT_EQ(back.finetune.seeds, c.finetune.seeds);
  EXPECT_FALSE(std::filesystem::exists(dir / "resolved.yaml.tmp-" + std::to_string(getpid())));
}

TEST(ConfigRoundTrip, CommentedOutputReadsBackIdentically) {
  const Config c = load_config(shipped("pretrain/demo.yaml"));
  const std::string commented = to_yaml(c, /*docs=*/true);
  EXPECT_TRUE(contains_all(commented, {"# attention heads (must divide hidden_size) [an integer in "
                                       "[1, 1024]]",
                                       "# gated relative position bias"}));
  TempDir dir;
  write_file(dir / "commented.yaml", commented);
  EXPECT_EQ(to_yaml(load_config(dir / "commented.yaml")), to_yaml(c));
}

// The model's named values are read once into enums: every spelling reads as its value, is
// written back as the same spelling and reads back; the reference lists the spellings.
TEST(ConfigNamed, EverySpellingReadsWritesAndReadsBack) {
  auto round_trip = [](const std::string& key, const auto& named, auto member) {
    for (const auto& [spelling, value] : named.names) {
      SCOPED_TRACE(key + "=" + spelling);
      const Config c = load_config("", {key + "=" + spelling});
      EXPECT_EQ(c.model.*member, value);
      EXPECT_NE(to_yaml(c).find("  " + key.substr(6) + ": " + spelling + "\n"), std::string::npos);
      TempDir dir;
      save_config(c, dir / "c.yaml");
      EXPECT_EQ(load_config(dir / "c.yaml").model.*member, value);
    }
  };
  round_trip("model.norm", kNorms, &ModelConfig::norm);
  round_trip("model.embedding_sharing", kEmbeddingSharings, &ModelConfig::embedding_sharing);
  round_trip("model.attention", kAttentionChoices, &ModelConfig::attention);
  round_trip("model.share_layers", kLayerSharings, &ModelConfig::share_layers);
  EXPECT_TRUE(contains_all(to_yaml(load_config(""), /*docs=*/true),
                           {"[one of: none, all, attention, ffn]", "[one of: auto, math, sdpa]"}));
  EXPECT_EQ(kLayerSharings.name(static_cast<LayerSharing>(7)), "");
  EXPECT_FALSE(kNorms.value("middle").has_value());
}

// The generator's arguments: its layers, its sizes where they are not 0 and the discriminator's
// otherwise, the discriminator's embedding width (the tables are shared), no gdes delta and no
// cross-attention; everything else as the discriminator's.
TEST(ModelArgs, TheGeneratorsAreResolvedFromTheDiscriminators) {
  Config c =
      load_config("", {"model.hidden_size=64", "model.heads=4", "model.ffn_size=256",
                       "model.generator.layers=2", "model.generator.hidden_size=32",
                       "model.embedding_sharing=gdes", "model.norm=pre", "model.share_layers=ffn",
                       "model.cross_attention=true", "objectives.set=veco"});
  const ModelArgs disc = discriminator_args(c.model);
  EXPECT_EQ(disc.embedding_size, 64);  // 0 = hidden_size
  EXPECT_EQ(disc.embedding_sharing, EmbeddingSharing::kGdes);
  EXPECT_TRUE(disc.cross_attention);
  const ModelArgs gen = generator_args(c.model);
  EXPECT_EQ(gen.layers, 2);
  EXPECT_EQ(gen.hidden_size, 32);
  EXPECT_EQ(gen.heads, 4);
  EXPECT_EQ(gen.ffn_size, 256);
  EXPECT_EQ(gen.embedding_size, 64);
  EXPECT_EQ(gen.embedding_sharing, EmbeddingSharing::kFull);
  EXPECT_FALSE(gen.cross_attention);
  EXPECT_EQ(gen.norm, Norm::kPre);
  EXPECT_EQ(gen.share_layers, LayerSharing::kFfn);
  EXPECT_FALSE(gen.shares_attention());
  EXPECT_TRUE(gen.shares_ffn());
  c.model.embedding_size = 16;
  EXPECT_EQ(discriminator_args(c.model).embedding_size, 16);
  EXPECT_EQ(generator_args(c.model).embedding_size, 16);
}

TEST(ConfigScalars, FormattedStringsParseBackToTheSameText) {
  for (const std::string s :
       {"plain",       "runs/x",    "a b",       "",     "~",  "null", "No",  "on",  "1",
        "-1",          "1e5",       ".5",        ".inf", "#x", "a: b", "[x]", "{y}", "\"q\"",
        "back\\slash", "tab\there", "new\nline", "ünï",  "-",  "@x",   "x@y", "key:"}) {
    const YAML::Node node = YAML::Load("k: " + detail::format_scalar(s));
    ASSERT_TRUE(node["k"].IsScalar()) << "'" << s << "' -> " << detail::format_scalar(s);
    EXPECT_EQ(node["k"].Scalar(), s) << detail::format_scalar(s);
  }
  EXPECT_EQ(detail::format_scalar("xlme-mono"), "xlme-mono");  // readable where safe
  EXPECT_EQ(detail::format_scalar("yes"), "\"yes\"");
  EXPECT_EQ(detail::format_scalar(50.0), "50.0");
  EXPECT_EQ(detail::format_scalar(5e-4), "0.0005");
  EXPECT_EQ(detail::format_scalar(1e-6), "1e-06");
}

// --- Errors: each names the file (and line), the key, and what is allowed -----------------------

class ConfigErrors : public ::testing::Test {
 protected:
  std::string load_error(const std::string& yaml, std::vector<std::string> sets = {}) {
    write_file(path(), yaml);
    return error_message([&] { load_config(path(), sets); });
  }
  std::string path() const { return dir_ / "bad.yaml"; }

  TempDir dir_;
};

TEST_F(ConfigErrors, UnknownKeySuggestsTheClosestAndListsTheAllowed) {
  const std::string msg = load_error("model:\n  layers: 2\n  hiden_size: 64\n");
  EXPECT_TRUE(contains_all(
      msg, {path() + ":3", "unknown key 'model.hiden_size'", "did you mean 'model.hidden_size'?",
            "the keys allowed in 'model' are: vocab_size, hidden_size"}));
}

TEST_F(ConfigErrors, UnknownSectionAtTheTopLevel) {
  const std::string msg = load_error("modle:\n  layers: 2\n");
  EXPECT_TRUE(contains_all(msg, {path() + ":1", "unknown key 'modle'", "did you mean 'model'?",
                                 "allowed at the top level are: include, run, model, data"}));
}

TEST_F(ConfigErrors, UnknownNestedKeyWithoutCloseMatch) {
  const std::string msg = load_error("model:\n  relative_position:\n    xyzzy_plugh: 1\n");
  EXPECT_TRUE(contains_all(msg, {"unknown key 'model.relative_position.xyzzy_plugh'",
                                 "in 'model.relative_position' are: enabled, gated"}));
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
}

TEST_F(ConfigErrors, WrongTypes) {
  EXPECT_TRUE(contains_all(load_error("model:\n  layers: twelve\n"),
                           {path() + ":2",
                            "model.layers: expected an integer in [1, 1024], got "
                            "'twelve'"}));
  EXPECT_TRUE(contains_all(load_error("model:\n  layers: 2.5\n"),
                           {"model.layers: expected an integer in [1, 1024], got '2.5'"}));
  EXPECT_TRUE(contains_all(load_error("train:\n  lr: fast\n"),
                           {"train.lr: expected a number in (0.0, 1.0], got 'fast'"}));
  EXPECT_TRUE(contains_all(load_error("model:\n  absolute_positions: maybe\n"),
                           {"model.absolute_positions: expected true or false, got 'maybe'"}));
  EXPECT_TRUE(contains_all(load_error("model:\n  layers: [1, 2]\n"),
                           {"model.layers: expected an integer in [1, 1024], got a list"}));
  EXPECT_TRUE(contains_all(load_error("data:\n  mono:\n    languages: de\n"),
                           {path() + ":3",
                            "data.mono.languages: expected a list such as [a, b], "
                            "got 'de'"}));
  EXPECT_TRUE(contains_all(load_error("model: 5\n"),
                           {path() + ":1", "model: expected a map of keys, got '5'"}));
  EXPECT_TRUE(contains_all(load_error("run:\n  out_dir: {a: 1}\n"),
                           {"run.out_dir: expected a string, got a map"}));
  EXPECT_TRUE(contains_all(load_error("finetune:\n  seeds: [1, x]\n"),
                           {"finetune.seeds: expected a list of an integer in [0, 2147483647], "
                            "got 'x' in it"}));
}

TEST_F(ConfigErrors, OutOfRange) {
  EXPECT_TRUE(contains_all(load_error("model:\n  dropout: 1.5\n"),
                           {path() + ":2",
                            "model.dropout: 1.5 is out of range: expected a number "
                            "in [0.0, 1.0)"}));
  EXPECT_TRUE(contains_all(load_error("model:\n  layers: 0\n"),
                           {"model.layers: 0 is out of range: expected an integer in [1, 1024]"}));
  EXPECT_TRUE(contains_all(load_error("train:\n  lr: nan\n"), {"train.lr: nan is out of range"}));
  EXPECT_TRUE(contains_all(load_error("train:\n  steps: -5\n"),
                           {"train.steps: -5 is out of range: expected an integer >= 1"}));
  EXPECT_TRUE(contains_all(load_error("model:\n  norm: middle\n"),
                           {"model.norm: expected one of: post, pre, got 'middle'"}));
}

TEST_F(ConfigErrors, MalformedYamlNamesLineAndColumn) {
  const std::string msg = load_error("model:\n  layers: [1, 2\n  heads: 3\n");
  EXPECT_TRUE(contains_all(msg, {path() + ":", "malformed YAML"}));
  EXPECT_TRUE(
      contains_all(load_error("model:\n\tlayers: 2\n"), {path() + ":2:", "malformed YAML"}));
}

TEST_F(ConfigErrors, DuplicateKeysNameBothLines) {
  EXPECT_TRUE(contains_all(load_error("model:\n  layers: 2\n  heads: 4\n  layers: 6\n"),
                           {path() + ":4: key 'layers' is given twice in the same map (lines 2 "
                                     "and 4)"}));
  EXPECT_TRUE(contains_all(load_error("train:\n  lr: 0.1\nrun:\n  seed: 3\ntrain:\n  steps: 9\n"),
                           {path() + ":5: key 'train' is given twice", "(lines 1 and 5)"}));
  // Equal keys in different maps, and in a list of maps, are no duplicates.
  EXPECT_NO_THROW(load_yaml_text("a:\n  x: 1\nb:\n  x: 2\nc: [{x: 1}, {x: 2}]\n", "t"));
  EXPECT_TRUE(
      contains_all(error_message([] { load_yaml_text("c: [{x: 1, y: 2, x: 3}]\n", "m.yaml"); }),
                   {"m.yaml:1: key 'x' is given twice"}));
  // In an included file.
  write_file(dir_ / "inc.yaml", "data:\n  shards: a\n  tokenizer: t\n  shards: b\n");
  write_file(dir_ / "top.yaml", "include: inc.yaml\n");
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir_ / "top.yaml"); }),
                           {dir_ / "inc.yaml:4: key 'shards'", "(lines 2 and 4)"}));
}

TEST_F(ConfigErrors, MissingFile) {
  const std::string msg = error_message([&] { load_config(dir_ / "nope.yaml"); });
  EXPECT_TRUE(contains_all(msg, {"config file '" + (dir_ / "nope.yaml") + "' not found",
                                 "pass an existing YAML file to --config"}));
}

TEST_F(ConfigErrors, OverrideErrorsNameTheOverride) {
  EXPECT_TRUE(contains_all(error_message([] { load_config("", {"model.layers"}); }),
                           {"--set 'model.layers': expected dotted.key=value"}));
  EXPECT_TRUE(contains_all(
      error_message([] { load_config("", {"model.layres=3"}); }),
      {"--set model.layres=3: unknown key 'model.layres'", "did you mean 'model.layers'?"}));
  EXPECT_TRUE(contains_all(error_message([] { load_config("", {"model.layers=-1"}); }),
                           {"--set model.layers=-1: model.layers: -1 is out of range"}));
  EXPECT_TRUE(contains_all(error_message([] { load_config("", {"model..layers=1"}); }),
                           {"empty component in key 'model..layers'"}));
  EXPECT_TRUE(contains_all(error_message([] { load_config("", {"data.mono.languages=[de,"}); }),
                           {"--set data.mono.languages=[de,: malformed YAML value"}));
  EXPECT_TRUE(contains_all(error_message([] { load_config("", {"model=3"}); }),
                           {"--set model=3: model: expected a map of keys, got '3'"}));
}

TEST_F(ConfigErrors, CrossFieldChecksNameEveryKeyAndItsOrigin) {
  const std::string msg = load_error("model:\n  hidden_size: 768\n", {"model.heads=10"});
  EXPECT_TRUE(contains_all(msg, {"model.hidden_size (768, from " + path() + ":2)",
                                 "must be a multiple of model.heads (10, from --set "
                                 "model.heads=10)"}));
  EXPECT_TRUE(contains_all(load_error("train:\n  steps: 10\n  warmup_steps: 20\n"),
                           {"train.warmup_steps (20, from " + path() +
                            ":3) exceeds train.steps "
                            "(10, from " +
                            path() + ":2)"}));
  EXPECT_TRUE(contains_all(load_error("data:\n  mono:\n    max_len: 1024\n"),
                           {"data.mono.max_len (1024, from " + path() +
                            ":3) exceeds "
                            "model.max_positions "
                            "(512, default)"}));
  EXPECT_TRUE(contains_all(load_error("model:\n  relative_position:\n    num_buckets: 33\n"),
                           {"num_buckets (33, from " + path() + ":3) must be even"}));
}

// --- The configs shipped in configs/ ------------------------------------------------------------

TEST(ShippedConfigs, EveryFileLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(
           std::filesystem::path(XLME_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_config(entry.path().string()));
    ++count;
  }
  EXPECT_GE(count, 7);
}

TEST(ShippedConfigs, ModelSizesAreThePapers) {
  struct Size {
    const char* file;
    int64_t hidden, layers, gen_layers, heads, ffn;
  };
  for (const Size& s : {Size{"model/base.yaml", 768, 12, 4, 12, 3072},
                        Size{"model/large.yaml", 1024, 24, 6, 16, 4096},
                        Size{"model/xl.yaml", 1536, 48, 8, 24, 6144}}) {
    SCOPED_TRACE(s.file);
    const ModelConfig m = load_config(shipped(s.file)).model;
    EXPECT_EQ(m.hidden_size, s.hidden);
    EXPECT_EQ(m.layers, s.layers);
    EXPECT_EQ(m.generator.layers, s.gen_layers);
    EXPECT_EQ(m.heads, s.heads);
    EXPECT_EQ(m.ffn_size, s.ffn);
    EXPECT_EQ(m.generator.hidden_size, 0);  // the generator has the discriminator's width
    EXPECT_EQ(m.vocab_size, 250002);
  }
}

TEST(ShippedConfigs, PretrainBaseIsTable10) {
  const Config c = load_config(shipped("pretrain/base.yaml"));
  EXPECT_EQ(c.model.hidden_size, 768);
  EXPECT_EQ(c.data.vocab_layout, "xlmr");
  EXPECT_EQ(c.train.steps, 125000);
  EXPECT_EQ(c.train.warmup_steps, 10000);
  EXPECT_DOUBLE_EQ(c.train.lr, 5e-4);
  EXPECT_DOUBLE_EQ(c.train.adam_beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.train.adam_beta2, 0.98);
  EXPECT_DOUBLE_EQ(c.train.adam_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.train.clip_norm, 2.0);
  EXPECT_EQ(c.train.tokens_per_task, 2048 * 512);
  EXPECT_DOUBLE_EQ(c.objectives.rtd_weight, 50.0);
  EXPECT_DOUBLE_EQ(c.data.mono.sampling_exponent, 0.7);
}

TEST(ShippedConfigs, DemoIsTinyEnoughForTheCpu) {
  const Config c = load_config(shipped("pretrain/demo.yaml"));
  EXPECT_LE(c.model.hidden_size, 256);
  EXPECT_LE(c.model.layers, 4);
  EXPECT_EQ(c.objectives.set, "xlme");
  EXPECT_LE(c.train.steps * c.train.tokens_per_task * 2, 20'000'000);
}

// Hostile YAML: nesting past kMaxYamlDepth is named with the file and line before the parser
// recurses far (yaml-cpp's own guard says only "malformed YAML: bad file", at depth 2000).
TEST_F(ConfigErrors, DeepNestingIsNamedWithFileAndLine) {
  const int64_t deep = 100000;
  EXPECT_TRUE(contains_all(
      load_error("model:\n  layers: " + std::string(deep, '[') + std::string(deep, ']') + "\n"),
      {path() + ":2: nested too deeply: more than 64 levels of lists and maps"}));
  // Block style: one map per line, the 65th level on line 65.
  std::string block;
  for (int level = 0; level < 70; ++level) block += std::string(level, ' ') + "k:\n";
  EXPECT_TRUE(contains_all(load_error(block), {path() + ":65: nested too deeply"}));
  // 64 levels are read (and refused by the schema, not by the depth).
  EXPECT_TRUE(contains_all(load_error("run: " + std::string(63, '[') + std::string(63, ']')),
                           {"run: expected a map of keys, got a list"}));
  // Manifests and trainer states read through the same function.
  write_file(dir_ / "manifest.yaml", "files: " + std::string(deep, '['));
  EXPECT_TRUE(contains_all(error_message([&] { load_yaml_file(dir_ / "manifest.yaml"); }),
                           {dir_ / "manifest.yaml:1: nested too deeply"}));
}

// A device, a FIFO or a folder given as a config (or included, or read as a manifest) is named for
// what it is, without opening it: a FIFO would block the open, /dev/zero never ends.
TEST_F(ConfigErrors, NotARegularFileSaysWhatItIs) {
  EXPECT_TRUE(contains_all(error_message([] { load_config("/dev/zero"); }),
                           {"YAML file '/dev/zero' is a character device, not a regular file"}));
  const std::string fifo = dir_ / "fifo.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(
      contains_all(error_message([&] { load_config(fifo); }),
                   {"YAML file '" + fifo + "' is a FIFO (named pipe), not a regular file"}));
  EXPECT_TRUE(contains_all(error_message([&] { load_yaml_file(fifo); }),
                           {"YAML file '" + fifo + "' is a FIFO (named pipe)"}));
  write_file(dir_ / "top.yaml", "include: [/dev/zero]\n");
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir_ / "top.yaml"); }),
                           {"'/dev/zero' is a character device, not a regular file"}));
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir_.path().string()); }),
                           {"config file '" + dir_.path().string() + "' is a folder"}));
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir_ / "nope.yaml"); }),
                           {"config file '" + (dir_ / "nope.yaml") + "' not found"}));
}

// A YAML file above kMaxYamlBytes is refused from its size, unread (a sparse 17 MiB file here);
// text from elsewhere is refused by its length.
TEST_F(ConfigErrors, OversizedYamlIsRefusedUnread) {
  write_file(path(), "model:\n  layers: 2\n");
  std::filesystem::resize_file(path(), (17 << 20));
  EXPECT_TRUE(
      contains_all(error_message([&] { load_config(path()); }),
                   {"YAML file '" + path() + "' is 17825792 bytes, over the limit of 16 MiB",
                    "parsing this much would take minutes"}));
  write_file(dir_ / "top.yaml", "include: bad.yaml\n");
  EXPECT_TRUE(contains_all(error_message([&] { load_config(dir_ / "top.yaml"); }),
                           {"YAML file '" + path() + "' is 17825792 bytes"}));
  EXPECT_TRUE(contains_all(
      error_message([] { load_yaml_text(std::string((16 << 20) + 1, '#'), "big.yaml"); }),
      {"big.yaml holds 16777217 bytes of YAML, over the limit of 16 MiB"}));
}

// An include: of a non-YAML file (a .env) does not echo its content, secrets included, into the
// error: the error names the file and its size, never its text.
TEST(ConfigInclude, ANonYamlFileIsNamedWithoutEchoingIt) {
  TempDir dir;
  write_file(dir / ".env", "SECRET_TOKEN=abc123\nDB_PASS=hunter2\n");
  write_file(dir / "c.yaml", "include: .env\n");
  const std::string message = error_message([&] { load_config(dir / "c.yaml", {}); });
  EXPECT_TRUE(contains_all(message, {dir / ".env",
                                     "expected a map of keys, got plain text of 35 "
                                     "bytes (not shown); is it a YAML config file?"}))
      << message;
  EXPECT_EQ(message.find("SECRET"), std::string::npos) << message;
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
}

// A 60k-deep --set value is not echoed whole (120 kB) into the error: values in messages are
// clipped to 80 bytes and their size.
TEST(ConfigOverride, HugeValuesAreClippedInErrors) {
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  const std::string message = error_message([&] { load_config("", {"train.lr=" + deep}); });
  EXPECT_LT(message.size(), 1000u) << message.substr(0, 2000);
  EXPECT_TRUE(contains_all(message, {"--set train.lr=[[[", "... (120009 bytes)"})) << message;
  const std::string long_text = std::string(5000, 'x');
  const std::string scalar = error_message([&] { load_config("", {"run.device=" + long_text}); });
  EXPECT_LT(scalar.size(), 1000u) << scalar.substr(0, 2000);
  EXPECT_TRUE(contains_all(scalar, {"run.device", "... (5000 bytes)"})) << scalar;
}

}  // namespace
}  // namespace xlme::config
