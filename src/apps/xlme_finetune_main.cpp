// xlme-finetune: fine-tune and evaluate on XTREME tasks (zero-shot cross-lingual transfer)
#include "xlme/cli/app.h"
#include "xlme/finetune/finetune.h"

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-finetune", "fine-tune and evaluate on XTREME tasks (zero-shot cross-lingual transfer)",
      /*run_logs=*/true};
  return xlme::run_app(argc, argv, spec, xlme::finetune::run_finetune);
}
