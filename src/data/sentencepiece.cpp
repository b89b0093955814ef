#include "xlme/data/sentencepiece.h"

#include "xlme/common/error.h"
#include "xlme/data/spm_plugin_abi.h"

#include <dlfcn.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>

namespace xlme::data {
namespace {

constexpr const char* kPluginName = "libxlme_spm.so";

std::vector<std::string> plugin_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("XLME_SPM_PLUGIN"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
  }
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back((exe.parent_path() / kPluginName).string());
    // The binaries run from libexec/ behind their fronts (src/apps/launcher.cpp).
    if (exe.parent_path().filename() == "libexec") {
      paths.push_back((exe.parent_path().parent_path() / kPluginName).string());
    }
  }
  paths.emplace_back(XLME_SPM_PLUGIN_PATH);
  return paths;
}

const SpmPluginApi& load_plugin() {
  std::vector<std::string> failures;
  for (const auto& path : plugin_candidates()) {
    if (!std::filesystem::exists(path)) {
      failures.push_back(path + ": not found");
      continue;
    }
    // RTLD_DEEPBIND: SentencePiece's calls into protobuf stay inside its own copy.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      failures.push_back(path + ": " + dlerror());
      continue;
    }
    using ApiFn = const SpmPluginApi* (*)();
    auto api_fn = reinterpret_cast<ApiFn>(dlsym(handle, "xlme_spm_plugin_api"));
    XLME_CHECK(api_fn != nullptr, "{} is not xlme's SentencePiece plugin (no xlme_spm_plugin_api)",
               path);
    const SpmPluginApi* api = api_fn();
    XLME_CHECK(api->abi_version == kSpmPluginAbiVersion,
               "{} has plugin ABI version {}, this program needs {}; rebuild xlme "
               "(scripts/setup.sh)",
               path, api->abi_version, kSpmPluginAbiVersion);
    return *api;
  }
  XLME_FAIL(
      "cannot load the SentencePiece plugin {} ({}); rebuild xlme (scripts/setup.sh) or "
      "point XLME_SPM_PLUGIN at it",
      kPluginName, fmt::join(failures, "; "));
}

}  // namespace

const SpmPluginApi& spm_plugin() {
  static const SpmPluginApi& api = load_plugin();
  return api;
}

SentencePiece::SentencePiece(const std::string& path) : path_(path), api_(&spm_plugin()) {
  XLME_CHECK(std::filesystem::is_regular_file(path),
             "SentencePiece model '{}' not found; train one with xlme-data train-spm or set "
             "data.tokenizer",
             path);
  void* processor = nullptr;
  const std::string error = api_->load(path, &processor);
  XLME_CHECK(error.empty(), "cannot load SentencePiece model '{}': {}", path, error);
  processor_ = std::shared_ptr<void>(processor, api_->destroy);
}

int SentencePiece::size() const {
  return api_->piece_size(processor_.get());
}

std::vector<int> SentencePiece::encode(const std::string& text) const {
  std::vector<int> ids;
  const std::string error = api_->encode(processor_.get(), text, &ids);
  if (!error.empty()) {
    // The text may be anything a user's file holds: its start only, with its length.
    constexpr size_t kShown = 80;
    const std::string shown =
        text.size() <= kShown
            ? "'" + text + "'"
            : fmt::format("'{}...' ({} bytes)", text.substr(0, kShown), text.size());
    XLME_FAIL("SentencePiece ({}) cannot encode {}: {}", path_, shown, error);
  }
  return ids;
}

std::string SentencePiece::decode(const std::vector<int>& ids) const {
  std::string text;
  const std::string error = api_->decode(processor_.get(), ids, &text);
  XLME_CHECK(error.empty(), "SentencePiece ({}) cannot decode {} ids: {}", path_, ids.size(),
             error);
  return text;
}

std::string SentencePiece::id_to_piece(int id) const {
  std::string piece;
  const std::string error = api_->id_to_piece(processor_.get(), id, &piece);
  XLME_CHECK(error.empty(), "SentencePiece ({}): id {} is not in [0, {})", path_, id, size());
  return piece;
}

std::string SentencePiece::train(const std::vector<std::pair<std::string, std::string>>& flags,
                                 unsigned seed) {
  std::string model;
  const std::string error = spm_plugin().train(flags, seed, &model);
  XLME_CHECK(error.empty(), "SentencePiece training failed: {}", error);
  return model;
}

int SentencePiece::piece_to_id(const std::string& piece) const {
  return api_->piece_to_id(processor_.get(), piece);
}

}  // namespace xlme::data
