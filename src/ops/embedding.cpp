#include "xlme/ops/embedding.h"

#include "xlme/ops/weight_gradient.h"

#include <torch/torch.h>

#ifdef XLME_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace xlme::ops {

namespace {

struct RowsLookup : torch::autograd::Function<RowsLookup> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& table,
                               const torch::Tensor& ids) {
    ctx->save_for_backward({ids});
    ctx->saved_data["table"] = table;
    return torch::embedding(table, ids);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto table = ctx->saved_data["table"].toTensor();
    const auto ids = ctx->get_saved_variables()[0].reshape({1, -1});
    const int64_t width = grads[0].size(-1);
    const auto rows = grads[0].reshape({-1, width});
    const auto sparse = torch::sparse_coo_tensor(ids, rows, table.sizes()).coalesce();
    auto buffer = table.grad();
    if (!buffer.defined() || buffer.layout() != torch::kStrided) return {sparse, torch::Tensor()};
    // Distinct rows: one add per element, the same bits every run.
    buffer.index_add_(0, sparse._indices().select(0, 0), sparse._values());
    return {gradient_added_in_place(table), torch::Tensor()};
  }
};

// Whether a CUDA graph is being captured on `table`'s device's current stream.
bool capturing(const torch::Tensor& table) {
#ifdef XLME_WITH_CUDA
  if (table.is_cuda()) {
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  }
#endif
  (void)table;
  return false;
}

}  // namespace

bool embedding_gradient_is_rows(const torch::Tensor& table) {
  return torch::GradMode::is_enabled() && table.requires_grad() && table.grad().defined() &&
         table.grad().layout() == torch::kStrided && !capturing(table);
}

torch::Tensor embedding_lookup(const torch::Tensor& table, const torch::Tensor& ids) {
  if (embedding_gradient_is_rows(table)) return RowsLookup::apply(table, ids);
  return torch::embedding(table, ids);
}

}  // namespace xlme::ops
