// The exit codes of every binary, in one place (xlme-<tool> --help lists them).
#pragma once

namespace xlme {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // bad input, bad config, a failed run: see the message
constexpr int kExitUsage = 2;  // bad command line
// A run stopped by SIGTERM, SIGINT, SIGUSR1 or SIGHUP after saving its checkpoint: 75 (EX_TEMPFAIL,
// "try again"), which requeue scripts test for; rerunning the same command resumes it.
constexpr int kExitPreempted = 75;

}  // namespace xlme
