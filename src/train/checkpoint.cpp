#include "xlme/train/checkpoint.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/json.h"
#include "xlme/config/yaml_file.h"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/serialize.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kManifest = "manifest.yaml";
constexpr const char* kFormat = "xlme-checkpoint";
constexpr int kFormatVersion = 1;

// The deepest nesting of objects, lists and dicts an archive may hold (xlme writes 4 levels).
constexpr int kMaxArchiveDepth = 64;

// What to do about a damaged file of a checkpoint.
constexpr const char* kDamagedHint =
    "the file is damaged or was altered; restore the checkpoint from a copy, or resume from "
    "another checkpoint";

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

// `text` from an untrusted file, for a message: quoted, control characters escaped, at most 120
// bytes of it.
std::string shown(const std::string& text) {
  constexpr std::size_t kShown = 120;
  if (text.size() <= kShown) return json_quote(text);
  return fmt::format("{}... ({} bytes)", json_quote(text.substr(0, kShown)), text.size());
}

// Whether a manifest entry names a file directly inside the checkpoint folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

// The parsed manifest of checkpoint `path`, its format and version checked.
YAML::Node load_manifest(const std::string& path) {
  std::error_code ec;
  XLME_CHECK(fs::exists(path, ec), "checkpoint '{}' does not exist; check the path", path);
  XLME_CHECK(fs::is_directory(path, ec), "checkpoint '{}' is not a folder; give a step_<N> folder",
             path);
  const std::string manifest_path = (fs::path(path) / kManifest).string();
  const fs::file_type type = fs::symlink_status(manifest_path, ec).type();
  XLME_CHECK(type != fs::file_type::not_found, "checkpoint '{}' has no {}: its save did not finish",
             path, kManifest);
  XLME_CHECK(type == fs::file_type::regular,
             "checkpoint '{}': {} is not a file (a symbolic link or something else); a checkpoint "
             "holds its own files: do not load this checkpoint",
             path, kManifest);
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
  XLME_CHECK(version == kFormatVersion,
             "checkpoint '{}' has format version {}; this xlme reads version {}", path, version,
             kFormatVersion);
  XLME_CHECK(manifest["files"].IsMap(),
             "checkpoint manifest '{}' is damaged: field 'files' is missing or not a map",
             manifest_path);
  return manifest;
}

void flatten_module_archive(torch::serialize::InputArchive& archive, const std::string& prefix,
                            std::map<std::string, torch::Tensor>& out) {
  for (const auto& key : archive.keys()) {
    torch::Tensor tensor;
    if (archive.try_read(key, tensor)) {
      out.emplace(prefix + key, tensor.detach());
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) flatten_module_archive(child, prefix + key + ".", out);
  }
}

// "a.b" + "c" -> "a.b.c".
std::string member_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Checks that tensor `name` of archive `path` lies inside its storage, and its storage inside the
// record its bytes were read from (`record_bytes`: the size of each record by its buffer).
void check_archive_tensor(const torch::Tensor& tensor, const std::string& name,
                          const std::map<const void*, std::size_t>& record_bytes,
                          const std::string& path) {
  if (!tensor.defined()) return;
  XLME_CHECK(tensor.layout() == torch::kStrided && !tensor.is_quantized(),
             "'{}': tensor {} is not a dense tensor; xlme writes only dense tensors; {}", path,
             shown(name), kDamagedHint);
  const c10::Storage& storage = tensor.storage();
  const auto record = record_bytes.find(storage.data());
  const std::size_t available = record == record_bytes.end() ? 0 : record->second;
  XLME_CHECK(storage.nbytes() <= available,
             "'{}': the data record of tensor {} holds {} bytes but its storage needs {}; {}", path,
             shown(name), available, storage.nbytes(), kDamagedHint);
  if (tensor.numel() == 0) return;
  // The last element's index in the storage, then its end in bytes, without overflow.
  int64_t last = tensor.storage_offset();
  bool overflow = last < 0;
  for (int64_t d = 0; d < tensor.dim() && !overflow; ++d) {
    int64_t reach = 0;
    overflow = tensor.stride(d) < 0 ||
               __builtin_mul_overflow(tensor.size(d) - 1, tensor.stride(d), &reach) ||
               __builtin_add_overflow(last, reach, &last);
  }
  int64_t end = 0;
  overflow = overflow || __builtin_add_overflow(last, 1, &end) ||
             __builtin_mul_overflow(end, static_cast<int64_t>(tensor.element_size()), &end);
  XLME_CHECK(!overflow && static_cast<uint64_t>(end) <= storage.nbytes(),
             "'{}': tensor {} (shape [{}], offset {}) reaches past the {} bytes of its data "
             "record; {}",
             path, shown(name), fmt::join(tensor.sizes(), ", "), tensor.storage_offset(),
             storage.nbytes(), kDamagedHint);
}

// check_archive_tensor on every tensor under `value` (objects, lists, tuples, dicts).
void check_archive_value(const c10::IValue& value, const std::string& name, int depth,
                         const std::map<const void*, std::size_t>& record_bytes,
                         const std::string& path) {
  XLME_CHECK(depth <= kMaxArchiveDepth, "'{}': {} is nested more than {} levels deep; {}", path,
             shown(name), kMaxArchiveDepth, kDamagedHint);
  if (value.isTensor()) {
    check_archive_tensor(value.toTensor(), name, record_bytes, path);
  } else if (value.isObject()) {
    const auto& object = value.toObjectRef();
    const auto type = object.type();
    for (std::size_t i = 0; i < object.slots().size(); ++i) {
      check_archive_value(object.getSlot(i), member_name(name, type->getAttributeName(i)),
                          depth + 1, record_bytes, path);
    }
  } else if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "(key)";
      check_archive_value(item.value(), member_name(name, key), depth + 1, record_bytes, path);
    }
  } else if (value.isList()) {
    const auto items = value.toListRef();
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_archive_value(items[i], member_name(name, std::to_string(i)), depth + 1, record_bytes,
                          path);
    }
  } else if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_archive_value(items[i], member_name(name, std::to_string(i)), depth + 1, record_bytes,
                          path);
    }
  }
}

// Checks, before LibTorch reads archive `path` for use, that every tensor lies inside the record
// its bytes come from: LibTorch sizes a storage by the element count written in the pickle, not
// by its record, and places a tensor in its storage without a bounds check, so a short record is
// read past its end. The pickle is unpickled here on the CPU with placeholder classes (the
// archive's code is not compiled), each record's size remembered by its buffer.
void check_archive_records(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  const auto pickle = reader.getRecord("data.pkl");
  const char* pickle_data = static_cast<const char*>(std::get<0>(pickle).get());
  const std::size_t pickle_bytes = std::get<1>(pickle);
  std::size_t consumed = 0;
  const auto read_pickle = [&](char* buffer, std::size_t n) {
    n = std::min(n, pickle_bytes - consumed);
    std::memcpy(buffer, pickle_data + consumed, n);
    consumed += n;
    return n;
  };
  std::map<const void*, std::size_t> record_bytes;
  const auto read_record = [&](const std::string& key) {
    auto [data, bytes] = reader.getRecord("data/" + key);
    record_bytes[data.get()] = bytes;
    return std::move(data);
  };
  const auto unit = std::make_shared<torch::jit::CompilationUnit>();
  const auto resolve_class = [&](const c10::QualifiedName& name) {
    return c10::StrongTypePtr(unit, c10::ClassType::create(name, unit));
  };
  // An object of a class of its own, with the pickled state's entries as attributes.
  const auto build_object = [&](const c10::StrongTypePtr& type, const c10::IValue& state) {
    const auto dict = state.toGenericDict();
    const auto cls = c10::ClassType::create(type.type_->expectRef<c10::ClassType>().name(), unit);
    for (const auto& item : dict) cls->addAttribute(item.key().toStringRef(), item.value().type());
    auto object = c10::ivalue::Object::create(c10::StrongTypePtr(unit, cls), dict.size());
    std::size_t slot = 0;
    for (const auto& item : dict) object->setSlot(slot++, item.value());
    return object;
  };
  torch::jit::Unpickler unpickler(read_pickle, resolve_class, build_object, read_record,
                                  torch::Device(torch::kCPU));
  unpickler.set_version(reader.version());
  check_archive_value(unpickler.parse_ivalue(), "", 0, record_bytes, path);
}

}  // namespace

void load_archive(torch::serialize::InputArchive& archive, const std::string& path,
                  const torch::Device& device) {
  XLME_CHECK(fs::is_regular_file(path), "'{}' not found", path);
  try {
    check_archive_records(path);
    archive.load_from(path, device);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    XLME_FAIL("cannot read '{}': {}; {}", path, what.substr(0, what.find('\n')), kDamagedHint);
  }
}

std::map<std::string, torch::Tensor> read_module_archive(const std::string& path) {
  torch::serialize::InputArchive archive;
  load_archive(archive, path, torch::kCPU);
  std::map<std::string, torch::Tensor> out;
  flatten_module_archive(archive, "", out);
  return out;
}

uint32_t file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  XLME_CHECK(in.good(), "cannot read '{}'", path);
  std::vector<char> buffer(1 << 20);
  uLong crc = crc32_z(0L, Z_NULL, 0);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(buffer.data()),
                  static_cast<z_size_t>(in.gcount()));
  }
  return static_cast<uint32_t>(crc);
}

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
  write_file_atomic((fs::path(tmp) / kManifest).string(), std::string(out.c_str()) + "\n");
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

std::optional<CheckpointRef> CheckpointManager::latest_valid() const {
  const auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify(it->path);
      return *it;
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
  const std::string manifest_path = (fs::path(path) / kManifest).string();
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
    const uint64_t actual = fs::file_size(file);
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
                                     (fs::path(path) / kManifest).string());
}

void save_archive(torch::serialize::OutputArchive& archive, const std::string& path) {
  write_file_streamed(path, [&](const ByteSink& sink) {
    try {
      archive.save_to(sink);
    } catch (const c10::Error& e) {
      XLME_FAIL("cannot write '{}': {}", path, e.what_without_backtrace());
    }
  });
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
  return t;
}

}  // namespace xlme::train
