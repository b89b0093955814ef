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

}  // namespace xlme::cpu
