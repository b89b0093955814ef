#include "xlme/cli/app.h"

#include "xlme/common/error.h"
#include "xlme/common/logging.h"
#include "xlme/common/runtime.h"
#include "xlme/dist/launch.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <filesystem>
#include <iostream>
#include <vector>

namespace xlme {
namespace {

struct CommonOptions {
  std::string config;
  std::vector<std::string> sets;
  bool print_config = false;
  std::string log_level;
  int threads = -1;
};

// Before logging is set up, errors go straight to stderr.
int report(bool logging_ready, const std::string& name, const std::string& message,
           const std::string& location) {
  const std::string text = message + runtime::address_space_note(message);
  if (logging_ready) {
    spdlog::error("{}", text);
    spdlog::debug("raised at {}", location);
  } else {
    std::cerr << name << ": error: " << text << "\n";
  }
  return kExitError;
}

}  // namespace

int run_app(int argc, char** argv, const AppSpec& spec,
            const std::function<int(const config::Config&)>& body,
            const std::function<void(CLI::App&)>& add_options) {
  CLI::App cli{spec.summary, spec.name};
  CommonOptions opts;
  cli.add_option("--config", opts.config, "YAML config file (it may `include:` others)")
      ->type_name("FILE");
  cli.add_option("--set", opts.sets,
                 "override one key, e.g. --set train.lr=1e-4 (repeatable; applied after --config)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli.add_flag("--print-config", opts.print_config,
               "print the resolved config (with comments) and exit");
  cli.add_option("--log-level", opts.log_level, "shortcut for --set run.log_level=LEVEL")
      ->type_name("LEVEL");
  cli.add_option("--threads", opts.threads,
                 "shortcut for --set run.threads=N (0: OMP_NUM_THREADS if set, else all cores)")
      ->type_name("N");
  cli.set_version_flag("--version", [] { return runtime::build_description(); });
  cli.footer(
      "Environment: OMP_WAIT_POLICY (default PASSIVE); XLME_ALLOCATOR=tcmalloc (default, when "
      "libtcmalloc-minimal4 is installed) or system (glibc malloc).\n"
      "Exit codes: 0 success, 1 error (the message says what to fix), 2 bad command line, 75 "
      "stopped by a signal after saving a checkpoint (xlme-pretrain: rerun the same command to "
      "resume).");
  if (add_options) add_options(cli);
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = cli.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  bool logging_ready = false;
  try {
    std::vector<std::string> overrides = opts.sets;
    if (!opts.log_level.empty()) overrides.push_back("run.log_level=" + opts.log_level);
    if (opts.threads >= 0) overrides.push_back("run.threads=" + std::to_string(opts.threads));
    const config::Config cfg = config::load_config(opts.config, overrides);
    if (opts.print_config) {
      std::cout << config::to_yaml(cfg, /*docs=*/true);
      return kExitOk;
    }

    runtime::ensure_process_defaults(argv);
    const int rank = dist::launch_info_from_env().rank;
    logging::Options log_options{cfg.run.log_level, rank, ""};
    if (spec.run_logs && !(spec.prints_only && spec.prints_only())) {
      // The run writes logs/, checkpoints/, metrics.jsonl... into run.out_dir, never into '/'.
      std::error_code ec;
      const auto out_dir =
          std::filesystem::weakly_canonical(std::filesystem::absolute(cfg.run.out_dir), ec);
      XLME_CHECK(out_dir != out_dir.root_path(),
                 "run.out_dir '{}' is the root of the file system: the run would write its logs/, "
                 "checkpoints/ and metrics.jsonl there; choose a folder for the run (e.g. "
                 "runs/NAME)",
                 cfg.run.out_dir);
      log_options.dir = (std::filesystem::path(cfg.run.out_dir) / "logs").string();
    }
    const std::string log_file = logging::init(log_options);
    logging_ready = true;
    spdlog::info("{} - {}", spec.name, runtime::build_description());
    if (!log_file.empty()) spdlog::info("log file: {}", log_file);
    spdlog::debug("resolved config:\n{}", config::to_yaml(cfg));

    const runtime::ThreadSettings threads = runtime::configure_threads(cfg.run.threads);
    const runtime::AllocatorInfo allocator = runtime::detect_allocator();
    spdlog::info(
        "threads: {} LibTorch (from {}; {} in xlme's own loops), BLAS: {}, OMP_WAIT_POLICY={}, "
        "allocator: {} ({})",
        threads.intra_op, threads.source, threads.own_loops, runtime::blas_name(),
        threads.omp_wait_policy.empty() ? "(unset: threads may spin)" : threads.omp_wait_policy,
        allocator.name, allocator.note.empty() ? allocator.library : allocator.note);
    if (threads.own_loops < threads.intra_op) {
      spdlog::warn(
          "xlme's own CPU kernels run on {} of {} threads: this build of xlme was compiled "
          "without OpenMP, which LibTorch's at::parallel_for needs (CMakeLists.txt links "
          "OpenMP::OpenMP_CXX); rebuild with scripts/setup.sh",
          threads.own_loops, threads.intra_op);
    }
    return body(cfg);
  } catch (const Error& e) {
    return report(logging_ready, spec.name, e.what(), e.location());
  } catch (const std::exception& e) {
    return report(logging_ready, spec.name, fmt::format("internal error: {}", e.what()), "unknown");
  }
}

}  // namespace xlme
