// xlme-data: build corpora into training data: demo corpus, SentencePiece, memory-mapped shards
#include "xlme/common/app.h"

#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  const xlme::AppSpec spec{
      "xlme-data",
      "build corpora into training data: demo corpus, SentencePiece, memory-mapped shards",
      /*run_logs=*/false};
  return xlme::run_app(argc, argv, spec, [](const xlme::config::Config&) {
    spdlog::error(
        "xlme-data resolved its config, but building data is not implemented yet (issue #3)");
    return xlme::kExitNotImplemented;
  });
}
