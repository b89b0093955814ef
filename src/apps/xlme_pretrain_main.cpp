// xlme-pretrain: pre-train XLM-E: generator + discriminator, MLM + TLM + MRTD + TRTD, DDP over c10d
#include "xlme/cli/app.h"
#include "xlme/common/error.h"
#include "xlme/model/electra.h"
#include "xlme/model/parameter_count.h"
#include "xlme/train/benchmark.h"
#include "xlme/train/comm_estimate.h"
#include "xlme/train/distill.h"
#include "xlme/train/pretrain.h"
#include "xlme/train/signals.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <iostream>

int main(int argc, char** argv) {
  // First: a stop signal during start-up (config, rendezvous, data) is honoured at the first step
  // (checkpoint, exit code 75) instead of killing the process.
  xlme::train::install_stop_signal_handlers();
  bool print_model = false;
  bool comm_estimate = false;
  int64_t benchmark_steps = 0;
  const xlme::AppSpec spec{
      "xlme-pretrain",
      "pre-train XLM-E: generator + discriminator, MLM + TLM + MRTD + TRTD, DDP over c10d",
      /*run_logs=*/true, [&] { return print_model || comm_estimate; }};
  std::string profile_path;
  std::string save_dir;
  xlme::train::PretrainOptions run_options;
  const int code = xlme::run_app(
      argc, argv, spec,
      [&](const xlme::config::Config& config) {
        if (print_model) {
          XLME_CHECK(config.model.vocab_size > 0,
                     "--print-model needs model.vocab_size (0 = the tokenizer's size, read only "
                     "when training starts); add e.g. --set model.vocab_size=250002");
          // Counted from the config: building the model only to count it would allocate all of it.
          const auto architecture = xlme::model::architecture_for(config.objectives.set);
          std::cout << xlme::model::format_parameter_table(
              xlme::model::analytic_parameter_counts(config.model, architecture));
          if (architecture == xlme::model::Architecture::kEncoder) {
            const auto teacher = xlme::train::load_teacher(config);
            std::cout << fmt::format(
                "teacher (frozen, not trained or saved): {} parameters, {} layers; relations of "
                "layer {}\n",
                xlme::train::teacher_parameter_count(teacher), teacher.encoder->args().layers,
                teacher.layer);
          }
          return xlme::kExitOk;
        }
        if (comm_estimate) {
          XLME_CHECK(config.model.vocab_size > 0,
                     "--comm-estimate needs model.vocab_size (0 = the tokenizer's size); add e.g. "
                     "--set model.vocab_size=250002");
          std::cout << xlme::train::format_communication_estimate(config);
          return xlme::kExitOk;
        }
        if (benchmark_steps > 0) {
          std::cout << xlme::train::run_benchmark(config, benchmark_steps, profile_path, save_dir)
                    << std::endl;
          return xlme::kExitOk;
        }
        return xlme::train::run_pretraining(config, run_options);
      },
      [&](CLI::App& cli) {
        cli.add_flag("--print-model", print_model,
                     "print the model's parameter count per module, computed from the config "
                     "(nothing is allocated), and exit");
        cli.add_flag("--comm-estimate", comm_estimate,
                     "print the gradient communication of one step on 8 and 64 GPUs (NVLink 4, "
                     "400 Gb/s InfiniBand), estimated from the configured model's gradient "
                     "bytes, and exit");
        auto* benchmark =
            cli.add_option(
                   "--benchmark", benchmark_steps,
                   "run N optimizer steps on synthetic batches of the configured shapes and "
                   "print tokens/s and the time split as one JSON line")
                ->type_name("N")
                ->check(CLI::PositiveNumber);
        cli.add_option("--profile", profile_path,
                       "with --benchmark: run the N steps once more under LibTorch's profiler and "
                       "write the time per operator (self and total ms per step) to FILE")
            ->type_name("FILE")
            ->needs(benchmark);
        cli.add_option("--benchmark-save", save_dir,
                       "with --benchmark: also time the checkpoint saves (train.async_save false "
                       "and true: how long a step waits) into a temporary folder under DIR, "
                       "removed afterwards")
            ->type_name("DIR")
            ->needs(benchmark);
        cli.add_option("--resume", run_options.resume,
                       "auto: continue from the newest valid checkpoint in run.out_dir (default); "
                       "none: start fresh; or a checkpoint folder")
            ->type_name("auto|none|DIR");
        cli.add_flag("--allow-data-change", run_options.allow_data_change,
                     "resume although the shards differ from the checkpoint's (languages added, "
                     "removed or re-binarized); what changed is logged");
        cli.add_flag("--overwrite", run_options.overwrite,
                     "with --resume none in a run.out_dir that holds checkpoints: move them and "
                     "metrics.jsonl aside to <run.out_dir>/replaced-<time>/ and start afresh "
                     "(without it such a run refuses to start)");
        cli.add_option("--init-from", run_options.init_from,
                       "start a fresh run (step 0, new optimizer) from the weights of this "
                       "pre-training checkpoint folder or HF XLM-R checkpoint folder "
                       "(safetensors); train.init_parts picks all, generator or discriminator; "
                       "ignored when the run resumes from its own checkpoint")
            ->type_name("DIR");
      });
  xlme::train::record_exit_code(code);
  return code;
}
