// xlme-finetune: fine-tune and evaluate on XTREME tasks (zero-shot cross-lingual transfer)
#include "xlme/common/app.h"

#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-finetune", "fine-tune and evaluate on XTREME tasks (zero-shot cross-lingual transfer)",
      /*run_logs=*/true};
  return xlme::run_app(argc, argv, spec, [](const xlme::config::Config&) {
    spdlog::error(
        "xlme-finetune resolved its config, but fine-tuning is not implemented yet (issue #6)");
    return xlme::kExitNotImplemented;
  });
}
