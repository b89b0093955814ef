// Process-wide settings every binary applies at start: threads, OpenMP wait policy, BLAS check.
#pragma once

#include <cstdint>
#include <string>

namespace xlme::runtime {

// The BLAS library LibTorch's matrix products reach.
struct BlasInfo {
  std::string name;        // "OpenBLAS", "reference BLAS", "MKL", "LibTorch's built-in BLAS", ...
  std::string library;     // resolved path of the library that provides sgemm_, "" when built in
  std::string detail;      // e.g. OpenBLAS's build configuration
  bool reference = false;  // the unoptimized Netlib BLAS: ~15x slower matrix products
};

// Finds which loaded library provides `sgemm_` (the symbol LibTorch's CPU matmul calls).
BlasInfo detect_blas();

// Cores this process may run on (its CPU affinity mask).
int available_cores();

struct ThreadSettings {
  int intra_op = 1;             // LibTorch (OpenMP) threads
  int blas = 0;                 // OpenBLAS threads; 0 when OpenBLAS is not loaded
  std::string omp_wait_policy;  // OMP_WAIT_POLICY as this process started with it
};

// Sets LibTorch's intra-op threads and OpenBLAS's threads to `requested` (0: all available
// cores). Debian's LibTorch starts with 1 thread.
ThreadSettings configure_threads(int64_t requested);

// LibTorch's OpenMP threads busy-wait after each parallel region while OpenBLAS's own threads
// run the matrix products; on few cores that makes a training step up to 3x slower. libgomp
// reads OMP_WAIT_POLICY only when it is loaded, before main(), so when the variable is unset this
// sets it to PASSIVE and re-executes the binary with the same arguments (about 0.5 s). A user's
// own OMP_WAIT_POLICY is left alone. Returns only if no re-execution happened.
void ensure_passive_omp_wait_policy(char** argv);

// Hands the free memory of the C heap back to the operating system (glibc: malloc_trim(0), which
// also releases the free pages inside the heap, not only at its top); a no-op returning false with
// other C libraries. glibc keeps what LibTorch's CPU tensors free in its main heap for reuse; with
// micro-batches of changing shapes that heap fragments and its free pages stay resident: the demo
// pre-training run held ~0.9 GiB of free heap for ~85 MiB in use after 180 steps. Not free of
// cost: the next step faults the pages it reuses back in (train.release_memory).
bool release_free_memory();

// One line describing the build: xlme, LibTorch and CUDA versions.
std::string build_description();

}  // namespace xlme::runtime
