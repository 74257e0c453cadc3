// A decoding step has one query row per head against the whole cache. As a batched matmul that is
// one sgemm per head with M = 1, and OpenBLAS packs (copies) every cached key and value before it
// multiplies: in a profile of 800 decoded tokens the packing alone took 16% of the time. Here each
// row goes through in one pass on one thread: scores as dot products straight off the cache, its
// softmax, and its output as a weighted sum of cached values; every cached byte is read once. (The
// softmax was one LibTorch op over all rows; past ~250 cached tokens it opened an OpenMP region,
// whose worker then spun for milliseconds on the core the decode team's worker needed.)
#include "nn/attention_decode.h"

#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "base/parallel.h"

#include "base/x86_intrinsics.h"

// Sleef's AVX2 expf (libsleef). sleef.h declares it only when the whole file is compiled for AVX;
// this one is compiled for any x86-64 and picks its AVX2 kernels at run time.
#if defined(__x86_64__)
extern "C" __attribute__((target("avx2,fma"))) __m256 Sleef_expf8_u10avx2(__m256);
#endif

namespace torchpatch::nn {

namespace {

constexpr int64_t kMaxRowsPerKvHead = 8;  // beyond this (prefill) a matmul's blocking wins

// Which rows a parallel task covers: row r is (batch, query head, query position).
struct RowIndex {
  int64_t b, h, i;
};

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), acc1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(acc0, acc1));
  float sum = 0;
  for (float lane : lanes) sum += lane;
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

// out[0, hd) = sum over s < n of p[s] * v[s * stride + (0, hd)], 64 columns at a time in registers.
__attribute__((target("avx2,fma"))) void weighted_sum_avx2(const float* p, const float* v, int64_t stride, int64_t n,
                                                          float* out, int64_t hd) {
  int64_t c = 0;
  for (; c + 64 <= hd; c += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t s = 0; s < n; ++s) {
      const __m256 ps = _mm256_set1_ps(p[s]);
      const float* row = v + s * stride + c;
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(ps, _mm256_loadu_ps(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + c + 8 * j, acc[j]);
  }
  for (; c < hd; ++c) {
    float sum = 0;
    for (int64_t s = 0; s < n; ++s) sum += p[s] * v[s * stride + c];
    out[c] = sum;
  }
}

// x[0, n) = softmax(x): exp(x - max) by Sleef's vector expf (1.0 ulp; LibTorch's softmax uses it too),
// then times 1 / sum.
__attribute__((target("avx2,fma"))) void softmax_avx2(float* x, int64_t n) {
  const float lowest = std::numeric_limits<float>::lowest();
  __m256 vmax = _mm256_set1_ps(lowest);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float max = lowest;
  for (float lane : lanes) max = std::max(max, lane);
  for (int64_t t = j; t < n; ++t) max = std::max(max, x[t]);
  const __m256 shift = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_loadu_ps(x + j), shift));
    _mm256_storeu_ps(x + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (j < n) {  // the tail through one more vector, its missing lanes exp(lowest) = 0
    for (auto& lane : lanes) lane = lowest;
    for (int64_t t = j; t < n; ++t) lanes[t - j] = x[t];
    const __m256 e = Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_load_ps(lanes), shift));
    _mm256_store_ps(lanes, e);
    for (int64_t t = j; t < n; ++t) x[t] = lanes[t - j];
    vsum = _mm256_add_ps(vsum, e);
  }
  _mm256_store_ps(lanes, vsum);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  const float inverse = 1.0f / sum;
  const __m256 scale = _mm256_set1_ps(inverse);
  for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), scale));
  for (; j < n; ++j) x[j] *= inverse;
}

bool has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
bool has_avx2() { return false; }
float dot_avx2(const float*, const float*, int64_t) { return 0; }
void weighted_sum_avx2(const float*, const float*, int64_t, int64_t, float*, int64_t) {}
void softmax_avx2(float*, int64_t) {}
#endif

float dot_scalar(const float* a, const float* b, int64_t n) {
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

void weighted_sum_scalar(const float* p, const float* v, int64_t stride, int64_t n, float* out, int64_t hd) {
  for (int64_t c = 0; c < hd; ++c) {
    float sum = 0;
    for (int64_t s = 0; s < n; ++s) sum += p[s] * v[s * stride + c];
    out[c] = sum;
  }
}

void softmax_scalar(float* x, int64_t n) {
  float max = std::numeric_limits<float>::lowest(), sum = 0;
  for (int64_t j = 0; j < n; ++j) max = std::max(max, x[j]);
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - max));
  const float inverse = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inverse;
}

}  // namespace

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const auto is_float = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.device().is_cpu(); };
  if (!is_float(q) || !is_float(k) || !is_float(v) || (mask.defined() && !is_float(mask))) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.sizes() != k.sizes() || k.size(1) == 0 || q.size(1) % k.size(1) != 0) return false;
  if (q.size(1) / k.size(1) * q.size(2) > kMaxRowsPerKvHead) return false;
  if (k.stride(3) != 1 || v.stride(3) != 1) return false;
  const bool wants_grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  return !wants_grad;
}

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scaling, std::optional<double> softcap) {
  const auto q = q_in.stride(3) == 1 ? q_in : q_in.contiguous();
  const int64_t b = q.size(0), heads = q.size(1), len = q.size(2), hd = q.size(3);
  const int64_t kv_len = k.size(2), groups = heads / k.size(1);
  const int64_t rows = b * heads * len;
  const auto row = [&](int64_t r) { return RowIndex{r / (heads * len), r / len % heads, r % len}; };
  const bool avx2 = has_avx2();
  const auto dot = avx2 ? dot_avx2 : dot_scalar;
  const auto weighted_sum = avx2 ? weighted_sum_avx2 : weighted_sum_scalar;
  const auto softmax = avx2 ? softmax_avx2 : softmax_scalar;
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  // The mask as [B, nH, Q, KV] strides (0 along the dimensions it broadcasts over).
  const at::Tensor m = mask.defined() ? mask.expand({b, heads, len, kv_len}) : at::Tensor();
  const float* mp = m.defined() ? m.data_ptr<float>() : nullptr;
  const float scale = static_cast<float>(scaling);
  const float cap = softcap ? static_cast<float>(*softcap) : 0.0f;

  // out [B, Q, nH, hd] = softmax(q k^T * scaling (soft-capped) + mask) v, row by row
  auto out = at::empty({b, len, heads, hd}, q.options());
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(kv_len * hd, 1));  // rows a part takes
  base::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> p(static_cast<std::size_t>(kv_len));
    for (int64_t r = begin; r < end; ++r) {
      const auto [bi, h, i] = row(r);
      const float* qr = qp + bi * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const float* kr = kp + bi * k.stride(0) + (h / groups) * k.stride(1);
      for (int64_t s = 0; s < kv_len; ++s) p[s] = dot(qr, kr + s * k.stride(2), hd) * scale;
      if (softcap) {
        for (auto& x : p) x = std::tanh(x / cap) * cap;
      }
      if (mp) {
        const float* mr = mp + bi * m.stride(0) + h * m.stride(1) + i * m.stride(2);
        for (int64_t s = 0; s < kv_len; ++s) p[s] += mr[s * m.stride(3)];
      }
      softmax(p.data(), kv_len);
      const float* vr = vp + bi * v.stride(0) + (h / groups) * v.stride(1);
      weighted_sum(p.data(), vr, v.stride(2), kv_len, op + ((bi * len + i) * heads + h) * hd, hd);
    }
  });
  return out;
}

}  // namespace torchpatch::nn
