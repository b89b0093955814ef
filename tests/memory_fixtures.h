// Memory figures for tests that bound what a reader allocates.
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace xlme::testing {

// The largest resident memory so far, in MiB, of this process (RUSAGE_SELF) or of the largest
// child it waited for (RUSAGE_CHILDREN).
inline int64_t peak_rss_mib(int who = RUSAGE_SELF) {
  rusage usage{};
  ::getrusage(who, &usage);
  return usage.ru_maxrss / 1024;
}

}  // namespace xlme::testing
