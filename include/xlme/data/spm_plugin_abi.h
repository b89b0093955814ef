// The boundary between xlme and libxlme_spm.so, the module that holds libsentencepiece.
//
// Why a separate module: Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite
// 3.14 and exports its symbols, while LibTorch links libprotobuf.so.32 (3.21). Linked into one
// program, whichever library the loader sees first serves both, and the program crashes in
// protobuf's static initializers before main(). xlme therefore dlopen()s libxlme_spm.so with
// RTLD_LOCAL | RTLD_DEEPBIND: SentencePiece binds to its own protobuf, LibTorch to its own.
//
// Both sides are built by the same compiler against the same libstdc++, so C++ types may cross;
// exceptions may not (every entry point returns its error as a string, "" on success).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace xlme::data {

constexpr int kSpmPluginAbiVersion = 2;

struct SpmPluginApi {
  int abi_version;
  std::string (*load)(const std::string& path, void** processor);
  void (*destroy)(void* processor);
  int (*piece_size)(const void* processor);
  std::string (*encode)(const void* processor, const std::string& text, std::vector<int>* ids);
  std::string (*decode)(const void* processor, const std::vector<int>& ids, std::string* text);
  std::string (*id_to_piece)(const void* processor, int id, std::string* piece);
  int (*piece_to_id)(const void* processor, const std::string& piece);
  // Trains a model with SentencePieceTrainer's flags (name -> value, e.g. {"input", "a.txt"},
  // {"vocab_size", "8000"}) after seeding its random generator; the model's bytes go to *model.
  std::string (*train)(const std::vector<std::pair<std::string, std::string>>& flags, unsigned seed,
                       std::string* model);
};

}  // namespace xlme::data

// The module's one exported symbol.
extern "C" const xlme::data::SpmPluginApi* xlme_spm_plugin_api();
