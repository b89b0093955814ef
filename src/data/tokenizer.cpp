#include "xlme/data/tokenizer.h"

#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"

namespace xlme::data {

VocabLayout parse_vocab_layout(const std::string& name) {
  if (name == "own") return VocabLayout::kOwn;
  if (name == "xlmr") return VocabLayout::kXlmr;
  XLME_FAIL("unknown vocabulary layout '{}'; expected own or xlmr (data.vocab_layout)", name);
}

Tokenizer::Tokenizer(const std::string& model_path, VocabLayout layout)
    : spm_(model_path), layout_(layout) {
  const int pieces = spm_.size();
  auto piece = [&](int id) { return id < pieces ? spm_.id_to_piece(id) : std::string(); };
  const std::string found =
      fmt::format("0 = '{}', 1 = '{}', 2 = '{}', 3 = '{}'", piece(0), piece(1), piece(2), piece(3));
  if (layout == VocabLayout::kOwn) {
    XLME_CHECK(pieces > 4 && piece(0) == "<s>" && piece(1) == "<pad>" && piece(2) == "</s>" &&
                   piece(3) == "<unk>",
               "tokenizer '{}' does not have xlme's own id layout (<s>=0, <pad>=1, </s>=2, "
               "<unk>=3; it has {}): train it with xlme-data train-spm, or set "
               "data.vocab_layout=xlmr for XLM-R's sentencepiece.bpe.model",
               model_path, found);
    ids_ = SpecialIds::for_vocab(pieces + 1);
  } else {
    XLME_CHECK(pieces > 3 && piece(0) == "<unk>" && piece(1) == "<s>" && piece(2) == "</s>",
               "tokenizer '{}' does not have XLM-R's SentencePiece layout (<unk>=0, <s>=1, "
               "</s>=2; it has {}): set data.vocab_layout=own for models trained by xlme-data",
               model_path, found);
    ids_ = SpecialIds::for_vocab(pieces + 2);
  }
  hash_ =
      hash64(read_file(model_path, "tokenizer") + (layout == VocabLayout::kOwn ? "|own" : "|xlmr"));
}

int32_t Tokenizer::from_spm(int spm_id) const {
  if (layout_ == VocabLayout::kOwn) return spm_id;
  switch (spm_id) {
    case 0:
      return static_cast<int32_t>(ids_.unk);
    case 1:
      return static_cast<int32_t>(ids_.bos);
    case 2:
      return static_cast<int32_t>(ids_.eos);
    default:
      return spm_id + 1;
  }
}

int Tokenizer::to_spm(int32_t id) const {
  if (id == ids_.mask) return -1;
  if (layout_ == VocabLayout::kOwn) return id;
  if (id == ids_.pad) return -1;
  if (id == ids_.bos) return 1;
  if (id == ids_.eos) return 2;
  if (id == ids_.unk) return 0;
  return id - 1;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  const std::vector<int> spm_ids = spm_.encode(text);
  std::vector<int32_t> ids(spm_ids.size());
  for (size_t i = 0; i < spm_ids.size(); ++i) ids[i] = from_spm(spm_ids[i]);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> spm_ids;
  spm_ids.reserve(ids.size());
  for (const int32_t id : ids) {
    XLME_CHECK(id >= 0 && id < ids_.vocab_size, "token id {} is outside the vocabulary [0, {})", id,
               ids_.vocab_size);
    if (id == ids_.bos || id == ids_.eos || id == ids_.pad || id == ids_.mask) continue;
    spm_ids.push_back(to_spm(id));
  }
  return spm_.decode(spm_ids);
}

}  // namespace xlme::data
