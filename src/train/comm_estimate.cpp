#include "xlme/train/comm_estimate.h"

#include "xlme/model/electra.h"
#include "xlme/model/parameter_count.h"

#include <fmt/format.h>

namespace xlme::train {
namespace {

constexpr double kNvlink4 = 450e9;         // bytes/s per direction per GPU (18 links x 25 GB/s)
constexpr double kInfiniband = 400e9 / 8;  // one 400 Gb/s NIC per GPU
constexpr int kGpusPerNode = 8;

}  // namespace

std::vector<CommEstimate> estimate_communication(double gradient_bytes,
                                                 const std::vector<int>& gpu_counts) {
  std::vector<CommEstimate> rows;
  for (const int n : gpu_counts) {
    CommEstimate row;
    row.gpus = n;
    const bool one_node = n <= kGpusPerNode;
    row.link = one_node ? "NVLink 4 (450 GB/s)" : "InfiniBand 400 Gb/s (50 GB/s)";
    row.link_bytes_per_s = one_node ? kNvlink4 : kInfiniband;
    row.bytes_per_gpu = 2.0 * (n - 1) / n * gradient_bytes;
    row.seconds = row.bytes_per_gpu / row.link_bytes_per_s;
    rows.push_back(row);
  }
  return rows;
}

std::string format_communication_estimate(const config::Config& config) {
  const auto counts = model::analytic_parameter_counts(
      config.model, model::architecture_for(config.objectives.set));
  const auto parameters = static_cast<double>(model::total_count(counts));
  const auto embeddings = static_cast<double>(model::count_of(counts, "embeddings"));
  const double bytes = 4 * parameters;  // the fp32 gradient buckets
  std::string out = fmt::format(
      "gradient communication per optimizer step: {:.1f}M trained parameters, {:.3f} GB of fp32 "
      "gradients; a ring all-reduce sends and receives 2(N-1)/N of them per GPU over the ring's "
      "slowest link (ZeRO-1's reduce-scatter and all-gather: the same bytes)\n",
      parameters / 1e6, bytes / 1e9);
  out += fmt::format("{:>5}  {:<30}  {:>12}  {:>10}\n", "GPUs", "slowest link, per direction",
                     "GB per GPU", "time");
  for (const auto& row : estimate_communication(bytes, {8, 64})) {
    out += fmt::format("{:>5}  {:<30}  {:>12.3f}  {:>7.1f} ms\n", row.gpus, row.link,
                       row.bytes_per_gpu / 1e9, row.seconds * 1e3);
  }
  out += fmt::format(
      "dist.overlap sends each bucket during the step's last backward once its gradients are "
      "final; the shared embeddings ({:.1f}M parameters, {:.0f}% of the bytes) are final only "
      "at the backward's end (both models add to them), so at most {:.0f}% of the time above "
      "hides behind the backward\n",
      embeddings / 1e6, 100 * embeddings / parameters, 100 * (1 - embeddings / parameters));
  out += fmt::format(
      "AdamW state per GPU: {:.2f} GB (train.zero=0); with train.zero=1 {:.2f} GB on 8 GPUs, "
      "{:.3f} GB on 64 (8 bytes per parameter / world)\n",
      8 * parameters / 1e9, 8 * parameters / 8 / 1e9, 8 * parameters / 64 / 1e9);
  return out;
}

}  // namespace xlme::train
