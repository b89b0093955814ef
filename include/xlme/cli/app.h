// The command-line contract every binary shares (docs/configuration.md#command-line-options):
// --config, repeatable --set,
// --print-config, --log-level, --threads, --version, --help; errors as one clear message and a
// documented exit code.
#pragma once

#include "xlme/common/exit_codes.h"
#include "xlme/config/config.h"

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace xlme {

struct AppSpec {
  std::string name;       // "xlme-pretrain"
  std::string summary;    // one line for --help
  bool run_logs = false;  // also log to <run.out_dir>/logs/rank<N>.log
  // Called after parsing: true when the options given only print something (a parameter table,
  // an estimate) and the run's folder must not be created for the log file.
  std::function<bool()> prints_only = nullptr;
};

// Parses the command line, resolves the config, prints it for --print-config, then sets up
// logging, threads and the OpenMP wait policy, checks the BLAS, and calls `body`. Every
// xlme::Error (and any other exception) becomes one "error:" line and kExitError.
// `add_options` may add the binary's own options to the CLI11 app before parsing.
int run_app(int argc, char** argv, const AppSpec& spec,
            const std::function<int(const config::Config&)>& body,
            const std::function<void(CLI::App&)>& add_options = {});

}  // namespace xlme
