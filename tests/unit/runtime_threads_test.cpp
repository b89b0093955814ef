// run.threads=0 without OMP_NUM_THREADS divides the cores among the ranks the
// launcher put on this host, instead of giving every rank every core.
#include "xlme/common/runtime.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace xlme::runtime {
namespace {

using Vars = std::map<std::string, const char*>;

// Sets the launcher variables in `vars` for its lifetime, the others unset.
class LauncherEnv {
 public:
  explicit LauncherEnv(const Vars& vars) {
    for (const char* name : {"OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                             "SLURM_TASKS_PER_NODE", "SLURM_NODEID"}) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      const auto it = vars.find(name);
      if (it != vars.end() && it->second != nullptr) {
        ::setenv(name, it->second, 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  ~LauncherEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(Runtime, LocalRanksFromTheLaunchersVariables) {
  {
    const LauncherEnv env(Vars{});
    EXPECT_EQ(local_ranks_from_env().count, 1);
    EXPECT_EQ(local_ranks_from_env().source, "");
  }
  {
    const LauncherEnv env(Vars{{"LOCAL_WORLD_SIZE", "8"}, {"SLURM_NTASKS_PER_NODE", "4"}});
    EXPECT_EQ(local_ranks_from_env().count, 8);
    EXPECT_EQ(local_ranks_from_env().source, "LOCAL_WORLD_SIZE");
  }
  {
    const LauncherEnv env(Vars{{"SLURM_NTASKS_PER_NODE", "4"}});
    EXPECT_EQ(local_ranks_from_env().count, 4);
  }
  // SLURM_TASKS_PER_NODE: this node's entry, by SLURM_NODEID.
  for (const auto& [node, count] : std::map<const char*, int>{{"0", 2}, {"2", 2}, {"3", 1}}) {
    const LauncherEnv env(Vars{{"SLURM_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", node}});
    EXPECT_EQ(local_ranks_from_env().count, count) << node;
    EXPECT_EQ(local_ranks_from_env().source, "SLURM_TASKS_PER_NODE") << node;
  }
}

TEST(Runtime, ThreadsZeroDividesTheCoresAmongTheLocalRanks) {
  const int cores = available_cores();
  {
    const LauncherEnv env(Vars{{"LOCAL_WORLD_SIZE", "2"}});
    const ThreadSettings s = configure_threads(0);
    EXPECT_EQ(s.intra_op, std::max(1, cores / 2));
    EXPECT_EQ(s.source, std::to_string(cores) + " cores / 2 local ranks (LOCAL_WORLD_SIZE)");
    EXPECT_EQ(at::get_num_threads(), s.intra_op);
  }
  {
    // More ranks than cores: one thread each.
    const LauncherEnv env(Vars{{"SLURM_NTASKS_PER_NODE", "4096"}});
    EXPECT_EQ(configure_threads(0).intra_op, 1);
  }
  {
    // OMP_NUM_THREADS (the launcher's own share) and run.threads still come first.
    const LauncherEnv env(Vars{{"LOCAL_WORLD_SIZE", "2"}, {"OMP_NUM_THREADS", "3"}});
    EXPECT_EQ(configure_threads(0).intra_op, 3);
    EXPECT_EQ(configure_threads(5).intra_op, 5);
  }
  const LauncherEnv env(Vars{});
  EXPECT_EQ(configure_threads(0).source, "every available core");
}

}  // namespace
}  // namespace xlme::runtime
