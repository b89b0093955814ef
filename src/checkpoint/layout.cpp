#include "xlme/checkpoint/layout.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/config/yaml_file.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>

namespace xlme::checkpoint {

std::string rank_file(int rank) {
  return fmt::format("rank{}.pt", rank);
}

std::string checkpoints_folder(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / kCheckpointsFolder).string();
}

namespace {

// A field of a checkpoint's trainer.yaml within [min, max], with errors that name the file and
// the field.
template <class T>
T trainer_field(const YAML::Node& state, const std::string& field, const std::string& file, T min,
                T max) {
  XLME_CHECK(state[field].IsDefined(), "checkpoint file '{}' is damaged: field '{}' is missing",
             file, field);
  T value{};
  try {
    value = state[field].as<T>();
  } catch (const YAML::Exception&) {
    XLME_FAIL("checkpoint file '{}' is damaged: field '{}' has the malformed value '{}'", file,
              field, state[field].IsScalar() ? state[field].Scalar() : "(not a value)");
  }
  XLME_CHECK(value >= min && value <= max,
             "checkpoint file '{}' is damaged: field '{}' is {}, outside {}..{}; restore the "
             "checkpoint from a copy, or resume from another checkpoint",
             file, field, value, min, max);
  return value;
}

// The largest step and token count a checkpoint may record: far beyond any run, and far enough
// from INT64_MAX that the run's step and token arithmetic cannot overflow.
constexpr int64_t kMaxCheckpointStep = 1'000'000'000'000'000;
constexpr int64_t kMaxCheckpointTokens = 1'000'000'000'000'000'000;
constexpr int kMaxCheckpointRanks = 1 << 16;

}  // namespace

TrainerState read_trainer_state(const std::string& file) {
  YAML::Node state;
  try {
    state = config::load_yaml_file(file);
  } catch (const YAML::Exception& e) {
    XLME_FAIL("checkpoint file '{}' is damaged: {}", file, e.what());
  }
  XLME_CHECK(state.IsMap(), "checkpoint file '{}' is damaged: it is not a YAML map", file);
  TrainerState t;
  t.step = trainer_field<int64_t>(state, "step", file, 0, kMaxCheckpointStep);
  t.tokens_seen = trainer_field<int64_t>(state, "tokens_seen", file, 0, kMaxCheckpointTokens);
  t.skipped_steps = trainer_field<int64_t>(state, "skipped_steps", file, 0, t.step);
  t.world_size = trainer_field<int>(state, "world_size", file, 1, kMaxCheckpointRanks);
  if (state["tokens_per_step"].IsDefined()) {
    t.tokens_per_step =
        trainer_field<int64_t>(state, "tokens_per_step", file, 1, kMaxCheckpointTokens);
  }
  return t;
}

void write_trainer_state(const std::string& file, const TrainerState& state) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "step" << YAML::Value << state.step << YAML::Key
      << "tokens_seen" << YAML::Value << state.tokens_seen << YAML::Key << "skipped_steps"
      << YAML::Value << state.skipped_steps << YAML::Key << "world_size" << YAML::Value
      << state.world_size;
  if (state.tokens_per_step > 0) {
    out << YAML::Key << "tokens_per_step" << YAML::Value << state.tokens_per_step;
  }
  out << YAML::EndMap;
  write_file_atomic(file, std::string(out.c_str()) + "\n");
}

}  // namespace xlme::checkpoint
