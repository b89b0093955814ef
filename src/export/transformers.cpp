#include "xlme/export/transformers.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/export/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace xlme::export_ {

void write_transformers_files(const std::string& folder,
                              const checkpoint::ExportedConfig& exported) {
  const std::filesystem::path dir(folder);
  const auto config_path = (dir / checkpoint::kExportConfigFile).string();
  auto config = nlohmann::ordered_json::parse(read_file(config_path, "export config"));
  // AutoConfig / AutoModel*.from_pretrained(folder, trust_remote_code=True) follow auto_map.
  config["model_type"] = "xlme";
  config["architectures"] = {"XlmeModel"};
  config["torch_dtype"] = exported.dtype;
  config["auto_map"] = {
      {"AutoConfig", "configuration_xlme.XlmeConfig"},
      {"AutoModel", "modeling_xlme.XlmeModel"},
      {"AutoModelForSequenceClassification", "modeling_xlme.XlmeForSequenceClassification"},
      {"AutoModelForTokenClassification", "modeling_xlme.XlmeForTokenClassification"},
      {"AutoModelForQuestionAnswering", "modeling_xlme.XlmeForQuestionAnswering"},
      {"AutoModelForMaskedLM", "modeling_xlme.XlmeForMaskedLM"},
      {"AutoModelForPreTraining", "modeling_xlme.XlmeForPreTraining"}};
  write_file_atomic(config_path, config.dump(2) + "\n");

  const nlohmann::ordered_json tokenizer = {
      {"tokenizer_class", "XlmeTokenizer"},
      {"auto_map",
       {{"AutoTokenizer",
         {"tokenization_xlme.XlmeTokenizer", "tokenization_xlme.XlmeTokenizerFast"}}}},
      {"vocab_layout", exported.vocab_layout},
      {"model_max_length", exported.model.max_positions},
      {"spm_model_crc32", exported.tokenizer_crc32}};
  write_file_atomic((dir / "tokenizer_config.json").string(), tokenizer.dump(2) + "\n");
  // The fast tokenizer (offsets, word_ids) reads it; the slow one reads spm.model.
  write_file_atomic((dir / kTokenizerJsonFile).string(),
                    tokenizer_json((dir / checkpoint::kExportTokenizerFile).string(),
                                   data::parse_vocab_layout(exported.vocab_layout)));
  for (const auto& file : transformers_files()) {
    write_file_atomic((dir / file.name).string(), file.text);
  }
}

}  // namespace xlme::export_
