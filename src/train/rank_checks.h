// What every rank checks with the others before pre-training starts: the same config, the same
// data, and one run folder that they all share. Every rank calls each check (collectives inside),
// and all ranks fail with the same message, naming the ranks and what differs. Private to
// src/train (pretrain.cpp).
#pragma once

#include "xlme/config/config.h"
#include "xlme/dist/communicator.h"

namespace xlme::train {

// Every rank trains with rank 0's config, apart from the keys that name where each host keeps its
// files, its threads, logging and loading, and the sections pre-training does not read.
void check_same_config(const config::Config& config, dist::Communicator& comm);
// Every rank reads the same shards, by content (data.shards may be another path on each host).
void check_same_data(const config::Config& config, dist::Communicator& comm);
// Every rank sees rank 0's run.out_dir as the same folder (a file rank 0 writes there).
void check_shared_run_folder(const config::Config& config, dist::Communicator& comm);

}  // namespace xlme::train
