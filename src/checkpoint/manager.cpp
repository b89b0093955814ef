#include "xlme/checkpoint/manager.h"

#include "messages.h"
#include "xlme/checkpoint/layout.h"
#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"
#include "xlme/config/yaml_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <random>
#include <regex>

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "xlme-checkpoint";
constexpr int kFormatVersion = 1;

// "step_00001200" -> 1200; -1 for other names (temporaries included).
int64_t step_of(const std::string& name) {
  static const std::regex pattern("step_([0-9]{1,18})");
  std::smatch match;
  if (!std::regex_match(name, match, pattern)) return -1;
  return std::stoll(match[1].str());
}

// A manifest field, with errors that name the manifest and the field.
template <class T>
T manifest_field(const YAML::Node& node, const std::string& field, const std::string& manifest) {
  XLME_CHECK(node.IsDefined() && !node.IsNull(),
             "checkpoint manifest '{}' is damaged: field '{}' is missing", manifest, field);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    XLME_FAIL("checkpoint manifest '{}' is damaged: field '{}' has the malformed value '{}'",
              manifest, field, node.IsScalar() ? node.Scalar() : std::string("(not a value)"));
  }
}

// Whether a manifest entry names a file directly inside the checkpoint folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

// A checkpoint of a newer format is not damaged: it is named so, with what to do.
std::string newer_format_message(const std::string& path, int version) {
  return fmt::format(
      "checkpoint '{}' was written by a newer xlme (checkpoint format version {}; this build "
      "reads version {}); it is not damaged. Upgrade xlme to read it, or point to an older "
      "checkpoint (--resume DIR, finetune.init or --checkpoint with a step_<N> folder)",
      path, version, kFormatVersion);
}

// The format version that checkpoint `path`'s manifest records; nullopt when it records none
// readable (verify() then says what is wrong).
std::optional<int> manifest_version(const std::string& path) {
  const std::string manifest_path = (fs::path(path) / kManifestFile).string();
  std::error_code ec;
  if (fs::symlink_status(manifest_path, ec).type() != fs::file_type::regular) return std::nullopt;
  try {
    const YAML::Node manifest = config::load_yaml_file(manifest_path);
    if (manifest.IsMap() && manifest["version"].IsScalar()) return manifest["version"].as<int>();
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The parsed manifest of checkpoint `path`, its format and version checked.
YAML::Node load_manifest(const std::string& path) {
  std::error_code ec;
  XLME_CHECK(fs::exists(path, ec), "checkpoint '{}' does not exist; check the path", path);
  XLME_CHECK(fs::is_directory(path, ec), "checkpoint '{}' is not a folder; give a step_<N> folder",
             path);
  const std::string manifest_path = (fs::path(path) / kManifestFile).string();
  const fs::file_type type = fs::symlink_status(manifest_path, ec).type();
  XLME_CHECK(type != fs::file_type::not_found, "checkpoint '{}' has no {}: its save did not finish",
             path, kManifestFile);
  XLME_CHECK(type == fs::file_type::regular,
             "checkpoint '{}': {} is not a file (a symbolic link or something else); a checkpoint "
             "holds its own files: do not load this checkpoint",
             path, kManifestFile);
  YAML::Node manifest;
  try {
    manifest = config::load_yaml_file(manifest_path);  // duplicate keys refused
  } catch (const YAML::Exception& e) {
    XLME_FAIL("checkpoint manifest '{}' is damaged: {}", manifest_path, e.what());
  }
  XLME_CHECK(manifest.IsMap(), "checkpoint manifest '{}' is damaged: it is not a YAML map",
             manifest_path);
  XLME_CHECK(manifest_field<std::string>(manifest["format"], "format", manifest_path) == kFormat,
             "'{}' is not an xlme checkpoint manifest (field 'format' is not '{}')", manifest_path,
             kFormat);
  const int version = manifest_field<int>(manifest["version"], "version", manifest_path);
  XLME_CHECK(version <= kFormatVersion, "{}", newer_format_message(path, version));
  XLME_CHECK(version == kFormatVersion,
             "checkpoint '{}' has format version {}; this xlme reads version {}", path, version,
             kFormatVersion);
  XLME_CHECK(manifest["files"].IsMap(),
             "checkpoint manifest '{}' is damaged: field 'files' is missing or not a map",
             manifest_path);
  return manifest;
}
}  // namespace

CheckpointManager::CheckpointManager(std::string dir, int64_t keep_last, int64_t keep_every)
    : dir_(std::move(dir)), keep_last_(keep_last), keep_every_(keep_every), run_id_(new_run_id()) {
  XLME_CHECK(keep_last >= 1, "keep_last must be at least 1, got {}", keep_last);
  XLME_CHECK(keep_every >= 0, "keep_every must be 0 or positive, got {}", keep_every);
}

std::string CheckpointManager::path_for(int64_t step) const {
  return (fs::path(dir_) / fmt::format("step_{:08d}", step)).string();
}

std::string CheckpointManager::begin(int64_t step) const {
  const std::string tmp = temporary_path_for(step);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  XLME_CHECK(!ec, "cannot create checkpoint folder '{}': {}", tmp, ec.message());
  return tmp;
}

std::string CheckpointManager::commit(int64_t step) const {
  const std::string tmp = temporary_path_for(step);
  const std::string final_path = path_for(step);
  XLME_CHECK(fs::is_directory(tmp), "checkpoint of step {}: '{}' does not exist; call begin()",
             step, tmp);
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "format" << YAML::Value << kFormat << YAML::Key << "version"
      << YAML::Value << kFormatVersion << YAML::Key << "step" << YAML::Value << step;
  if (!run_id_.empty()) out << YAML::Key << "run_id" << YAML::Value << run_id_;
  out << YAML::Key << "files" << YAML::Value << YAML::BeginMap;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(tmp)) {
    XLME_CHECK(entry.is_regular_file(), "checkpoint folder '{}' holds '{}', which is not a file",
               tmp, entry.path().filename().string());
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    const std::string path = (fs::path(tmp) / name).string();
    fsync_path(path, O_RDONLY);
    out << YAML::Key << name << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "bytes"
        << YAML::Value << static_cast<uint64_t>(fs::file_size(path)) << YAML::Key << "crc32"
        << YAML::Value << fmt::format("{:08x}", file_crc32(path)) << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  write_file_atomic((fs::path(tmp) / kManifestFile).string(), std::string(out.c_str()) + "\n");
  std::error_code ec;
  if (fs::exists(final_path, ec)) {
    // The same step again: this run's earlier save of it (a resume from an older checkpoint) is
    // replaced; anything else is kept aside.
    std::string owner;
    try {
      owner = run_id_of(final_path);
    } catch (const Error&) {
      owner.clear();
    }
    if (!run_id_.empty() && owner == run_id_) {
      fs::remove_all(final_path, ec);
    } else {
      const std::string aside = fmt::format("{}.superseded-{}", final_path,
                                            std::chrono::duration_cast<std::chrono::seconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count());
      spdlog::warn("'{}' is not this run's checkpoint (run id '{}'): moved aside to '{}'",
                   final_path, owner, aside);
      fs::rename(final_path, aside, ec);
      XLME_CHECK(!ec, "cannot move '{}' aside to '{}': {}", final_path, aside, ec.message());
    }
    own_.erase(final_path);
  }
  fs::rename(tmp, final_path, ec);
  XLME_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp, final_path, ec.message());
  fsync_path(dir_, O_RDONLY | O_DIRECTORY);
  if (!run_id_.empty()) own_.insert(final_path);
  prune(step);
  return final_path;
}

void CheckpointManager::abort(int64_t step) const {
  std::error_code ec;
  fs::remove_all(temporary_path_for(step), ec);
}

std::string CheckpointManager::new_run_id() {
  std::random_device device;
  const uint64_t high = device(), low = device();
  const auto now =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", ((high << 32) | low) ^ now);
}

std::string CheckpointManager::save(
    int64_t step, const std::function<void(const std::string& folder)>& write) const {
  begin(step);
  try {
    write(temporary_path_for(step));
    return commit(step);
  } catch (...) {
    abort(step);
    throw;
  }
}

std::vector<CheckpointRef> CheckpointManager::list() const {
  std::vector<CheckpointRef> found;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) found.push_back({step, entry.path().string()});
  }
  std::sort(found.begin(), found.end(),
            [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return found;
}

std::optional<VerifiedCheckpoint> CheckpointManager::latest_valid() const {
  const auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    // A newer xlme's checkpoint stops the search: taking an older one would silently resume from
    // an earlier step and lose the newer one's work.
    const auto version = manifest_version(it->path);
    XLME_CHECK(!version || *version <= kFormatVersion, "{}",
               newer_format_message(it->path, *version));
    try {
      VerifiedFiles files = verify(it->path);
      // The folder's name orders the checkpoints: one renamed (step_40 holding step 4) would be
      // taken as the newest and rewind every resume.
      const std::string manifest = (fs::path(it->path) / kManifestFile).string();
      const auto step = manifest_field<int64_t>(load_manifest(it->path)["step"], "step", manifest);
      XLME_CHECK(step == it->step,
                 "checkpoint '{}' holds step {} (its manifest '{}'), not the step {} of its "
                 "name; it was renamed or copied: rename it to '{}'",
                 it->path, step, manifest, it->step, fs::path(path_for(step)).filename().string());
      return VerifiedCheckpoint{it->step, it->path, std::move(files)};
    } catch (const Error& e) {
      spdlog::warn("skipping a damaged checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

void CheckpointManager::remove_temporaries() const {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    // Only the temporary folders begin() makes (step_<N>.tmp, N written as path_for writes it),
    // never a link: another name ending in .tmp is not xlme's.
    static const std::regex temporary("step_([0-9]{8,18})\\.tmp");
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (entry.symlink_status(ec).type() != fs::file_type::directory ||
        !std::regex_match(name, match, temporary) ||
        fs::path(temporary_path_for(std::stoll(match[1].str()))).filename() != name) {
      continue;
    }
    spdlog::info("removing '{}', left by an interrupted save", entry.path().string());
    fs::remove_all(entry.path(), ec);
  }
}

bool CheckpointManager::of_this_run(const CheckpointRef& ref) const {
  if (own_.count(ref.path)) return true;
  try {
    if (run_id_of(ref.path) != run_id_) return false;
    verify(ref.path);
  } catch (const Error& e) {
    spdlog::debug("not pruned, not counted: {}", e.what());
    return false;
  }
  own_.insert(ref.path);
  return true;
}

void CheckpointManager::prune(int64_t written) const {
  if (run_id_.empty()) return;
  std::vector<CheckpointRef> older;  // this run's verified checkpoints before `written`
  for (const auto& ref : list()) {
    if (ref.step < written && of_this_run(ref)) older.push_back(ref);
  }
  // keep_last counts the checkpoint just written.
  const int64_t excess = static_cast<int64_t>(older.size()) - (keep_last_ - 1);
  for (int64_t i = 0; i < excess; ++i) {
    if (keep_every_ > 0 && older[i].step % keep_every_ == 0) continue;
    std::error_code ec;
    fs::remove_all(older[i].path, ec);
    own_.erase(older[i].path);
    if (ec) spdlog::warn("cannot remove old checkpoint '{}': {}", older[i].path, ec.message());
  }
}

VerifiedFiles CheckpointManager::verify(const std::string& path) {
  const YAML::Node manifest = load_manifest(path);
  const std::string manifest_path = (fs::path(path) / kManifestFile).string();
  // Every name is checked before any file is opened: a name that leaves the folder is never used.
  std::vector<std::pair<std::string, YAML::Node>> entries;
  for (const auto& entry : manifest["files"]) {
    const std::string name = manifest_field<std::string>(entry.first, "files", manifest_path);
    XLME_CHECK(is_plain_file_name(name),
               "checkpoint manifest '{}' lists the file {}, which is not a plain file name inside "
               "the checkpoint folder (a name without '/', not '.' or '..'); the manifest was "
               "altered: do not load this checkpoint",
               manifest_path, shown(name));
    entries.emplace_back(name, entry.second);
  }
  std::set<std::string> names;
  for (const auto& [name, fields] : entries) {
    const std::string field = "files." + name;
    const std::string file = (fs::path(path) / name).string();
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(file, ec);
    XLME_CHECK(status.type() != fs::file_type::not_found, "checkpoint '{}': {} is missing", path,
               name);
    XLME_CHECK(status.type() == fs::file_type::regular,
               "checkpoint '{}': {} is {}, not a file; a checkpoint holds its own files: replace "
               "it with the file itself",
               path, name,
               status.type() == fs::file_type::symlink ? "a symbolic link" : "something else");
    const auto expected =
        manifest_field<uint64_t>(fields["bytes"], field + ".bytes", manifest_path);
    const auto recorded =
        manifest_field<std::string>(fields["crc32"], field + ".crc32", manifest_path);
    // Gone since its status was read: a run pruning this checkpoint while it is read.
    const uint64_t actual = fs::file_size(file, ec);
    XLME_CHECK(!ec, "checkpoint '{}': {} is missing ({})", path, name, ec.message());
    XLME_CHECK(actual == expected, "checkpoint '{}': {} is truncated: expected {} bytes, found {}",
               path, name, expected, actual);
    const std::string crc = fmt::format("{:08x}", file_crc32(file));
    XLME_CHECK(crc == recorded, "checkpoint '{}': {} is corrupted: CRC32 {} instead of {}", path,
               name, crc, recorded);
    names.insert(name);
  }
  return VerifiedFiles(path, manifest_path, std::move(names));
}

std::string VerifiedFiles::path(const std::string& name) const {
  XLME_CHECK(names_.count(name),
             "checkpoint manifest '{}' does not list {}, which the loader reads: an unlisted file "
             "is unchecked and is not read; the checkpoint is incomplete or was altered: restore "
             "it from a copy, or resume from another checkpoint",
             manifest_, name);
  return (fs::path(folder_) / name).string();
}

std::string CheckpointManager::run_id_of(const std::string& path) {
  const YAML::Node manifest = load_manifest(path);
  if (!manifest["run_id"]) return "";
  return manifest_field<std::string>(manifest["run_id"], "run_id",
                                     (fs::path(path) / kManifestFile).string());
}

}  // namespace xlme::checkpoint
