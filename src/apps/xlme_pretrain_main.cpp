// xlme-pretrain: pre-train XLM-E: generator + discriminator, MLM + TLM + MRTD + TRTD, DDP over c10d
#include "xlme/common/app.h"

#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-pretrain",
      "pre-train XLM-E: generator + discriminator, MLM + TLM + MRTD + TRTD, DDP over c10d",
      /*run_logs=*/true};
  return xlme::run_app(argc, argv, spec, [](const xlme::config::Config&) {
    spdlog::error(
        "xlme-pretrain resolved its config, but pre-training is not implemented yet (issue #5)");
    return xlme::kExitNotImplemented;
  });
}
