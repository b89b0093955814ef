// Periodic validation during pre-training (docs/pretraining.md#validation-and-the-retrieval-probe),
// so that a run that learns nothing useful is visible early:
//   - the objective terms (MLM, MRTD, TLM, TRTD: loss, generator and discriminator accuracy,
//     replaced-token F1) on fixed held-out micro-batches, the same every time: masking seeded
//     once, replacement sampling re-seeded per micro-batch, eval mode (no dropout), no gradient;
//   - the cross-lingual retrieval probe: accuracy@1 in both directions between the two sides of
//     each held-out translation pair, from the mean-pooled states of a middle discriminator
//     layer (train.probe_layer).
// The held-out data is data.heldout: line-aligned pairs <a>-<b>.<a> / <a>-<b>.<b> (the demo
// corpus's heldout/dev). The first data.heldout.max_pairs lines of each pair give the probe's
// sentences and, framed, truncated, bucketed and masked as training's, the micro-batches
// (data/heldout.h).
// Training's random streams are untouched (ForkedRng), so validating does not change a run.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/data/heldout.h"
#include "xlme/dist/communicator.h"
#include "xlme/eval/retrieval.h"
#include "xlme/model/electra.h"
#include "xlme/objectives/objectives.h"
#include "xlme/objectives/term_sums.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace xlme::train {

struct ValidationResult {
  int64_t step = 0;
  // Per term (mlm, mrtd, tlm, trtd): the summary of its sums over the held-out set.
  objectives::TermSummaries terms;
  // Per generator term (mlm, tlm), the unigram floors on the held-out set's masked originals: the
  // accuracy of the best constant prediction (their most frequent token) and the cross-entropy of
  // the best context-free prediction (their own frequencies: the entropy of that distribution,
  // nats). A model below the loss floor uses context, even while its argmax is still that token.
  std::map<std::string, double> unigram_accuracy;
  std::map<std::string, double> unigram_loss;
  int64_t probe_layer = 0;
  // Per pair, and their mean: rank 0 only (empty elsewhere).
  std::map<std::string, eval::RetrievalAccuracy> retrieval;
  eval::RetrievalAccuracy retrieval_mean;
  double seconds = 0;
};

class Validator {
 public:
  // Builds the fixed micro-batches (data::heldout_batches of the tasks the objective set trains)
  // and the probe's sentences from `pairs`. The probe layer is train.probe_layer (-1:
  // model.layers / 2).
  Validator(const config::Config& config, const std::vector<data::HeldoutPair>& pairs,
            const data::SpecialIds& special);

  // Every rank calls it at the same step (it all-reduces once): rank r evaluates the micro-batches
  // i with i % R == r, the term sums are summed over ranks, and rank 0 alone runs the probe. The
  // model's training flag is restored.
  ValidationResult run(model::ElectraModel& model, dist::Communicator& comm,
                       const torch::Device& device, bool bf16) const;

  int64_t micro_batches() const { return static_cast<int64_t>(batches_.size()); }
  const std::map<std::string, double>& unigram_accuracy() const { return unigram_accuracy_; }
  const std::map<std::string, double>& unigram_loss() const { return unigram_loss_; }
  int64_t tokens() const;
  int64_t probe_layer() const { return probe_layer_; }
  const std::vector<data::Batch>& batches() const { return batches_; }

 private:
  objectives::Objectives objectives_;
  std::vector<data::Batch> batches_;  // MRTD then TRTD, host tensors
  std::map<std::string, double> unigram_accuracy_;
  std::map<std::string, double> unigram_loss_;
  struct ProbePair {
    std::string name;
    std::vector<std::vector<int64_t>> a, b;  // <s> pieces </s>
  };
  std::vector<ProbePair> probe_;
  int64_t probe_layer_ = 0;
  int64_t pad_ = 1;
  uint64_t seed_ = 0;
};

}  // namespace xlme::train
