// libxlme_spm.so: SentencePiece behind the plugin boundary (include/xlme/data/spm_plugin_abi.h).
// Nothing here may throw across the boundary.
#include "xlme/data/spm_plugin_abi.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <memory>
#include <unordered_map>

// SentencePiece's log level: 0.1 (Debian 12) exports only the internal logging::SetMinLogLevel
// (common.h), 0.2.2 only the public SetMinLogLevel, 0.2.0 both. Weak references take whichever
// this libsentencepiece has.
namespace sentencepiece {
__attribute__((weak)) void SetMinLogLevel(int v);
namespace logging {
__attribute__((weak)) void SetMinLogLevel(int v);
}  // namespace logging
}  // namespace sentencepiece

namespace {

using sentencepiece::SentencePieceProcessor;

const SentencePieceProcessor& processor_of(const void* p) {
  return *static_cast<const SentencePieceProcessor*>(p);
}

std::string load(const std::string& path, void** processor) {
  try {
    auto sp = std::make_unique<SentencePieceProcessor>();
    const auto status = sp->Load(path);
    if (!status.ok()) return status.ToString();
    *processor = sp.release();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

void destroy(void* processor) {
  delete static_cast<SentencePieceProcessor*>(processor);
}

int piece_size(const void* processor) {
  return processor_of(processor).GetPieceSize();
}

std::string encode(const void* processor, const std::string& text, std::vector<int>* ids) {
  try {
    const auto status = processor_of(processor).Encode(text, ids);
    return status.ok() ? "" : status.ToString();
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string decode(const void* processor, const std::vector<int>& ids, std::string* text) {
  try {
// SentencePiece 0.2.2 (Debian sid) deprecates Decode(std::vector<int>) for an absl::Span overload
// that 0.1 (Debian 12) lacks; the vector overload works in both.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    const auto status = processor_of(processor).Decode(ids, text);
#pragma GCC diagnostic pop
    return status.ok() ? "" : status.ToString();
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string id_to_piece(const void* processor, int id, std::string* piece) {
  const auto& sp = processor_of(processor);
  if (id < 0 || id >= sp.GetPieceSize()) return "id out of range";
  *piece = sp.IdToPiece(id);
  return "";
}

int piece_to_id(const void* processor, const std::string& piece) {
  return processor_of(processor).PieceToId(piece);
}

std::string train(const std::vector<std::pair<std::string, std::string>>& flags, unsigned seed,
                  std::string* model) {
  try {
    // The trainer logs through std::cerr; under RTLD_DEEPBIND that is libstdc++'s own,
    // uninitialized copy of the object (the executable holds the live one), and writing to it
    // crashes. Only fatal messages stay on; errors come back in the status.
    if (sentencepiece::SetMinLogLevel) {
      sentencepiece::SetMinLogLevel(3);
    } else if (sentencepiece::logging::SetMinLogLevel) {
      sentencepiece::logging::SetMinLogLevel(3);
    } else {
      return "this libsentencepiece exports no SetMinLogLevel, which xlme needs to keep its "
             "trainer quiet; use SentencePiece 0.1.9x or 0.2.x";
    }
    sentencepiece::SetRandomGeneratorSeed(seed);
    const std::unordered_map<std::string, std::string> kwargs(flags.begin(), flags.end());
    const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, nullptr, model);
    return status.ok() ? "" : status.ToString();
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

extern "C" const xlme::data::SpmPluginApi* xlme_spm_plugin_api() {
  static const xlme::data::SpmPluginApi api{xlme::data::kSpmPluginAbiVersion,
                                            load,
                                            destroy,
                                            piece_size,
                                            encode,
                                            decode,
                                            id_to_piece,
                                            piece_to_id,
                                            train};
  return &api;
}
