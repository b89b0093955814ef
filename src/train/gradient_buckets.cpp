#include "xlme/train/gradient_buckets.h"

#include "xlme/common/error.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <utility>

namespace xlme::train {
namespace {

// Runs `done` after a backward pass added to the parameter's gradient (AccumulateGrad calls it
// only then, once per backward, after summing every use of the parameter).
class AccumulatedHook : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(const void* owner, std::function<void()> done)
      : owner_(owner), done_(std::move(done)) {}
  void operator()(const torch::autograd::Variable& /*parameter*/) override { done_(); }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
  std::function<void()> done_;
};

// Whether `parameter`'s hook is one that `owner` installed.
bool hooked_by(const torch::Tensor& parameter, const void* owner) {
  const auto* hook = dynamic_cast<const AccumulatedHook*>(
      torch::autograd::impl::post_acc_grad_hooks(parameter).get());
  return hook != nullptr && hook->owner() == owner;
}

}  // namespace

GradientBuckets::GradientBuckets(const std::vector<torch::Tensor>& parameters, int64_t bucket_bytes,
                                 dist::Communicator& comm, Reduction reduction)
    : parameters_(parameters),
      comm_(comm),
      reduction_(reduction),
      slots_(parameters.size()),
      present_(parameters.size(), 0),
      counted_(parameters.size(), 0) {
  XLME_CHECK(bucket_bytes > 0, "gradient bucket size must be positive, got {} bytes", bucket_bytes);
  const int64_t world = comm_.world_size();
  // Consecutive parameters (from the last) of one dtype and device, up to bucket_bytes each.
  std::vector<std::vector<std::size_t>> groups;
  int64_t bytes = 0;
  for (std::size_t i = parameters_.size(); i-- > 0;) {
    const torch::Tensor& p = parameters_[i];
    if (!p.requires_grad()) continue;
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    const bool same_kind = !groups.empty() &&
                           parameters_[groups.back().front()].scalar_type() == p.scalar_type() &&
                           parameters_[groups.back().front()].device() == p.device();
    if (!same_kind || bytes + size > bucket_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += size;
  }
  int64_t shard_elements = 0;
  for (auto& params : groups) {
    Bucket bucket;
    int64_t elements = 0;
    for (const std::size_t i : params) {
      slots_[i] = {buckets_.size(), elements};
      elements += parameters_[i].numel();
    }
    // ZeRO-1 cuts a bucket into equal slices, one per rank.
    if (reduction_ == Reduction::kReduceScatter) elements = (elements + world - 1) / world * world;
    const torch::Tensor& first = parameters_[params.front()];
    bucket.elements = elements;
    bucket.options = first.options().requires_grad(false);
    bucket.params = std::move(params);
    if (reduction_ == Reduction::kReduceScatter) {
      bucket.shard_offset = shard_elements;
      const int64_t slice = elements / world;
      const int64_t begin = comm_.rank() * slice, end = begin + slice;
      for (const std::size_t i : bucket.params) {
        const int64_t lo = std::max(slots_[i].offset, begin);
        const int64_t hi = std::min(slots_[i].offset + parameters_[i].numel(), end);
        if (lo < hi) {
          segments_.push_back({i, lo - slots_[i].offset, shard_elements + lo - begin, hi - lo});
        }
      }
      shard_elements += slice;
    }
    buckets_.push_back(std::move(bucket));
  }
  XLME_CHECK(!buckets_.empty(), "the trainer got no trainable parameters");
  complete_.assign(buckets_.size(), 0);
  if (reduction_ == Reduction::kReduceScatter) {
    shard_ = torch::zeros({shard_elements}, buckets_.front().options);
  }
  install_hooks();
}

// A parameter has one post-accumulate-grad hook: another trainer on the same model (a test's
// second trainer) replaces this one's, and attach() takes them back.
void GradientBuckets::install_hooks() {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].requires_grad() || hooked_by(parameters_[i], this)) continue;
    torch::autograd::impl::set_post_acc_grad_hooks(
        parameters_[i], std::make_unique<AccumulatedHook>(this, [this, i] { on_gradient(i); }));
  }
}

GradientBuckets::~GradientBuckets() {
  for (const auto& p : parameters_) {
    if (hooked_by(p, this)) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

int64_t GradientBuckets::slice_size(const Bucket& bucket) const {
  return bucket.elements / comm_.world_size();
}

void GradientBuckets::attach() {
  install_hooks();
  torch::NoGradGuard no_grad;
  const std::lock_guard<std::mutex> lock(mutex_);
  XLME_CHECK(pending_.empty(),
             "gradient buckets attached while {} are still being sent (an internal error: please "
             "report it)",
             pending_.size());
  for (auto& bucket : buckets_) {
    if (bucket.flat.defined()) {
      bucket.flat.zero_();
    } else {
      bucket.flat = torch::zeros({bucket.elements}, bucket.options);
    }
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].requires_grad()) continue;
    const Bucket& bucket = buckets_[slots_[i].bucket];
    parameters_[i].mutable_grad() = bucket.flat.narrow(0, slots_[i].offset, parameters_[i].numel())
                                        .view(parameters_[i].sizes());
  }
  std::fill(present_.begin(), present_.end(), 0);
  std::fill(counted_.begin(), counted_.end(), 0);
  std::fill(complete_.begin(), complete_.end(), 0);
  next_ = 0;
  armed_ = false;
  sent_during_backward_ = 0;
}

void GradientBuckets::release() {
  const std::lock_guard<std::mutex> lock(mutex_);
  XLME_CHECK(pending_.empty(),
             "gradient buckets released while {} are still being sent (an internal error: please "
             "report it)",
             pending_.size());
  if (!keep_allocated_) {
    for (auto& bucket : buckets_) bucket.flat = torch::Tensor();
  }
}

void GradientBuckets::start_recording() {
  const std::lock_guard<std::mutex> lock(mutex_);
  recorded_.assign(parameters_.size(), 0);
  recording_ = true;
}

std::vector<std::size_t> GradientBuckets::stop_recording() {
  const std::lock_guard<std::mutex> lock(mutex_);
  recording_ = false;
  std::vector<std::size_t> indices;
  for (std::size_t i = 0; i < recorded_.size(); ++i) {
    if (recorded_[i]) indices.push_back(i);
  }
  return indices;
}

void GradientBuckets::mark_present(const std::vector<std::size_t>& indices) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const std::size_t i : indices) present_.at(i) = 1;
}

void GradientBuckets::arm(bool overlap) {
  const std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  overlap_ = overlap;
}

void GradientBuckets::on_gradient(std::size_t index) {
  const std::lock_guard<std::mutex> lock(mutex_);
  present_[index] = 1;
  if (recording_) recorded_[index] = 1;
  if (!armed_ || counted_[index]) return;
  counted_[index] = 1;
  const std::size_t b = slots_[index].bucket;
  if (++complete_[b] < buckets_[b].params.size() || !overlap_) return;
  while (next_ < buckets_.size() && complete_[next_] == buckets_[next_].params.size()) {
    send(next_++);
    ++sent_during_backward_;
  }
}

void GradientBuckets::flush() {
  const std::lock_guard<std::mutex> lock(mutex_);
  while (next_ < buckets_.size()) send(next_++);
  armed_ = false;
}

void GradientBuckets::send(std::size_t b) {
  Bucket& bucket = buckets_[b];
  if (reduction_ == Reduction::kAllReduce) {
    pending_.push_back(comm_.start_all_reduce_sum(bucket.flat));
  } else {
    pending_.push_back(comm_.start_reduce_scatter_sum(
        bucket.flat, shard_.narrow(0, bucket.shard_offset, slice_size(bucket))));
  }
}

void GradientBuckets::wait() {
  std::vector<dist::PendingWork> pending;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    pending = std::move(pending_);
    pending_.clear();
  }
  for (auto& work : pending) work.wait();
}

void GradientBuckets::all_gather_parameters() {
  torch::NoGradGuard no_grad;
  std::size_t s = 0;  // segments_ lists each bucket's in bucket order
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const int64_t slice = slice_size(bucket);
    auto mine = torch::zeros({slice}, bucket.options);
    for (; s < segments_.size() && slots_[segments_[s].param].bucket == b; ++s) {
      const optim::ShardSegment& seg = segments_[s];
      mine.narrow(0, seg.shard_offset - bucket.shard_offset, seg.size)
          .copy_(parameters_[seg.param].detach().view(-1).narrow(0, seg.param_offset, seg.size));
    }
    auto all = torch::empty({bucket.elements}, bucket.options);
    comm_.all_gather(mine, all);
    for (const std::size_t i : bucket.params) {
      parameters_[i].detach().view(-1).copy_(
          all.narrow(0, slots_[i].offset, parameters_[i].numel()));
    }
  }
}

std::vector<torch::Tensor> GradientBuckets::gather_whole(const torch::Tensor& values, bool keep) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> whole(keep ? parameters_.size() : 0);
  for (const Bucket& bucket : buckets_) {
    const int64_t slice = slice_size(bucket);
    auto all = torch::empty({bucket.elements}, values.options());
    comm_.all_gather(values.narrow(0, bucket.shard_offset, slice).contiguous(), all);
    if (!keep) continue;
    for (const std::size_t i : bucket.params) {
      whole[i] = all.narrow(0, slots_[i].offset, parameters_[i].numel())
                     .view(parameters_[i].sizes())
                     .to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  return whole;
}

}  // namespace xlme::train
