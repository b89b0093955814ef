// Process-wide settings every binary applies at start: threads, OpenMP wait policy, allocator,
// the start-up line.
#pragma once

#include <cstdint>
#include <string>

namespace xlme::runtime {

// The BLAS LibTorch's matrix products use: PyPI's x86-64 wheels link MKL into libtorch_cpu
// (at::hasMKL()); the name is for the start-up line.
std::string blas_name();

// Cores this process may run on (its CPU affinity mask).
int available_cores();

struct ThreadSettings {
  int intra_op = 1;             // LibTorch (OpenMP) threads
  int own_loops = 1;            // threads xlme's own parallel loops run on (parallel_loop_threads)
  std::string omp_wait_policy;  // OMP_WAIT_POLICY as this process started with it
  std::string source;           // what decided intra_op: run.threads, OMP_NUM_THREADS or the cores
};

// How many ranks of the job run on this host, from the launcher: LOCAL_WORLD_SIZE (torchrun),
// SLURM_NTASKS_PER_NODE, or this node's entry of SLURM_TASKS_PER_NODE ("2(x3),1", SLURM_NODEID);
// 1 with source "" when none says.
struct LocalRanks {
  int count = 1;
  std::string source;  // the variable that said it
};
LocalRanks local_ranks_from_env();

// Sets LibTorch's intra-op threads to `requested`; with 0, to OMP_NUM_THREADS when it is set (the
// launcher's share of the node for this rank), else to the available cores divided among the
// host's ranks (local_ranks_from_env, else `counted`: the ranks the rendezvous found on this
// host), at least 1. Throws naming a
// malformed OMP_NUM_THREADS.
ThreadSettings configure_threads(int64_t requested, const LocalRanks& counted = {});

// How many threads an at::parallel_for in xlme's own code runs on, with LibTorch's current
// intra-op threads: a loop of that many items, each noting its thread. at::parallel_for's OpenMP
// backend is a pragma in a LibTorch header, so it takes effect only where xlme itself is compiled
// with OpenMP (CMakeLists.txt); else every own CPU kernel runs on one thread. Called from a
// parallel region, it answers 1.
int parallel_loop_threads();

// The allocator that serves malloc in this process.
struct AllocatorInfo {
  std::string name;     // "tcmalloc", "jemalloc", "glibc malloc", else the library's file name
  std::string library;  // resolved path of the library that provides malloc
  std::string note;     // why glibc malloc serves this process; "" otherwise
};

// Finds which loaded library provides `malloc` (the first definition in the global scope, where
// LD_PRELOAD puts its libraries).
AllocatorInfo detect_allocator();

// Path of the tcmalloc the binaries preload (Debian's libtcmalloc-minimal4,
// libtcmalloc_minimal.so.4 beside the C library or in /usr/lib); "" when it is not installed.
std::string tcmalloc_library();

// LD_PRELOAD with `library` appended (colon-separated), unchanged when it is there already.
std::string preload_with(const std::string& preload, const std::string& library);

// Process defaults that must be in place before the program loads, set by re-executing the binary
// once with the same arguments (about 0.5 s) when one is missing; returns only if no
// re-execution happened:
// - OMP_WAIT_POLICY=PASSIVE when unset. LibTorch's OpenMP threads busy-wait after each parallel
//   region while other threads need the cores, which on few cores slows a training step several
//   times over (docs/performance.md; scripts/bench_threads.sh measures it).
//   libgomp reads the variable only when it is loaded, before main(). A user's own OMP_WAIT_POLICY
//   is left alone.
// - tcmalloc appended to LD_PRELOAD when it is installed and malloc is glibc's. glibc returns
//   the large tensors freed every step to the OS and faults them back in on the next, and keeps
//   what it does not return in a fragmented, resident heap (peak RSS of about twice tcmalloc's
//   at the same speed: docs/performance.md). XLME_ALLOCATOR=system keeps glibc malloc; an
//   allocator the user preloads (e.g. jemalloc) is kept; without tcmalloc the run goes on with
//   glibc malloc (detect_allocator() says why).
// Throws when XLME_ALLOCATOR is neither tcmalloc nor system.
void ensure_process_defaults(char** argv);

// When `message` reports a failed memory allocation and the process runs under an address-space
// limit (`ulimit -v`, RLIMIT_AS), a sentence to append naming the limit, what the process has
// mapped and what to do: such a limit fails allocations long before memory runs out, since the
// libraries alone map gigabytes. "" otherwise.
std::string address_space_note(const std::string& message);

// Hands the free memory of the C heap back to the operating system (tcmalloc:
// MallocExtension_ReleaseFreeMemory; glibc: malloc_trim(0), which also releases the free pages
// inside the heap, not only at its top); a no-op returning false with other C libraries. glibc
// keeps what LibTorch's CPU tensors free in its main heap for reuse; with micro-batches of changing
// shapes that heap fragments and its free pages stay resident, many times what is in use
// (docs/performance.md). Not free of cost: the next step faults the pages it reuses back in
// (train.release_memory).
bool release_free_memory();

// One line describing the build: xlme, LibTorch and CUDA versions.
std::string build_description();

}  // namespace xlme::runtime
