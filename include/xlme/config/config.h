// The typed configuration of every xlme binary: one struct per area, parsed once from YAML.
//
// Each struct lists its fields once, in `visit`, with the allowed values and a one-line doc;
// the YAML reader, the writer (`--print-config`, checkpoints) and every error message are driven
// by that list, so a field cannot be readable but not printable, or checked in one place only.
// Defaults are the paper's Base recipe (XLM-E, Tables 8-10) unless a comment says otherwise.
#pragma once

#include "xlme/config/objective_set.h"
#include "xlme/config/schema.h"
#include "xlme/config/task_registry.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace xlme::config {

// Where a run writes, how loudly, on how many threads.
struct RunConfig {
  std::string out_dir = "runs/default";
  int64_t seed = 1;
  int64_t threads = 0;
  std::string log_level = "info";
  std::string device = "auto";

  template <class V>
  void visit(V& v) {
    v.field(
        "out_dir", out_dir,
        "run folder for logs, metrics and checkpoints (relative paths: to the working directory)");
    v.field("seed", seed, IntRange{0, 2147483647}, "seed of every random number generator");
    v.field("threads", threads, IntRange{0, 4096},
            "CPU threads for LibTorch and BLAS; 0 = OMP_NUM_THREADS when set (the launcher's "
            "share per rank), else the available cores divided among the ranks on this host "
            "(LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE, else counted at the "
            "rendezvous)");
    v.field("log_level", log_level, Choices{"trace", "debug", "info", "warn", "error", "off"},
            "console and log-file level");
    v.field("device", device, Choices{"auto", "cpu", "cuda"},
            "auto = cuda when available, else cpu");
  }
};

// Relative position bias of every attention layer (docs/ARCHITECTURE.md#model).
struct RelativePositionConfig {
  bool enabled = true;
  bool gated = true;
  int64_t num_buckets = 32;
  int64_t max_distance = 128;
  bool shared_across_layers = false;

  template <class V>
  void visit(V& v) {
    v.field(
        "enabled", enabled,
        "add a learned bias per head and relative-distance bucket (off: absolute positions only)");
    v.field("gated", gated,
            "gate the bias by the query (XLM-E's gated relative position bias); off: plain "
            "relative bias");
    v.field("num_buckets", num_buckets, IntRange{4, 1024},
            "bidirectional log-spaced distance buckets (even)");
    v.field("max_distance", max_distance, IntRange{2, 1048576},
            "distances at or beyond this share the last bucket");
    v.field("shared_across_layers", shared_across_layers,
            "one bias table for all layers instead of one per layer");
  }
};

// The generator; 0 in a size field means "the discriminator's value".
struct GeneratorConfig {
  int64_t layers = 4;
  int64_t hidden_size = 0;
  int64_t heads = 0;
  int64_t ffn_size = 0;
  double sampling_temperature = 1.0;

  template <class V>
  void visit(V& v) {
    v.field("layers", layers, IntRange{1, 1024},
            "generator Transformer layers (paper: 4 / 6 / 8 for Base / Large / XL)");
    v.field("hidden_size", hidden_size, IntRange{0, 65536},
            "0 = the discriminator's hidden size (the paper's setting)");
    v.field("heads", heads, IntRange{0, 1024}, "0 = the discriminator's number of heads");
    v.field("ffn_size", ffn_size, IntRange{0, 1048576}, "0 = the discriminator's FFN size");
    v.field("sampling_temperature", sampling_temperature, RealRange{0.0, 100.0, true, false},
            "temperature of replacement sampling from the generator's softmax");
  }
};

// model.norm: LayerNorm after each sub-layer (BERT) or before it (with a final LayerNorm).
enum class Norm { kPost, kPre };
inline const Named<Norm> kNorms{{"post", Norm::kPost}, {"pre", Norm::kPre}};

// model.embedding_sharing: ELECTRA's shared embeddings, or DeBERTa-v3's gradient-disentangled
// sharing (the discriminator adds its own zero-initialized delta to the shared tables).
enum class EmbeddingSharing { kFull, kGdes };
inline const Named<EmbeddingSharing> kEmbeddingSharings{{"full", EmbeddingSharing::kFull},
                                                        {"gdes", EmbeddingSharing::kGdes}};

// model.attention: the attention kernel, or auto (the model picks per device: model/attention.h).
enum class AttentionChoice { kAuto, kMath, kSdpa };
inline const Named<AttentionChoice> kAttentionChoices{{"auto", AttentionChoice::kAuto},
                                                      {"math", AttentionChoice::kMath},
                                                      {"sdpa", AttentionChoice::kSdpa}};

// model.share_layers: ALBERT's cross-layer parameter sharing, which sub-layers are one set of
// weights used at every depth.
enum class LayerSharing { kNone, kAll, kAttention, kFfn };
inline const Named<LayerSharing> kLayerSharings{{"none", LayerSharing::kNone},
                                                {"all", LayerSharing::kAll},
                                                {"attention", LayerSharing::kAttention},
                                                {"ffn", LayerSharing::kFfn}};

// The arguments one encoder is built from: every key of the model section but `generator`. The
// model code takes them resolved (discriminator_args, generator_args: no "0 = ..." left) and
// passes them as they are to the encoder, its layers, the attention and the cross-attention.
struct ModelArgs {
  int64_t vocab_size = 0;
  int64_t hidden_size = 768;
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t ffn_size = 3072;
  int64_t embedding_size = 0;
  int64_t max_positions = 512;
  bool absolute_positions = true;
  double dropout = 0.1;
  double attention_dropout = 0.1;
  double layer_norm_eps = 1e-5;
  Norm norm = Norm::kPost;
  double init_std = 0.02;
  EmbeddingSharing embedding_sharing = EmbeddingSharing::kFull;
  AttentionChoice attention = AttentionChoice::kAuto;
  LayerSharing share_layers = LayerSharing::kNone;
  bool cross_attention = false;
  RelativePositionConfig relative_position;

  template <class V>
  void visit(V& v) {
    v.field("vocab_size", vocab_size, IntRange{0, 2147483647},
            "0 = the tokenizer's size (data.tokenizer); XLM-R's vocabulary has 250002 ids");
    v.field("hidden_size", hidden_size, IntRange{1, 65536}, "discriminator width");
    v.field("layers", layers, IntRange{1, 1024}, "discriminator Transformer layers");
    v.field("heads", heads, IntRange{1, 1024}, "attention heads (must divide hidden_size)");
    v.field("ffn_size", ffn_size, IntRange{1, 1048576}, "feed-forward inner size");
    v.field("embedding_size", embedding_size, IntRange{0, 65536},
            "0 = hidden_size; smaller: factorized embeddings with a projection (ELECTRA-small)");
    v.field("max_positions", max_positions, IntRange{1, 1048576},
            "longest sequence the position embeddings cover");
    v.field("absolute_positions", absolute_positions, "learned absolute position embeddings");
    v.field("dropout", dropout, RealRange{0.0, 1.0, false, true},
            "dropout on embeddings and sub-layer outputs");
    v.field("attention_dropout", attention_dropout, RealRange{0.0, 1.0, false, true},
            "dropout on attention probabilities");
    v.field("layer_norm_eps", layer_norm_eps, RealRange{0.0, 1.0, true, true}, "LayerNorm epsilon");
    v.field("norm", norm, kNorms, "LayerNorm after (BERT, default) or before each sub-layer");
    v.field("init_std", init_std, RealRange{0.0, 1.0, true, false},
            "standard deviation of the N(0, std) initialization");
    v.field(
        "embedding_sharing", embedding_sharing, kEmbeddingSharings,
        "full = ELECTRA's shared embeddings; gdes = DeBERTa-v3's gradient-disentangled sharing");
    v.field("attention", attention, kAttentionChoices,
            "attention kernel: math = explicit softmax (any LibTorch); sdpa = "
            "scaled_dot_product_attention (LibTorch >= 2.0)");
    v.field("share_layers", share_layers, kLayerSharings,
            "ALBERT's cross-layer parameter sharing in each encoder: all = one layer's weights at "
            "every depth; attention / ffn = only that sub-layer (with its LayerNorm) shared");
    v.field("cross_attention", cross_attention,
            "VECO's cross-attention module in every layer, after the self-attention (trained by "
            "objectives.set=veco; exports and fine-tuning leave it out unless "
            "finetune.cross_attention=plug-in)");
    v.section("relative_position", relative_position,
              "gated relative position bias (docs/ARCHITECTURE.md#model)");
  }

  // Whether the attention (with its LayerNorm) / the FFN (with its LayerNorm) is one module for
  // every depth.
  bool shares_attention() const {
    return share_layers == LayerSharing::kAll || share_layers == LayerSharing::kAttention;
  }
  bool shares_ffn() const {
    return share_layers == LayerSharing::kAll || share_layers == LayerSharing::kFfn;
  }
};

// The encoders: the discriminator's arguments at top level, the generator's sizes under
// `generator`.
struct ModelConfig : ModelArgs {
  GeneratorConfig generator;

  template <class V>
  void visit(V& v) {
    ModelArgs::visit(v);
    v.section("generator", generator,
              "the generator encoder (shares the token and position embeddings)");
  }
};

// The discriminator's encoder: `model` with embedding_size resolved (0 = hidden_size).
ModelArgs discriminator_args(const ModelConfig& model);

// The generator's encoder: the discriminator's arguments with model.generator's layers and its
// sizes where they are not 0, the discriminator's embedding width (the tables are shared), plain
// sharing of those tables (gdes' delta is the discriminator's: the generator trains the tables
// themselves) and no cross-attention (VECO has no generator).
ModelArgs generator_args(const ModelConfig& model);

// Which losses a step optimizes: L = L_MLM + L_TLM + rtd_weight * (L_MRTD + L_TRTD).
struct ObjectivesConfig {
  std::string set = "xlme";  // a row of the objectives::objective_sets() table
  double rtd_weight = 50.0;
  double mask_ratio = 0.15;
  double mask_token_ratio = 1.0;

  template <class V>
  void visit(V& v) {
    v.field("set", set, Choices(objectives::objective_set_names()),
            objectives::objective_set_help());
    v.field("rtd_weight", rtd_weight, RealRange{0.0, 1e6, true, false},
            "lambda, the weight of the discriminator losses (paper: 50)");
    v.field("mask_ratio", mask_ratio, RealRange{0.0, 1.0, true, true},
            "fraction of real tokens selected for masking");
    v.field("mask_token_ratio", mask_token_ratio, RealRange{0.0, 1.0},
            "of the selected tokens, the fraction replaced by <mask> (ELECTRA: 0.85); the rest "
            "stay as they are");
  }
};

// objectives.set=distill: MiniLMv2's self-attention relation distillation of a frozen teacher
// into the discriminator-sized student that `model` describes (docs/pretraining.md#distillation).
struct DistillConfig {
  std::string teacher;
  int64_t teacher_layer = -1;
  int64_t relation_heads = 48;
  double hidden_cosine = 0.0;

  template <class V>
  void visit(V& v) {
    v.field("teacher", teacher,
            "the teacher: an xlme run, checkpoint or export folder (its discriminator, frozen)");
    v.field("teacher_layer", teacher_layer, IntRange{-1024, 1024},
            "teacher layer whose self-attention relations the student's last layer mimics: "
            "1..layers, or negative counting from the end (-1 = the last)");
    v.field("relation_heads", relation_heads, IntRange{1, 65536},
            "relation heads the Q, K, V projections are split into (must divide the student's "
            "and the teacher's hidden sizes; MiniLMv2: 48 for a base teacher)");
    v.field("hidden_cosine", hidden_cosine, RealRange{0.0, 1e6},
            "weight of DistilBERT's 1 - cos(student, teacher) on the last hidden states (needs "
            "equal widths); 0 = relations only");
  }
};

// SentencePiece training (xlme-data train-spm).
struct TokenizerTrainingConfig {
  int64_t vocab_size = 32000;
  std::string model_type = "unigram";
  double character_coverage = 0.9995;
  double sampling_exponent = 0.3;
  int64_t max_sentences = 10000000;

  template <class V>
  void visit(V& v) {
    v.field("vocab_size", vocab_size, IntRange{100, 4194304},
            "pieces in the trained model, special ids included");
    v.field("model_type", model_type, Choices{"unigram", "bpe"}, "SentencePiece algorithm");
    v.field("character_coverage", character_coverage, RealRange{0.0, 1.0, true, false},
            "fraction of characters the vocabulary must cover");
    v.field("sampling_exponent", sampling_exponent, RealRange{0.0, 1.0, true, false},
            "beta: sentences sampled per language with p_j ~ m_j^beta (XLM-R: 0.3)");
    v.field("max_sentences", max_sentences, IntRange{1, kNoLimit},
            "sentences sampled for training, over all languages");
  }
};

// One task's batches: MRTD reads monolingual text, TRTD translation pairs.
struct TaskDataConfig {
  int64_t max_len = 512;
  double sampling_exponent = 0.7;
  std::vector<std::string> languages;

  template <class V>
  void visit(V& v) {
    v.field("max_len", max_len, IntRange{8, 1048576},
            "longest sequence in tokens, special tokens included");
    v.field("sampling_exponent", sampling_exponent, RealRange{0.0, 1.0, true, false},
            "alpha: languages (pairs) sampled with p_j ~ m_j^alpha (paper: 0.7)");
    v.field(
        "languages", languages,
        "languages (mono) or pairs such as en-de (para) to train on; empty = all in data.shards");
  }
};

// Held-out translation pairs for validation during pre-training
// (docs/pretraining.md#validation-and-the-retrieval-probe): the demo corpus writes them to
// heldout/{dev,test}/en-<lang>.{en,<lang>}, split off by a hash of the English message so that they
// never enter mono/ or para/. Each pair's two sides are also the held-out monolingual text of their
// languages.
struct HeldoutConfig {
  std::string dir;
  std::vector<std::string> pairs;
  int64_t max_pairs = 200;

  template <class V>
  void visit(V& v) {
    v.field("dir", dir,
            "folder of held-out pairs <a>-<b>.<a> / <a>-<b>.<b> (line-aligned), e.g. "
            "data/demo/heldout/dev; empty = no validation");
    v.field("pairs", pairs, "pairs such as en-de to validate on; empty = every pair in dir");
    v.field("max_pairs", max_pairs, IntRange{2, 1000000},
            "first lines of each pair used (MRTD, TRTD and the retrieval probe)");
  }
};

// Limits of xlme-data binarize on damaged or hostile text.
struct BinarizeConfig {
  int64_t max_line_bytes = 1048576;
  double max_invalid_fraction = 0.01;

  template <class V>
  void visit(V& v) {
    v.field("max_line_bytes", max_line_bytes, IntRange{1024, 1073741824},
            "lines longer than this are skipped unread (counted in the report): memory per line "
            "stays bounded");
    v.field("max_invalid_fraction", max_invalid_fraction, RealRange{0, 1},
            "a file whose lines with invalid UTF-8 or NUL bytes exceed this fraction fails (not "
            "UTF-8 text: UTF-16, binary); fewer are skipped with a warning");
  }
};

// From raw text to batches (docs/ARCHITECTURE.md#data).
struct DataConfig {
  std::string tokenizer;
  std::string vocab_layout = "own";
  std::string shards = "data/shards";
  bool verify_shards = false;
  TaskDataConfig mono;
  TaskDataConfig para;
  std::string too_long = "drop";
  bool reset_positions = false;
  int64_t bucket_pool = 8192;
  int64_t loader_threads = 2;
  int64_t prefetch = 8;
  HeldoutConfig heldout;
  TokenizerTrainingConfig spm;
  BinarizeConfig binarize;

  template <class V>
  void visit(V& v) {
    v.field("tokenizer", tokenizer,
            "SentencePiece model file; empty until one is trained or given");
    v.field("vocab_layout", vocab_layout, Choices{"own", "xlmr"},
            "own = a model trained by xlme-data; xlmr = XLM-R's sentencepiece.bpe.model (fairseq "
            "ids, <mask> last)");
    v.field("shards", shards, "folder of binarized shards (xlme-data binarize --out)");
    v.field("verify_shards", verify_shards,
            "check the CRC32 of every shard when training opens it (reads every byte); header, "
            "sizes, offsets and token ids are always checked");
    v.section("mono", mono, "MRTD batches: monolingual sentences packed into sequences");
    v.section("para", para, "TRTD batches: <s> e </s> f </s>, bucketed by length");
    v.field("too_long", too_long, Choices{"drop", "truncate"},
            "what happens to a translation pair longer than para.max_len (and, for "
            "objectives.set=veco, a pair of adjacent sentences longer than mono.max_len)");
    v.field("reset_positions", reset_positions,
            "TRTD: position ids restart at f (f's first token gets e's first position); off: "
            "continuous");
    v.field("bucket_pool", bucket_pool, IntRange{1, 1073741824},
            "sentences (mono) or pairs (para) per bucketing pool: sequences are sorted by length "
            "and cut into micro-batches within a pool, whose micro-batches are then shuffled");
    v.field("loader_threads", loader_threads, IntRange{1, 256},
            "background threads that build batches");
    v.field("prefetch", prefetch, IntRange{1, 4096}, "batches built ahead of the training step");
    v.section("heldout", heldout, "held-out translation pairs for validation in pre-training");
    v.section("spm", spm, "SentencePiece training (xlme-data train-spm)");
    v.section("binarize", binarize, "xlme-data binarize");
  }
};

// The optimizer step and its schedule.
struct TrainConfig {
  int64_t steps = 125000;
  int64_t warmup_steps = 10000;
  double lr = 5e-4;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.98;
  double adam_eps = 1e-6;
  double weight_decay = 0.01;
  double clip_norm = 2.0;
  int64_t tokens_per_task = 1048576;
  int64_t micro_batch_tokens = 16384;
  std::string batch_rounding = "error";
  int64_t zero = 0;
  std::string precision = "auto";
  std::string cuda_graphs = "auto";
  int64_t log_every = 100;
  int64_t validate_every = 5000;
  bool validate_at_start = true;
  int64_t probe_layer = -1;
  std::string init_parts = "all";
  int64_t save_every = 5000;
  int64_t keep_last = 3;
  int64_t keep_every = 0;
  bool async_save = true;
  int64_t max_bad_steps = 20;
  bool release_memory = false;

  template <class V>
  void visit(V& v) {
    v.field("steps", steps, IntRange{1, kNoLimit}, "optimizer steps");
    v.field("warmup_steps", warmup_steps, IntRange{0, kNoLimit},
            "linear warm-up steps, then linear decay to 0");
    v.field("lr", lr, RealRange{0.0, 1.0, true, false}, "peak learning rate");
    v.field("adam_beta1", adam_beta1, RealRange{0.0, 1.0, false, true}, "AdamW beta1");
    v.field("adam_beta2", adam_beta2, RealRange{0.0, 1.0, false, true}, "AdamW beta2");
    v.field("adam_eps", adam_eps, RealRange{0.0, 1.0, true, true}, "AdamW epsilon");
    v.field("weight_decay", weight_decay, RealRange{0.0, 1.0},
            "decoupled weight decay (not on biases and LayerNorm)");
    v.field("clip_norm", clip_norm, RealRange{0.0, 1e6},
            "global gradient-norm clipping over both models; 0 = off");
    v.field("tokens_per_task", tokens_per_task, IntRange{1, kNoLimit},
            "global tokens per optimizer step for each task (ranks x micro-batches x tokens)");
    v.field("micro_batch_tokens", micro_batch_tokens, IntRange{1, kNoLimit},
            "tokens per micro-batch on one rank, padding included");
    v.field("batch_rounding", batch_rounding, Choices{"error", "up", "down"},
            "when tokens_per_task is not a whole number of micro-batches over the ranks: error = "
            "refuse, naming the nearest world sizes that divide it; up / down = round the global "
            "batch to whole micro-batches on every rank (said at start)");
    v.field("zero", zero, IntRange{0, 1},
            "ZeRO stage: 0 = every rank keeps the whole AdamW state; 1 = each rank keeps and "
            "steps 1/world of it (gradients reduce-scattered, weights all-gathered); checkpoints "
            "resume on any number of ranks either way");
    v.field("precision", precision, Choices{"auto", "fp32", "bf16"},
            "auto = bf16 autocast on CUDA, fp32 on CPU");
    v.field("cuda_graphs", cuda_graphs, Choices{"auto", "on", "off"},
            "CUDA graphs of the micro-batch forward and backward, captured per shape and replayed "
            "(every micro-batch of a step but the last; the generator's rows padded to one "
            "count): on, off, or auto = off until a GPU run has verified them (said at start)");
    v.field("log_every", log_every, IntRange{1, kNoLimit}, "steps between log lines");
    v.field("validate_every", validate_every, IntRange{0, kNoLimit},
            "steps between validations on data.heldout; 0 = never");
    v.field("validate_at_start", validate_at_start,
            "also validate before the first step of a run (and of a resumed run), so that curves "
            "have a starting point");
    v.field("probe_layer", probe_layer, IntRange{-1, 1024},
            "discriminator layer the retrieval probe mean-pools (0 = embeddings); -1 = "
            "model.layers / 2");
    v.field("init_parts", init_parts, Choices{"all", "generator", "discriminator"},
            "what --init-from loads: all weights, or the shared embeddings plus the generator "
            "(and its head) or the discriminator (and its head)");
    v.field("save_every", save_every, IntRange{0, kNoLimit},
            "steps between checkpoints; 0 = only at the end");
    v.field("keep_last", keep_last, IntRange{1, kNoLimit}, "newest checkpoints kept");
    v.field("keep_every", keep_every, IntRange{0, kNoLimit},
            "also keep every checkpoint whose step is a multiple of this; 0 = none");
    v.field("async_save", async_save,
            "periodic checkpoints: copy the model and optimizer state to host memory at the step "
            "boundary and write, verify and prune them on a background thread while training "
            "goes on (one save in flight; extra host memory about the size of model.pt + "
            "optimizer.pt); the last and the stop-signal checkpoints are always complete before "
            "the run ends. false = training waits for every save");
    v.field("max_bad_steps", max_bad_steps, IntRange{1, kNoLimit},
            "non-finite steps in a row before the run stops");
    v.field("release_memory", release_memory,
            "CPU: after every step and validation, hand the free pages of the C heap back to the "
            "OS (glibc malloc_trim). Without it the resident set grows with the fragmented heap "
            "(demo: 0.7 -> 1.7 GiB over 600 steps, < 0.1 GiB in use); with it it stays at about "
            "one step's working set, for ~20% of the tiny model's CPU throughput");
  }
};

// Multi-process training over c10d.
struct DistConfig {
  std::string backend = "auto";
  int64_t timeout_s = 1800;
  int64_t startup_timeout_s = 300;
  int64_t heartbeat_s = 30;
  int64_t bucket_mb = 25;
  bool overlap = true;

  template <class V>
  void visit(V& v) {
    v.field("backend", backend, Choices{"auto", "nccl", "gloo"},
            "auto = nccl on CUDA, gloo on CPU");
    v.field("timeout_s", timeout_s, IntRange{1, 604800}, "collective timeout in seconds");
    v.field("startup_timeout_s", startup_timeout_s, IntRange{1, 604800},
            "seconds every rank has to join the rendezvous at start (rank 0 names the ranks that "
            "did not), apart from the collectives' dist.timeout_s");
    v.field("heartbeat_s", heartbeat_s, IntRange{0, 86400},
            "a rank not heard from for this many seconds (dead, frozen or unreachable) stops the "
            "job on every rank, naming it and its host; each rank beats 5 times per period "
            "through the rendezvous store; 0 = no heartbeat (only dist.timeout_s)");
    v.field("bucket_mb", bucket_mb, IntRange{1, 65536},
            "size of the flat gradient buckets all-reduced together");
    v.field("overlap", overlap,
            "start each bucket's all-reduce during the last micro-batch's backward, as soon as "
            "its gradients are final (results bit-identical to off)");
  }
};

// Fine-tuning and evaluation on one XTREME task (xlme-finetune).
struct FinetuneConfig {
  std::string task = "xnli";
  std::string data_dir = "download";
  std::string gold_dir;
  std::string init;
  bool untrained = false;
  std::string train_language = "en";
  std::vector<std::string> languages;
  std::string tsv_quotes = "faithful";
  int64_t max_len = 128;
  int64_t batch_size = 32;
  int64_t eval_batch_size = 64;
  double lr = 2e-5;
  int64_t epochs = 2;
  int64_t max_steps = 0;
  double warmup_ratio = 0.1;
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double layer_lr_decay = 1.0;
  double clip_norm = 1.0;
  double dropout = 0.1;
  std::string precision = "auto";
  std::string cross_attention = "plug-out";
  int64_t eval_every = 0;
  std::string select = "best_dev";
  std::vector<int64_t> seeds = {1};
  int64_t max_train_examples = 0;
  int64_t max_eval_examples = 0;
  std::string train_file;
  std::string dev_file;
  int64_t doc_stride = 128;
  int64_t max_query_len = 64;
  int64_t n_best = 20;
  int64_t max_answer_len = 30;
  int64_t layer = 8;
  bool sweep_layers = false;
  int64_t retrieval_max_len = 512;
  std::string alignment_method = "argmax";
  std::vector<std::string> pairs;
  int64_t min_sentences = 0;
  bool compare_untrained = false;

  template <class V>
  void visit(V& v) {
    // The rows of config/task_registry.h.
    v.field("task", task, Choices(finetune::task_names()),
            "XTREME task; retrieval = line-aligned held-out pairs (the demo corpus), alignment = "
            "word-alignment probe (AER)");
    v.field("data_dir", data_dir,
            "XTREME's download/ folder (download/<task>/...); for retrieval a folder of "
            "<src>-<tgt>.<src>/.<tgt> files; for alignment the folder of the pairs' files");
    v.field("gold_dir", gold_dir,
            "upstream files with the test gold XTREME removed (see configs/finetune/README.md); "
            "empty = score only test files that carry labels");
    v.field("init", init,
            "pre-training run folder (its newest valid checkpoint), checkpoint or export folder");
    v.field("untrained", untrained,
            "use init's architecture and tokenizer with freshly initialized weights (baseline)");
    v.field("train_language", train_language,
            "language trained on and used for model selection (zero-shot: en)");
    v.field("languages", languages, "languages evaluated; empty = the task's XTREME list");
    v.field("tsv_quotes", tsv_quotes, Choices{"faithful", "unquoted"},
            "faithful = XTREME's reader (doubled quotes stay in the text, as published results); "
            "unquoted = proper CSV unquoting");
    v.field("max_len", max_len, IntRange{8, 1048576}, "longest input in tokens");
    v.field("batch_size", batch_size, IntRange{1, kNoLimit}, "training batch size in examples");
    v.field("eval_batch_size", eval_batch_size, IntRange{1, kNoLimit},
            "evaluation batch size in examples");
    v.field("lr", lr, RealRange{0.0, 1.0, true, false}, "peak learning rate");
    v.field("epochs", epochs, IntRange{1, 100000}, "training epochs");
    v.field("max_steps", max_steps, IntRange{0, kNoLimit},
            "stop after this many updates; 0 = the epochs decide");
    v.field("warmup_ratio", warmup_ratio, RealRange{0.0, 1.0, false, true},
            "fraction of steps spent in linear warm-up (unless warmup_steps is set)");
    v.field("warmup_steps", warmup_steps, IntRange{0, kNoLimit},
            "linear warm-up steps; 0 = use warmup_ratio");
    v.field("weight_decay", weight_decay, RealRange{0.0, 1.0},
            "decoupled weight decay (not on biases and LayerNorm)");
    v.field("layer_lr_decay", layer_lr_decay, RealRange{0.0, 1.0, true, false},
            "learning rate multiplied by this per layer below the top; 1 = off");
    v.field("clip_norm", clip_norm, RealRange{0.0, 1e6}, "gradient-norm clipping; 0 = off");
    v.field("dropout", dropout, RealRange{0.0, 1.0, false, true},
            "dropout of the encoder and the task head while fine-tuning");
    v.field("precision", precision, Choices{"auto", "fp32", "bf16"},
            "as train.precision: auto = bf16 autocast (and TF32 matmuls) on CUDA, fp32 on CPU");
    v.field("cross_attention", cross_attention, Choices{"plug-out", "plug-in"},
            "VECO models (objectives.set=veco): plug-out = the self-attention stack alone; plug-in "
            "= sentence-pair tasks (xnli, pawsx) run each sentence with cross-attention to the "
            "other (needs init = a VECO run or checkpoint, not an export)");
    v.field("eval_every", eval_every, IntRange{0, kNoLimit},
            "steps between dev evaluations; 0 = once per epoch");
    v.field("select", select, Choices{"best_dev", "last"},
            "best_dev = keep the weights with the best train-language dev score; last = the final "
            "weights (XTREME's QA recipe)");
    v.field("seeds", seeds, IntRange{0, 2147483647}, "one run per seed; results as mean and std");
    v.field("max_train_examples", max_train_examples, IntRange{0, kNoLimit},
            "use only the first N training examples; 0 = all");
    v.field("max_eval_examples", max_eval_examples, IntRange{0, kNoLimit},
            "evaluate only the first N examples per language; 0 = all");
    v.field("train_file", train_file,
            "QA: the SQuAD-format training file, relative to data_dir or absolute; empty = "
            "XTREME's: squad/train-v1.1.json (xquad, mlqa), "
            "tydiqa/tydiqa-goldp-v1.1-train/tydiqa.goldp.<train_language>.train.json (tydiqa)");
    v.field("dev_file", dev_file,
            "QA: the train language's dev file (model selection), relative to data_dir or "
            "absolute; empty = XTREME's: mlqa/MLQA_V1/dev/dev-context-<lang>-question-<lang>.json "
            "(mlqa); xquad and tydiqa have none");
    v.field("doc_stride", doc_stride, IntRange{1, kNoLimit}, "QA: step between window starts");
    v.field("max_query_len", max_query_len, IntRange{1, kNoLimit},
            "QA: questions are truncated to this many tokens");
    v.field("n_best", n_best, IntRange{1, kNoLimit}, "QA: start/end candidates per window");
    v.field("max_answer_len", max_answer_len, IntRange{1, kNoLimit},
            "QA: longest answer in tokens");
    v.field("layer", layer, IntRange{0, 1024},
            "retrieval/alignment: hidden states after this layer (0 = embeddings; XTREME uses "
            "block 8)");
    v.field("sweep_layers", sweep_layers, "retrieval: report every layer (the paper's Figure 3)");
    v.field("retrieval_max_len", retrieval_max_len, IntRange{3, 1048576},
            "retrieval/alignment: sentences are truncated to this many tokens with <s> and </s>");
    v.field("alignment_method", alignment_method, Choices{"argmax", "ot"},
            "alignment: argmax in both directions intersected, or optimal transport");
    v.field("pairs", pairs,
            "retrieval/alignment: language pairs like en-de; empty = every pair found in data_dir");
    v.field("min_sentences", min_sentences, IntRange{0, kNoLimit},
            "retrieval: skip language pairs with fewer sentence pairs than this");
    v.field("compare_untrained", compare_untrained,
            "retrieval/alignment: also evaluate init's architecture untrained, side by side");
  }
};
struct ExportConfig {
  std::string checkpoint;
  std::string out_dir = "export";
  bool with_generator = false;
  std::string dtype = "fp32";

  template <class V>
  void visit(V& v) {
    v.field("checkpoint", checkpoint,
            "checkpoint folder to export, or a run folder (its newest valid checkpoint)");
    v.field("out_dir", out_dir, "export folder (model.safetensors, config.json, tokenizer)");
    v.field("with_generator", with_generator, "also export the generator and its head");
    v.field("dtype", dtype, Choices{"fp32", "bf16"}, "dtype of the exported weights");
  }
};

// Everything a binary can be configured with. Binaries read the sections they need; a resolved
// Config is written into every checkpoint and reads back identically.
struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  ObjectivesConfig objectives;
  DistillConfig distill;
  TrainConfig train;
  DistConfig dist;
  FinetuneConfig finetune;
  ExportConfig export_;

  template <class V>
  void visit(V& v) {
    v.section("run", run, "where the run writes, logging, threads");
    v.section("model", model, "generator and discriminator encoders");
    v.section("data", data, "tokenizer, shards, batches");
    v.section("objectives", objectives, "losses and masking");
    v.section("distill", distill, "distillation of a teacher (objectives.set=distill)");
    v.section("train", train, "optimizer, schedule, checkpoints");
    v.section("dist", dist, "multi-process training over c10d");
    v.section("finetune", finetune, "XTREME fine-tuning and evaluation");
    v.section("export", export_, "portable model folder");
  }
};

// Resolves a config: defaults < `path` (with its `include:` files) < each `--set key=value`.
// `path` may be empty (defaults only). Throws xlme::Error naming the file, line and key of any
// unknown key, wrong type, out-of-range value, missing file or malformed YAML.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Checks a model config that load_config did not read (an export's config.json) against the same
// limits: each field's range as ModelConfig::visit lists it, then the constraints between fields
// that load_config checks. Errors start with `source` ("export config 'm/config.json'") and name
// the key as that file spells it, without "model.".
void validate_model(const ModelConfig& model, const std::string& source);

// The resolved config as YAML that load_config reads back identically; with `docs`, each key is
// preceded by a comment with its meaning and allowed values.
std::string to_yaml(const Config& config, bool docs = false);

// Every key of `yaml` (to_yaml's or a checkpoint's config.yaml) as "section.key" -> its YAML
// text, lists included ("model.generator.layers" -> "4"): what differs between two configs.
std::map<std::string, std::string> flat_values(const std::string& yaml);

// Writes to_yaml(config) to `path` atomically (temporary file, fsync, rename).
void save_config(const Config& config, const std::string& path);

}  // namespace xlme::config
