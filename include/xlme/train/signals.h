// Preemption: SIGTERM (schedulers), SIGINT (Ctrl-C) and SIGUSR1 (SLURM's --signal) only set a
// flag; the training loop polls it at each micro-step, all ranks agree on it, a checkpoint is
// written and the process exits with kExitPreempted.
#pragma once

#include "xlme/common/exit_codes.h"

namespace xlme::train {

// Installs the handlers (idempotent).
void install_stop_signal_handlers();

// The signal received since installation (SIGTERM, SIGINT or SIGUSR1), or 0.
int stop_signal();

// Forgets a received signal (for tests and after a handled stop).
void clear_stop_signal();

}  // namespace xlme::train
