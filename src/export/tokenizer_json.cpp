#include "xlme/export/tokenizer_json.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace xlme::export_ {
namespace {

using Json = nlohmann::ordered_json;

// SentencePiece's piece types (sentencepiece_model.proto): NORMAL pieces are matched and merged;
// CONTROL ones (<s>, </s>) never come out of text.
constexpr int64_t kNormalPiece = 1;
constexpr int64_t kControlPiece = 3;
constexpr int64_t kBpeModel = 2;  // TrainerSpec.model_type; UNIGRAM = 1 is the default

// One field of a protobuf message in wire format: its number and either a varint, a fixed
// 32-bit value or the bytes of a length-delimited one.
struct WireField {
  uint32_t number = 0;
  uint64_t varint = 0;
  uint32_t fixed32 = 0;
  std::string_view bytes;
};

// Reads the fields of one protobuf message (the wire format; no schema needed). A truncated
// or malformed message is an error naming `what`.
class WireReader {
 public:
  WireReader(std::string_view data, const std::string& what) : data_(data), what_(what) {}

  bool next(WireField& field) {
    if (pos_ == data_.size()) return false;
    const uint64_t key = varint();
    field = WireField{};
    field.number = static_cast<uint32_t>(key >> 3);
    switch (key & 7) {
      case 0:
        field.varint = varint();
        break;
      case 1:
        take(8);
        break;
      case 2: {
        const uint64_t size = varint();
        field.bytes = take(size);
        break;
      }
      case 5: {
        const auto raw = take(4);
        std::memcpy(&field.fixed32, raw.data(), 4);
        break;
      }
      default:
        XLME_FAIL("{} is not a SentencePiece model: wire type {} at byte {}", what_, key & 7, pos_);
    }
    return true;
  }

 private:
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      XLME_CHECK(pos_ < data_.size(), "{} is not a SentencePiece model: truncated at byte {}",
                 what_, pos_);
      const auto byte = static_cast<uint8_t>(data_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (byte < 0x80) return value;
    }
    XLME_FAIL("{} is not a SentencePiece model: a varint longer than 10 bytes at byte {}", what_,
              pos_);
  }
  std::string_view take(uint64_t size) {
    XLME_CHECK(size <= data_.size() - pos_,
               "{} is not a SentencePiece model: a field of {} bytes at byte {} runs past its end",
               what_, size, pos_);
    const auto out = data_.substr(pos_, size);
    pos_ += size;
    return out;
  }

  std::string_view data_;
  const std::string& what_;
  size_t pos_ = 0;
};

struct Piece {
  std::string text;
  float score = 0;
  int64_t type = kNormalPiece;
};

// What tokenizer.json needs of a ModelProto (field numbers of sentencepiece_model.proto).
struct SpmModel {
  std::vector<Piece> pieces;                // ModelProto.pieces = 1
  int64_t model_type = 1;                   // TrainerSpec (2).model_type = 3
  bool byte_fallback = false;               // TrainerSpec.byte_fallback = 35
  bool split_by_whitespace = true;          // TrainerSpec.split_by_whitespace = 22
  bool treat_whitespace_as_suffix = false;  // TrainerSpec.treat_whitespace_as_suffix = 24
  std::string precompiled_charsmap;         // NormalizerSpec (3).precompiled_charsmap = 2
  bool add_dummy_prefix = true;             // NormalizerSpec.add_dummy_prefix = 3
  bool remove_extra_whitespaces = true;     // = 4
  bool escape_whitespaces = true;           // = 5
};

SpmModel parse_model(const std::string& bytes, const std::string& what) {
  SpmModel m;
  WireReader model(bytes, what);
  for (WireField f; model.next(f);) {
    WireReader inner(f.bytes, what);
    if (f.number == 1) {
      Piece piece;
      for (WireField g; inner.next(g);) {
        if (g.number == 1) piece.text = std::string(g.bytes);
        if (g.number == 2) std::memcpy(&piece.score, &g.fixed32, sizeof(float));
        if (g.number == 3) piece.type = static_cast<int64_t>(g.varint);
      }
      m.pieces.push_back(std::move(piece));
    } else if (f.number == 2) {
      for (WireField g; inner.next(g);) {
        if (g.number == 3) m.model_type = static_cast<int64_t>(g.varint);
        if (g.number == 22) m.split_by_whitespace = g.varint != 0;
        if (g.number == 24) m.treat_whitespace_as_suffix = g.varint != 0;
        if (g.number == 35) m.byte_fallback = g.varint != 0;
      }
    } else if (f.number == 3) {
      for (WireField g; inner.next(g);) {
        if (g.number == 2) m.precompiled_charsmap = std::string(g.bytes);
        if (g.number == 3) m.add_dummy_prefix = g.varint != 0;
        if (g.number == 4) m.remove_extra_whitespaces = g.varint != 0;
        if (g.number == 5) m.escape_whitespaces = g.varint != 0;
      }
    }
  }
  XLME_CHECK(!m.pieces.empty(), "{} is not a SentencePiece model: it holds no pieces", what);
  XLME_CHECK(!m.treat_whitespace_as_suffix,
             "{}: a SentencePiece model trained with treat_whitespace_as_suffix has no "
             "tokenizer.json form here (Metaspace puts U+2581 before a word)",
             what);
  return m;
}

std::string base64(std::string_view bytes) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t chunk = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 2]);
    out += kDigits[(chunk >> 18) & 63];
    out += kDigits[(chunk >> 12) & 63];
    out += i + 1 < bytes.size() ? kDigits[(chunk >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kDigits[chunk & 63] : '=';
  }
  return out;
}

Json replace(const char* kind, const std::string& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", {{kind, pattern}}}, {"content", content}};
}

// BPE merges as transformers derives them from a SentencePiece BPE model: every split of a
// normal piece into two normal pieces, ranked by the merged piece's score (highest first), then
// its id. `vocab`: the pieces by layout id.
Json bpe_merges(const std::vector<Piece>& vocab) {
  std::unordered_map<std::string_view, size_t> normal;
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (vocab[id].type == kNormalPiece) normal.emplace(vocab[id].text, id);
  }
  std::vector<std::tuple<float, size_t, std::string_view, std::string_view>> ranked;
  for (const auto& [text, id] : normal) {
    // Splits at UTF-8 character boundaries only (Python splits the piece's characters).
    for (size_t at = 1; at < text.size(); ++at) {
      if ((static_cast<uint8_t>(text[at]) & 0xC0) == 0x80) continue;
      const auto left = text.substr(0, at), right = text.substr(at);
      if (normal.count(left) && normal.count(right)) {
        ranked.emplace_back(-vocab[id].score, id, left, right);
      }
    }
  }
  std::sort(ranked.begin(), ranked.end());
  Json merges = Json::array();
  for (const auto& [score, id, left, right] : ranked) {
    merges.push_back({std::string(left), std::string(right)});
  }
  return merges;
}

Json template_piece(const char* kind, const char* id) {
  return {{kind, {{"id", id}, {"type_id", 0}}}};
}

}  // namespace

std::string tokenizer_json(const std::string& spm_path, data::VocabLayout layout) {
  const data::Tokenizer tokenizer(spm_path, layout);
  const SpmModel m = parse_model(read_file(spm_path, "SentencePiece model"), spm_path);
  XLME_CHECK(static_cast<int>(m.pieces.size()) == tokenizer.sentencepiece().size(),
             "{}: {} pieces in the file, {} in SentencePiece's reading of it", spm_path,
             m.pieces.size(), tokenizer.sentencepiece().size());
  const auto& special = tokenizer.special_ids();
  // Every layout id's piece: the model's pieces where the layout puts them, then the ids that
  // are no SentencePiece piece (xlmr's <pad>, <mask>) as control pieces.
  std::vector<Piece> vocab(static_cast<size_t>(tokenizer.vocab_size()));
  vocab[static_cast<size_t>(special.pad)] = {"<pad>", 0, kControlPiece};
  vocab[static_cast<size_t>(special.mask)] = {"<mask>", 0, kControlPiece};
  for (int spm_id = 0; spm_id < static_cast<int>(m.pieces.size()); ++spm_id) {
    vocab[static_cast<size_t>(tokenizer.from_spm(spm_id))] = m.pieces[static_cast<size_t>(spm_id)];
  }

  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  // The special ids as transformers' added tokens: never split, never normalized; <mask> takes
  // the space before it, as XLM-R's.
  const std::map<int64_t, const char*> names = {{special.bos, "<s>"},
                                                {special.pad, "<pad>"},
                                                {special.eos, "</s>"},
                                                {special.unk, "<unk>"},
                                                {special.mask, "<mask>"}};
  j["added_tokens"] = Json::array();
  for (const auto& [id, name] : names) {
    XLME_CHECK(vocab[static_cast<size_t>(id)].text == name,
               "{}: id {} is the piece '{}', not {} as the vocabulary layout has it", spm_path, id,
               vocab[static_cast<size_t>(id)].text, name);
    j["added_tokens"].push_back({{"id", id},
                                 {"content", name},
                                 {"single_word", false},
                                 {"lstrip", id == special.mask},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  // SentencePiece's normalization, in its order: the charsmap (NFKC and its rules), the extra
  // spaces, spaces as U+2581, the dummy prefix (doubled when the text starts with U+2581, which
  // Metaspace would otherwise take for the prefix).
  const std::string meta = "\xE2\x96\x81";  // U+2581
  Json normalizers = Json::array();
  if (!m.precompiled_charsmap.empty()) {
    normalizers.push_back(
        {{"type", "Precompiled"}, {"precompiled_charsmap", base64(m.precompiled_charsmap)}});
  }
  if (m.remove_extra_whitespaces) {
    normalizers.push_back(replace("Regex", "\\A +| +\\z", ""));
    normalizers.push_back(replace("Regex", " {2,}", " "));
  }
  if (m.escape_whitespaces) normalizers.push_back(replace("String", " ", meta));
  if (m.add_dummy_prefix) normalizers.push_back(replace("Regex", "\\A" + meta, meta + meta));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
  // Metaspace splits the text into words at U+2581 (word_ids(), offsets) where SentencePiece
  // never makes a piece across them (split_by_whitespace).
  j["pre_tokenizer"] = nullptr;
  if (m.add_dummy_prefix) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", Json::array({Json{{"type", "Metaspace"},
                                                              {"replacement", meta},
                                                              {"prepend_scheme", "always"},
                                                              {"split", m.split_by_whitespace}}})}};
  }
  // XLM-R's framing, as xlme-finetune frames: <s> a </s> and <s> a </s></s> b </s>.
  const auto bos = template_piece("SpecialToken", "<s>");
  const auto eos = template_piece("SpecialToken", "</s>");
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({bos, template_piece("Sequence", "A"), eos})},
      {"pair", Json::array({bos, template_piece("Sequence", "A"), eos, eos,
                            template_piece("Sequence", "B"), eos})},
      {"special_tokens",
       {{"<s>",
         {{"id", "<s>"}, {"ids", Json::array({special.bos})}, {"tokens", Json::array({"<s>"})}}},
        {"</s>",
         {{"id", "</s>"},
          {"ids", Json::array({special.eos})},
          {"tokens", Json::array({"</s>"})}}}}}};
  Json decoders = Json::array({replace("String", meta, " ")});
  if (m.byte_fallback) decoders.push_back({{"type", "ByteFallback"}});
  if (m.add_dummy_prefix || m.byte_fallback) decoders.push_back({{"type", "Fuse"}});
  if (m.add_dummy_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};

  if (m.model_type == kBpeModel) {
    Json ids = Json::object();
    for (size_t id = 0; id < vocab.size(); ++id) ids[vocab[id].text] = id;
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", "<unk>"},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", true},
                  {"byte_fallback", m.byte_fallback},
                  {"ignore_merges", false},
                  {"vocab", ids},
                  {"merges", bpe_merges(vocab)}};
  } else {
    XLME_CHECK(m.model_type == 1,
               "{}: SentencePiece model type {} (word or char) has no tokenizer.json form here; "
               "xlme trains unigram and bpe models",
               spm_path, m.model_type);
    Json pieces = Json::array();
    for (const auto& piece : vocab) pieces.push_back({piece.text, piece.score});
    j["model"] = {{"type", "Unigram"},
                  {"unk_id", special.unk},
                  {"vocab", pieces},
                  {"byte_fallback", m.byte_fallback}};
  }
  return j.dump(2) + "\n";
}

}  // namespace xlme::export_
