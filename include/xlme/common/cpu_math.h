// xlme's own vectorized CPU math, for kernels that fuse what LibTorch runs as separate passes
// (attention's probabilities, the generator's cross-entropy). float32 runs 8 lanes at a time with
// AVX2 and FMA where the CPU has them (runtime::cpu_has_avx2_fma), scalar code elsewhere; float64
// is scalar.
#pragma once

#include <cstdint>

namespace xlme::cpu {

// exp(x[j] - shift) in place for j < n, and their sum: a softmax's exponentials. x[j] - shift
// must be <= 0 or NaN (a softmax shifts by the row's maximum or more). float32: Cephes' expf
// polynomial, within 2 ulp of std::exp where e^(x - shift) is a normal float, 0 below (-inf
// included), NaN for NaN.
float exp_shifted_sum(float* x, int64_t n, float shift);
double exp_shifted_sum(double* x, int64_t n, double shift);

// The same sum without writing: sum_j exp(x[j] - shift).
float exp_shifted_total(const float* x, int64_t n, float shift);
double exp_shifted_total(const double* x, int64_t n, double shift);

// The largest of x[0..n) (n > 0) and the first index holding it; NaN elements are skipped (a row
// of NaN only gives NaN at index 0).
template <typename T>
struct RowMax {
  T value;
  int64_t index;
};
RowMax<float> row_max(const float* x, int64_t n);
RowMax<double> row_max(const double* x, int64_t n);

// GELU with a bias, over one row of n columns: out[j] = gelu(c[j] + b[j]), gelu(x) = x Phi(x) =
// x (1 + erf(x / sqrt 2)) / 2. float32: erf by Abramowitz & Stegun 7.1.26 (absolute error under
// 1.5e-7, the approximation LibTorch's own vectorized GELU uses); float64: std::erf.
void bias_gelu_row(const float* c, const float* b, float* out, int64_t n);
void bias_gelu_row(const double* c, const double* b, double* out, int64_t n);

// Its backward over the same row: dc[j] = g[j] gelu'(c[j] + b[j]), gelu'(x) = Phi(x) + x phi(x);
// adds dc into db_sum[j] (the bias gradient, summed over rows).
void bias_gelu_backward_row(const float* g, const float* c, const float* b, float* dc,
                            float* db_sum, int64_t n);
void bias_gelu_backward_row(const double* g, const double* c, const double* b, double* dc,
                            double* db_sum, int64_t n);

}  // namespace xlme::cpu
