// xlme-export: export a checkpoint as a portable model folder (safetensors, config.json, tokenizer)
#include "xlme/common/app.h"

#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-export",
      "export a checkpoint as a portable model folder (safetensors, config.json, tokenizer)",
      /*run_logs=*/false};
  return xlme::run_app(argc, argv, spec, [](const xlme::config::Config&) {
    spdlog::error("xlme-export resolved its config, but export is not implemented yet (issue #7)");
    return xlme::kExitNotImplemented;
  });
}
