#include "xlme/model/attention_probs.h"

#include <ATen/autocast_mode.h>
#include "xlme/common/cpu_math.h"
#include "xlme/common/error.h"
#include "xlme/common/runtime.h"
#include "xlme/common/shape_text.h"
#include "xlme/model/dropout.h"

#include "kernel_util.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

namespace xlme::model {

using kernel::empty_if_undefined;
using kernel::rows_per_task;
using kernel::undefined_if_empty;

namespace {

// The fused kernels' operands as raw pointers (nullptr: not given).
template <typename T>
struct ProbsOperands {
  int64_t batch = 0, heads = 0, queries = 0, length = 0;  // length: keys per row
  const T* factor = nullptr;                              // [B * H * T]
  const T* table = nullptr;                               // [H * T * T]
  const bool* padding = nullptr;                          // [B * T]
};

constexpr int64_t kLanes = 8;  // independent partial results, so that reductions vectorize

// One row of the forward before the exponentials: x = s + f * t (t nullptr: x = s), -inf at
// padded keys; returns the row's maximum.
template <typename T>
__attribute__((always_inline)) inline T biased_row(const T* s, const T* t, T f, const bool* pad,
                                                   T* x, int64_t n) {
  if (t) {
    for (int64_t j = 0; j < n; ++j) x[j] = s[j] + f * t[j];
  } else {
    std::copy(s, s + n, x);
  }
  constexpr T kMinusInf = -std::numeric_limits<T>::infinity();
  if (pad) {
    for (int64_t j = 0; j < n; ++j) x[j] = pad[j] ? kMinusInf : x[j];
  }
  T top[kLanes];
  std::fill(top, top + kLanes, kMinusInf);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) top[l] = x[j + l] > top[l] ? x[j + l] : top[l];
  }
  for (; j < n; ++j) top[0] = x[j] > top[0] ? x[j] : top[0];
  return *std::max_element(top, top + kLanes);
}

// One row of the backward: ds = p * (g' - sum(g' * p)) with g' = g through the dropout mask
// (kept where the dropped-out probability pd is nonzero: where p > 0, pd = p * keep > 0 for a kept
// element and 0 for a dropped one; where p = 0 the mask does not matter, as ds = 0), then the bias
// reductions: returns sum(ds * t) and adds f * ds to dt (t nullptr: none).
template <typename T>
__attribute__((always_inline)) inline T backward_row(const T* g, const T* p, const T* pd, T keep,
                                                     const T* t, T f, T* ds, T* dt, int64_t n) {
  if (pd) {
    for (int64_t j = 0; j < n; ++j) ds[j] = (pd[j] != T(0) ? keep : T(0)) * g[j];
  } else {
    std::copy(g, g + n, ds);
  }
  T partial[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) partial[l] += ds[j + l] * p[j + l];
  }
  for (; j < n; ++j) partial[0] += ds[j] * p[j];
  const T dot = std::accumulate(partial, partial + kLanes, T(0));
  for (j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - dot);
  if (!t) return T(0);
  std::fill(partial, partial + kLanes, T(0));
  for (j = 0; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      partial[l] += ds[j + l] * t[j + l];
      dt[j + l] += f * ds[j + l];
    }
  }
  for (; j < n; ++j) {
    partial[0] += ds[j] * t[j];
    dt[j] += f * ds[j];
  }
  return std::accumulate(partial, partial + kLanes, T(0));
}

// The row functions compiled twice: inlined into the dispatchers below for any x86-64 (SSE2)
// and, for float32 where the CPU has them, with AVX2 and FMA (8 floats per instruction, not 4).
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float biased_row_avx2(const float* s, const float* t, float f,
                                                          const bool* pad, float* x, int64_t n) {
  return biased_row(s, t, f, pad, x, n);
}
__attribute__((target("avx2,fma"))) float backward_row_avx2(const float* g, const float* p,
                                                            const float* pd, float keep,
                                                            const float* t, float f, float* ds,
                                                            float* dt, int64_t n) {
  return backward_row(g, p, pd, keep, t, f, ds, dt, n);
}
#endif

template <typename T>
T biased_row_dispatch(const T* s, const T* t, T f, const bool* pad, T* x, int64_t n) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (runtime::cpu_has_avx2_fma()) return biased_row_avx2(s, t, f, pad, x, n);
  }
#endif
  return biased_row(s, t, f, pad, x, n);
}

template <typename T>
T backward_row_dispatch(const T* g, const T* p, const T* pd, T keep, const T* t, T f, T* ds, T* dt,
                        int64_t n) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (runtime::cpu_has_avx2_fma()) return backward_row_avx2(g, p, pd, keep, t, f, ds, dt, n);
  }
#endif
  return backward_row(g, p, pd, keep, t, f, ds, dt, n);
}

// Forward: probs = softmax(scores + factor * table, -inf at padded keys) row by row, and dropped
// = probs with DropoutDraws' mask applied (draws nullptr: no dropout).
template <typename T>
void probs_forward(const T* scores, T* probs, T* dropped, const ProbsOperands<T>& o,
                   const DropoutDraws* draws, T keep) {
  const int64_t rows = o.heads * o.queries, length = o.length;
  at::parallel_for(0, o.batch * rows, rows_per_task(length), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {  // row = (b, h, i)
      T* x = probs + row * length;
      const T top = biased_row_dispatch<T>(
          scores + row * length, o.table ? o.table + (row % rows) * length : nullptr,
          o.factor ? o.factor[row] : T(1), o.padding ? o.padding + (row / rows) * length : nullptr,
          x, length);
      if (top == -std::numeric_limits<T>::infinity()) {  // every key padded: NaN, as softmax
        std::fill(x, x + length, std::numeric_limits<T>::quiet_NaN());
      } else {
        const T inverse = T(1) / cpu::exp_shifted_sum(x, length, top);
        for (int64_t j = 0; j < length; ++j) x[j] *= inverse;
      }
      if (!draws) continue;
      // The mask of model::dropout: element e's draw is half of pair e / 2's.
      T* out = dropped + row * length;
      const int64_t first = row * length;
      uint64_t draw = draws->pair_draw(first >> 1);
      for (int64_t j = 0; j < length; ++j) {
        const int64_t e = first + j;
        if ((e & 1) == 0 && j > 0) draw = draws->pair_draw(e >> 1);
        const uint64_t half = (e & 1) ? (draw >> 32) : (draw & 0xFFFFFFFFULL);
        out[j] = x[j] * (draws->keeps_draw(half) ? keep : T(0));
      }
    }
  });
}

// Backward, rows in memory order spread over the threads: backward_row for each (b, h, i), and
// dfactor[b, h, i]; each thread adds f * ds into a dtable of its own ([H, T, T], zeroed), summed
// at the end (reading the gradient in order, not row (h, i) of every b in turn, which strides
// through memory a page at a time). dropped nullptr: no dropout.
template <typename T>
void probs_backward(const T* grad, const T* probs, const T* dropped, T keep, T* dscores, T* dfactor,
                    T* dtable, const ProbsOperands<T>& o) {
  const int64_t rows = o.heads * o.queries, length = o.length, table_size = rows * length;
  const int threads = at::get_num_threads();
  std::vector<T> partial_tables(dtable ? static_cast<size_t>(threads * table_size) : 0, T(0));
  at::parallel_for(0, o.batch * rows, rows_per_task(length), [&](int64_t begin, int64_t end) {
    T* own = dtable ? partial_tables.data() + at::get_thread_num() * table_size : nullptr;
    for (int64_t row = begin; row < end; ++row) {  // row = (b, h, i)
      const int64_t r = row % rows, offset = row * length;
      const T df = backward_row_dispatch<T>(
          grad + offset, probs + offset, dropped ? dropped + offset : nullptr, keep,
          o.table ? o.table + r * length : nullptr, o.factor ? o.factor[row] : T(1),
          dscores + offset, own ? own + r * length : nullptr, length);
      if (dfactor) dfactor[row] = df;
    }
  });
  if (!dtable) return;
  std::copy(partial_tables.begin(), partial_tables.begin() + table_size, dtable);
  for (int k = 1; k < threads; ++k) {
    const T* add = partial_tables.data() + k * table_size;
    for (int64_t i = 0; i < table_size; ++i) dtable[i] += add[i];
  }
}

template <typename T>
ProbsOperands<T> operands(const torch::Tensor& scores, const torch::Tensor& factor,
                          const torch::Tensor& table, const torch::Tensor& padding) {
  ProbsOperands<T> o;
  o.batch = scores.size(0);
  o.heads = scores.size(1);
  o.queries = scores.size(2);
  o.length = scores.size(3);
  if (factor.defined()) o.factor = factor.data_ptr<T>();
  if (table.defined()) o.table = table.data_ptr<T>();
  if (padding.defined()) o.padding = padding.data_ptr<bool>();
  return o;
}

class AttentionProbsFunction : public torch::autograd::Function<AttentionProbsFunction> {
 public:
  // Undefined factor, table and padding travel as empty tensors (LibTorch 1.13's autograd
  // functions take no undefined inputs).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& scores,
                               const torch::Tensor& factor_or_empty,
                               const torch::Tensor& table_or_empty,
                               const torch::Tensor& padding_or_empty, double p, bool training) {
    const auto factor = undefined_if_empty(factor_or_empty);
    const auto table = undefined_if_empty(table_or_empty);
    const auto padding = undefined_if_empty(padding_or_empty);
    const bool drop = training && p > 0.0;
    const uint64_t seed = drop ? DropoutDraws::next_seed() : 0;
    auto probs = torch::empty_like(scores);
    auto dropped = drop ? torch::empty_like(scores) : probs;
    AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "attention_probs", [&] {
      const DropoutDraws draws(drop ? p : 0.0, seed);
      probs_forward<scalar_t>(scores.data_ptr<scalar_t>(), probs.data_ptr<scalar_t>(),
                              dropped.data_ptr<scalar_t>(),
                              operands<scalar_t>(scores, factor, table, padding),
                              drop ? &draws : nullptr, static_cast<scalar_t>(1.0 / (1.0 - p)));
    });
    ctx->saved_data["keep"] = 1.0 / (1.0 - p);
    // The probabilities (the output itself without dropout) and, with dropout, the output, whose
    // zeros are the mask (the context's product keeps it anyway).
    ctx->save_for_backward(
        drop ? torch::autograd::variable_list{factor_or_empty, table_or_empty, probs, dropped}
             : torch::autograd::variable_list{factor_or_empty, table_or_empty, probs});
    return dropped;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto factor = undefined_if_empty(saved[0]);
    const auto table = undefined_if_empty(saved[1]);
    const auto& probs = saved[2];
    const auto dropped = saved.size() > 3 ? saved[3] : torch::Tensor();
    const double keep = ctx->saved_data["keep"].toDouble();
    const auto grad = grads[0].contiguous();
    auto dscores = torch::empty_like(probs);
    const int64_t batch = probs.size(0), heads = probs.size(1), queries = probs.size(2),
                  length = probs.size(3);
    torch::Tensor dfactor, dtable;
    if (table.defined()) {
      dtable = torch::empty({heads, queries, length}, probs.options());
      if (factor.defined()) dfactor = torch::empty({batch, heads, queries, 1}, probs.options());
    }
    AT_DISPATCH_FLOATING_TYPES(probs.scalar_type(), "attention_probs_backward", [&] {
      probs_backward<scalar_t>(grad.data_ptr<scalar_t>(), probs.data_ptr<scalar_t>(),
                               dropped.defined() ? dropped.data_ptr<scalar_t>() : nullptr,
                               static_cast<scalar_t>(keep), dscores.data_ptr<scalar_t>(),
                               dfactor.defined() ? dfactor.data_ptr<scalar_t>() : nullptr,
                               dtable.defined() ? dtable.data_ptr<scalar_t>() : nullptr,
                               operands<scalar_t>(probs, factor, table, torch::Tensor()));
    });
    return {dscores, dfactor, dtable, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool attention_probs_fused(const torch::Tensor& scores, const torch::Tensor& factor,
                           const torch::Tensor& table) {
  const auto dtype = scores.scalar_type();
  const auto fits = [&](const torch::Tensor& t) {
    return !t.defined() || (t.device().is_cpu() && t.scalar_type() == dtype);
  };
  return scores.device().is_cpu() && (dtype == torch::kFloat32 || dtype == torch::kFloat64) &&
         scores.dim() == 4 && scores.is_contiguous() &&
         !at::autocast::is_autocast_enabled(at::kCPU) && fits(factor) && fits(table);
}

torch::Tensor attention_probs(const torch::Tensor& scores, const torch::Tensor& factor,
                              const torch::Tensor& table, const torch::Tensor& padding, double p,
                              bool training) {
  XLME_CHECK(attention_probs_fused(scores, factor, table),
             "attention_probs takes contiguous float32 or float64 CPU scores outside autocast, "
             "with a factor and table of their dtype (got {} scores on {})",
             c10::toString(scores.scalar_type()), scores.device().str());
  XLME_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got {}", p);
  const int64_t batch = scores.size(0), heads = scores.size(1), queries = scores.size(2),
                keys = scores.size(3);
  XLME_CHECK(
      (!table.defined() || table.sizes() == torch::IntArrayRef{heads, queries, keys}) &&
          (!factor.defined() || factor.sizes() == torch::IntArrayRef{batch, heads, queries, 1}) &&
          (!padding.defined() || padding.sizes() == torch::IntArrayRef{batch, keys}),
      "attention_probs: scores {} need a table [H, Tq, Tk], a factor [B, H, Tq, 1] and "
      "padding [B, Tk]; got {}, {} and {}",
      shape_text(scores.sizes()), table.defined() ? shape_text(table.sizes()) : "none",
      factor.defined() ? shape_text(factor.sizes()) : "none",
      padding.defined() ? shape_text(padding.sizes()) : "none");
  const auto options = scores.options();
  return AttentionProbsFunction::apply(
      scores, empty_if_undefined(factor.defined() ? factor.contiguous() : factor, options),
      empty_if_undefined(table.defined() ? table.contiguous() : table, options),
      empty_if_undefined(padding.defined() ? padding.contiguous() : padding, torch::kBool), p,
      training);
}

}  // namespace xlme::model
