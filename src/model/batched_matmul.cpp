#include "xlme/model/batched_matmul.h"

#include "xlme/model/linear.h"
#include "xlme/model/own_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <vector>

namespace xlme::model {

namespace {

// The Fortran BLAS LibTorch carries (the wheel's MKL exports sgemm_ and dgemm_ from
// libtorch_cpu), looked up once in the process: no link-time dependency, and no fast path where it
// is absent. Called from inside at::parallel_for's OpenMP region, MKL runs each product on the
// calling thread (MKL_DYNAMIC, its default).
using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                         const float*, const int*, const float*, const int*, const float*, float*,
                         const int*);
using DgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*,
                         const double*, const double*, const int*, const double*, const int*,
                         const double*, double*, const int*);

struct Blas {
  SgemmFn sgemm = nullptr;
  DgemmFn dgemm = nullptr;
  bool usable() const { return sgemm && dgemm; }
};

const Blas& blas() {
  static const Blas found = [] {
    Blas b;
    b.sgemm = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
    b.dgemm = reinterpret_cast<DgemmFn>(dlsym(RTLD_DEFAULT, "dgemm_"));
    return b;
  }();
  return found;
}

// One matrix of a batch as BLAS sees it: row-major (unit stride along columns) or column-major
// (unit stride along rows), with its leading dimension.
struct MatrixLayout {
  bool row_major = true;
  int64_t ld = 0;
};

// The layout of the last two dimensions, if BLAS can read them as they are.
bool blas_layout(const torch::Tensor& t, MatrixLayout* layout) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  if (t.stride(-1) == 1 && t.stride(-2) >= std::max<int64_t>(1, cols)) {
    *layout = {true, t.stride(-2)};
    return true;
  }
  if (t.stride(-2) == 1 && t.stride(-1) >= std::max<int64_t>(1, rows)) {
    *layout = {false, t.stride(-1)};
    return true;
  }
  return false;
}

// Offsets of every matrix of the batch (the leading dimensions, with their strides).
std::vector<int64_t> batch_offsets(const torch::Tensor& t) {
  const int64_t dims = t.dim() - 2;
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d < dims; ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(t.size(d)));
    for (const int64_t o : offsets) {
      for (int64_t i = 0; i < t.size(d); ++i) next.push_back(o + i * t.stride(d));
    }
    offsets = std::move(next);
  }
  return offsets;
}

template <typename scalar_t>
void gemm(const char* ta, const char* tb, int m, int n, int k, scalar_t alpha, const scalar_t* a,
          int lda, const scalar_t* b, int ldb, scalar_t* c, int ldc) {
  const scalar_t zero = 0;
  if constexpr (std::is_same_v<scalar_t, float>) {
    blas().sgemm(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &zero, c, &ldc);
  } else {
    blas().dgemm(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &zero, c, &ldc);
  }
}

// c = alpha a x b for every matrix of the batch; operands already in a BLAS layout.
torch::Tensor product(torch::Tensor a, torch::Tensor b, double alpha) {
  MatrixLayout la, lb;
  if (!blas_layout(a, &la)) {
    a = a.contiguous();
    blas_layout(a, &la);
  }
  if (!blas_layout(b, &lb)) {
    b = b.contiguous();
    blas_layout(b, &lb);
  }
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  auto sizes = a.sizes().vec();
  sizes.back() = n;
  auto c = torch::empty(sizes, a.options());  // [..., M, N] contiguous
  const auto a_offsets = batch_offsets(a), b_offsets = batch_offsets(b);
  const auto count = static_cast<int64_t>(a_offsets.size());
  if (c.numel() == 0) return c;
  if (k == 0) return c.zero_();
  // Column-major BLAS computes the row-major c as c^T = b^T a^T: b comes first. A row-major
  // operand is its transpose in column-major terms ("N"); a column-major one needs "T".
  const char* tb = lb.row_major ? "N" : "T";
  const char* ta = la.row_major ? "N" : "T";
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "batched_matmul", [&] {
    const scalar_t* pa = a.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    scalar_t* pc = c.data_ptr<scalar_t>();
    at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        gemm<scalar_t>(tb, ta, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                       static_cast<scalar_t>(alpha), pb + b_offsets[i], static_cast<int>(lb.ld),
                       pa + a_offsets[i], static_cast<int>(la.ld), pc + i * m * n,
                       static_cast<int>(n));
      }
    });
  });
  return c;
}

class BatchedMatmulFunction : public torch::autograd::Function<BatchedMatmulFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& b, double alpha) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["alpha"] = alpha;
    return product(a, b, alpha);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    const auto& b = saved[1];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const auto& grad = grads[0];  // [..., M, N]
    torch::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = product(grad, b.transpose(-2, -1), alpha);  // [..., M, K]
    if (ctx->needs_input_grad(1)) db = product(a.transpose(-2, -1), grad, alpha);  // [..., K, N]
    return {da, db, torch::Tensor()};
  }
};

// The operands the own path takes (whatever the autocast state): float32 or float64 CPU tensors
// of the same dtype and leading dimensions, with a BLAS found.
bool float_operands_fit(const torch::Tensor& a, const torch::Tensor& b) {
  const auto dtype = a.scalar_type();
  return own_cpu_kernel(OwnKernel::kBatchedMatmul) && blas().usable() && a.device().is_cpu() &&
         b.device().is_cpu() && (dtype == torch::kFloat32 || dtype == torch::kFloat64) &&
         b.scalar_type() == dtype && a.dim() >= 3 && a.dim() == b.dim() &&
         a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) &&
         a.size(-1) == b.size(-2) &&
         std::max({a.size(-2), a.size(-1), b.size(-1)}) <= std::numeric_limits<int>::max();
}

}  // namespace

bool batched_matmul_fast_path(const torch::Tensor& a, const torch::Tensor& b) {
  return !at::autocast::is_autocast_enabled(at::kCPU) && float_operands_fit(a, b);
}

torch::Tensor bf16_emulated_matmul(const torch::Tensor& a, const torch::Tensor& b) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  const auto ra = bf16_rounded(a), rb = bf16_rounded(b);
  const auto product = float_operands_fit(ra, rb) ? BatchedMatmulFunction::apply(ra, rb, 1.0)
                                                  : torch::matmul(ra, rb);
  return product.to(torch::kBFloat16);
}

torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, double alpha) {
  if (batched_matmul_fast_path(a, b)) return BatchedMatmulFunction::apply(a, b, alpha);
  const auto scaled = alpha == 1.0 ? a : a * alpha;
  if (emulate_bf16_products(a)) return bf16_emulated_matmul(scaled, b);
  return torch::matmul(scaled, b);
}

}  // namespace xlme::model
