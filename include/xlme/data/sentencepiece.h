// A SentencePiece model, served by libxlme_spm.so (see spm_plugin_abi.h for why a module).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace xlme::data {

struct SpmPluginApi;

class SentencePiece {
 public:
  // Loads a .model file; throws xlme::Error naming the file when it cannot.
  explicit SentencePiece(const std::string& path);

  int size() const;  // pieces in the model, its own special pieces included
  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids) const;
  std::string id_to_piece(int id) const;
  int piece_to_id(const std::string& piece) const;  // the unknown piece's id when absent
  const std::string& path() const { return path_; }

  // Trains a model with SentencePieceTrainer's flags (name, value) after seeding its random
  // generator; returns the serialized model. Throws xlme::Error with the trainer's message.
  static std::string train(const std::vector<std::pair<std::string, std::string>>& flags,
                           unsigned seed);

 private:
  std::string path_;
  const SpmPluginApi* api_;
  std::shared_ptr<void> processor_;  // owned by the plugin, freed through it
};

// The loaded plugin. Looked for in $XLME_SPM_PLUGIN, beside the executable, then in the build
// folder it was built in; throws xlme::Error listing the places when none loads.
const SpmPluginApi& spm_plugin();

}  // namespace xlme::data
