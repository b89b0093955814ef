#include "xlme/common/cpu_math.h"

#include "xlme/common/runtime.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>

namespace xlme::cpu {

namespace {

#if defined(__x86_64__)
// exp of 8 floats that are <= 0 (or NaN), Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2
// split in two for the reduction), e^r by a degree-7 polynomial, 2^n through the exponent bits.
// Below -87.34 (e^x under float's smallest normal, -inf included) the result is 0.
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3365447504f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);  // false for NaN
  x = _mm256_max_ps(lowest, x);                                   // keeps NaN (second operand)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(exponent)));
}

__attribute__((target("avx2,fma"))) float lane_sum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float sum = 0.0f;
  for (const float l : lanes) sum += l;
  return sum;
}

template <bool kWrite>
__attribute__((target("avx2,fma"))) float exp_shifted_avx2(float* out, const float* x, int64_t n,
                                                           float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    if constexpr (kWrite) _mm256_storeu_ps(out + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = lane_sum(acc);
  for (; j < n; ++j) {
    const float e = std::exp(x[j] - shift);
    if constexpr (kWrite) out[j] = e;
    sum += e;
  }
  return sum;
}

// Phi(x) = (1 + erf(x / sqrt 2)) / 2 and phi(x) = exp(-x^2 / 2) / sqrt(2 pi) of 8 floats, erf by
// Abramowitz & Stegun 7.1.26 on |z| (z = x / sqrt 2) with the sign put back.
struct NormalParts {
  __m256 cdf, pdf;
};
__attribute__((target("avx2,fma"))) inline NormalParts normal_parts(__m256 x) {
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
  const __m256 sign = _mm256_and_ps(z, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z);  // |z|
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
  __m256 poly = _mm256_set1_ps(1.061405429f);
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
  poly = _mm256_mul_ps(poly, t);
  const __m256 gauss = exp_nonpositive(_mm256_mul_ps(_mm256_mul_ps(a, a), _mm256_set1_ps(-1.0f)));
  const __m256 erf_abs = _mm256_fnmadd_ps(poly, gauss, one);  // 1 - poly e^{-z^2}
  const __m256 erf = _mm256_or_ps(erf_abs, sign);
  return {_mm256_mul_ps(_mm256_add_ps(one, erf), _mm256_set1_ps(0.5f)),
          _mm256_mul_ps(gauss, _mm256_set1_ps(0.39894228040143268f))};
}

__attribute__((target("avx2,fma"))) void bias_gelu_avx2(const float* c, const float* b, float* out,
                                                        int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(c + j), _mm256_loadu_ps(b + j));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(x, normal_parts(x).cdf));
  }
  for (; j < n; ++j) {
    const float x = c[j] + b[j];
    out[j] = x * 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
  }
}

__attribute__((target("avx2,fma"))) void bias_gelu_backward_avx2(const float* g, const float* c,
                                                                 const float* b, float* dc,
                                                                 float* db_sum, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(c + j), _mm256_loadu_ps(b + j));
    const NormalParts parts = normal_parts(x);
    const __m256 d =
        _mm256_mul_ps(_mm256_loadu_ps(g + j), _mm256_fmadd_ps(x, parts.pdf, parts.cdf));
    _mm256_storeu_ps(dc + j, d);
    _mm256_storeu_ps(db_sum + j, _mm256_add_ps(_mm256_loadu_ps(db_sum + j), d));
  }
  for (; j < n; ++j) {
    const float x = c[j] + b[j];
    const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
    const float pdf = std::exp(-0.5f * x * x) * 0.39894228040143268f;
    dc[j] = g[j] * (cdf + x * pdf);
    db_sum[j] += dc[j];
  }
}

__attribute__((target("avx2,fma"))) float max_avx2(const float* x, int64_t n) {
  __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  // max_ps(x, top) returns top where x is NaN: NaN is skipped.
  for (; j + 8 <= n; j += 8) top = _mm256_max_ps(_mm256_loadu_ps(x + j), top);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  float value = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) value = x[j] > value ? x[j] : value;
  return value;
}
#endif

template <typename T, bool kWrite>
T exp_shifted_scalar(T* out, const T* x, int64_t n, T shift) {
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const T e = std::exp(x[j] - shift);
    if constexpr (kWrite) out[j] = e;
    sum += e;
  }
  return sum;
}

template <typename T>
T max_scalar(const T* x, int64_t n) {
  T value = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) value = x[j] > value ? x[j] : value;
  return value;
}

template <typename T>
void bias_gelu_scalar(const T* c, const T* b, T* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T x = c[j] + b[j];
    out[j] = x * T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
  }
}

template <typename T>
void bias_gelu_backward_scalar(const T* g, const T* c, const T* b, T* dc, T* db_sum, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T x = c[j] + b[j];
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
    const T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
    dc[j] = g[j] * (cdf + x * pdf);
    db_sum[j] += dc[j];
  }
}

template <typename T>
RowMax<T> first_index_of(const T* x, int64_t n, T value) {
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] == value) return {value, j};
  }
  // Only NaN (-inf was never exceeded, and no element equals it).
  return {std::numeric_limits<T>::quiet_NaN(), 0};
}

}  // namespace

float exp_shifted_sum(float* x, int64_t n, float shift) {
#if defined(__x86_64__)
  if (runtime::cpu_has_avx2_fma()) return exp_shifted_avx2<true>(x, x, n, shift);
#endif
  return exp_shifted_scalar<float, true>(x, x, n, shift);
}

double exp_shifted_sum(double* x, int64_t n, double shift) {
  return exp_shifted_scalar<double, true>(x, x, n, shift);
}

float exp_shifted_total(const float* x, int64_t n, float shift) {
#if defined(__x86_64__)
  if (runtime::cpu_has_avx2_fma()) return exp_shifted_avx2<false>(nullptr, x, n, shift);
#endif
  return exp_shifted_scalar<float, false>(nullptr, x, n, shift);
}

double exp_shifted_total(const double* x, int64_t n, double shift) {
  return exp_shifted_scalar<double, false>(nullptr, x, n, shift);
}

RowMax<float> row_max(const float* x, int64_t n) {
#if defined(__x86_64__)
  if (runtime::cpu_has_avx2_fma()) return first_index_of(x, n, max_avx2(x, n));
#endif
  return first_index_of(x, n, max_scalar(x, n));
}

RowMax<double> row_max(const double* x, int64_t n) {
  return first_index_of(x, n, max_scalar(x, n));
}

void bias_gelu_row(const float* c, const float* b, float* out, int64_t n) {
#if defined(__x86_64__)
  if (runtime::cpu_has_avx2_fma()) return bias_gelu_avx2(c, b, out, n);
#endif
  bias_gelu_scalar(c, b, out, n);
}

void bias_gelu_row(const double* c, const double* b, double* out, int64_t n) {
  bias_gelu_scalar(c, b, out, n);
}

void bias_gelu_backward_row(const float* g, const float* c, const float* b, float* dc,
                            float* db_sum, int64_t n) {
#if defined(__x86_64__)
  if (runtime::cpu_has_avx2_fma()) return bias_gelu_backward_avx2(g, c, b, dc, db_sum, n);
#endif
  bias_gelu_backward_scalar(g, c, b, dc, db_sum, n);
}

void bias_gelu_backward_row(const double* g, const double* c, const double* b, double* dc,
                            double* db_sum, int64_t n) {
  bias_gelu_backward_scalar(g, c, b, dc, db_sum, n);
}

}  // namespace xlme::cpu
