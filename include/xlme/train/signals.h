// Preemption: SIGTERM (schedulers), SIGINT (Ctrl-C), SIGUSR1 (SLURM's --signal), SIGHUP (a
// closed terminal or a dropped ssh session), SIGUSR2 and SIGXCPU (batch systems' warnings before a
// kill) only set a flag; the training loop polls it at each
// micro-step, all ranks agree on it, a checkpoint is written and the process exits with
// kExitPreempted. SIGPIPE is ignored: a closed console pipe does not end the run.
#pragma once

#include "xlme/common/exit_codes.h"

namespace xlme::train {

// Installs the handlers (idempotent).
void install_stop_signal_handlers();

// The stop signal received since installation, or 0.
int stop_signal();

// Forgets a received signal (for tests and after a handled stop).
void clear_stop_signal();

// Under a launcher wrapper that asks for it (scripts/xlme-torchrun sets XLME_EXIT_STATUS_DIR):
// writes `code` to <XLME_EXIT_STATUS_DIR>/rank<RANK> (SLURM_PROCID, else the pid). torchrun
// reports a worker's exit code 75 as a failure and exits 1; the wrapper reads the workers' codes
// and exits 75 when they stopped on a preemption. Without the variable it does nothing.
void record_exit_code(int code);

}  // namespace xlme::train
