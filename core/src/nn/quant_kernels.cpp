// Products with Q8_0 / Q4_0 weights (nn/quant.h): y = x W^T + b, x float [T, in], W blocks [out, in/32].
// As llama.cpp does, each row of x is first quantized to Q8_0 (an int8 block and a float32 scale per
// 32 values), so a block's dot product is 32 int8 products summed exactly in int32, then scaled by
// d_w * d_x. Q4_0 weights enter unsigned (0..15) and the offset comes back per block as 8 * sum(x_q).
//
// Kernels: scalar, and AVX2 (maddubs / madd over 32 bytes, the sign trick for Q8_0's signed weights),
// chosen at run time. Output rows are split across LibTorch's intra-op threads; each row is computed by
// one thread in one order, so a result does not depend on the thread count.
#include "torchpatch/nn/quant.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include "torchpatch/error.h"

namespace torchpatch::nn {

namespace {

constexpr int64_t kBlock = kQuantBlockSize;

/// One row of activations in Q8_0: `q` [k], per block its scale `d` and the sum of its values.
struct QuantizedRow {
  const int8_t* q;
  const float* d;
  const int32_t* sum;
};

float half_at(const uint8_t* p) { return c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// Activations: d = amax / 127, q = round-to-nearest-even(x / d). Not the weights' reference rounding
// (half away from zero): what matters here is that the scalar and vector kernels agree.
void quantize_activations(const float* x, int64_t k, int8_t* q, float* d, int32_t* sum) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    d[b] = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      const float v = std::nearbyint(xb[j] * id);
      q[b * kBlock + j] = static_cast<int8_t>(std::isnan(v) ? 0.0f : std::clamp(v, -127.0f, 127.0f));
      s += q[b * kBlock + j];
    }
    sum[b] = s;
  }
}

// -- scalar ---------------------------------------------------------------------------------------------

float dot_q8_0_scalar(const uint8_t* w, const QuantizedRow& x, int64_t blocks) {
  float total = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * 34;
    int32_t acc = 0;
    for (int64_t j = 0; j < kBlock; ++j) acc += static_cast<int8_t>(wb[2 + j]) * x.q[b * kBlock + j];
    total += half_at(wb) * x.d[b] * static_cast<float>(acc);
  }
  return total;
}

float dot_q4_0_scalar(const uint8_t* w, const QuantizedRow& x, int64_t blocks) {
  float total = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * 18;
    const int8_t* xq = x.q + b * kBlock;
    int32_t acc = 0;
    for (int64_t j = 0; j < kBlock / 2; ++j) acc += (wb[2 + j] & 0x0f) * xq[j] + (wb[2 + j] >> 4) * xq[j + kBlock / 2];
    total += half_at(wb) * x.d[b] * static_cast<float>(acc - 8 * x.sum[b]);
  }
  return total;
}

// -- AVX2 -----------------------------------------------------------------------------------------------

__attribute__((target("avx2,fma,f16c"))) inline float hsum_avx2(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

__attribute__((target("avx2,fma,f16c"))) inline float half_avx2(const uint8_t* p) {
  return _cvtsh_ss(static_cast<uint16_t>(p[0] | p[1] << 8));
}

// 8 int32 partial sums of 32 products of unsigned `u` and signed `s` bytes.
__attribute__((target("avx2,fma,f16c"))) inline __m256i dot_us8_avx2(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

__attribute__((target("avx2,fma,f16c"))) float dot_q8_0_avx2(const uint8_t* w, const QuantizedRow& x, int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * 34;
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * kBlock));
    // maddubs multiplies unsigned by signed bytes: |w| times x carrying w's sign is w * x.
    const __m256i products = dot_us8_avx2(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_avx2(wb) * x.d[b]), _mm256_cvtepi32_ps(products), acc);
  }
  return hsum_avx2(acc);
}

__attribute__((target("avx2,fma,f16c"))) float dot_q4_0_avx2(const uint8_t* w, const QuantizedRow& x, int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  float offset = 0.0f;  // sum over blocks of scale * 8 * sum(x_q): the nibbles' "- 8", taken out once
  const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = w + b * 18;
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 2));
    // Weights 0..15 in the low lane, 16..31 in the high lane, as the activations are laid out.
    const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low_nibbles);
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * kBlock));
    const float scale = half_avx2(wb) * x.d[b];
    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(dot_us8_avx2(nibbles, qx)), acc);
    offset += scale * static_cast<float>(8 * x.sum[b]);
  }
  return hsum_avx2(acc) - offset;
}

// -- dispatch -------------------------------------------------------------------------------------------

using DotFn = float (*)(const uint8_t*, const QuantizedRow&, int64_t);

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know it).
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  return has;
}

std::atomic<QuantKernel> chosen_kernel{QuantKernel::kAuto};

DotFn dot_for(QuantFormat format, QuantKernel kernel) {
  const bool avx2 = kernel != QuantKernel::kScalar && cpu_has_avx2();
  if (format == QuantFormat::kQ8_0) return avx2 ? dot_q8_0_avx2 : dot_q8_0_scalar;
  return avx2 ? dot_q4_0_avx2 : dot_q4_0_scalar;
}

void check_operands(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                    const at::Tensor& bias) {
  const int64_t bytes = block_bytes(format);
  const int64_t in = x.dim() == 0 ? 0 : x.size(-1);
  if (x.scalar_type() != at::kFloat || in % kBlock != 0 || in == 0) {
    throw InputError(fmt::format("{} linear: input must be float32 [..., a multiple of 32], not {} {}",
                                 format_name(format), c10::toString(x.scalar_type()), fmt::join(x.sizes(), "x")));
  }
  if (blocks.scalar_type() != at::kByte || blocks.dim() != 2 || blocks.size(0) != out_features ||
      blocks.size(1) != in / kBlock * bytes || !blocks.is_contiguous()) {
    throw InputError(fmt::format("{} linear: weight blocks must be contiguous uint8 [{}, {}] for input {}, not {} {}",
                                 format_name(format), out_features, in / kBlock * bytes, in,
                                 c10::toString(blocks.scalar_type()), fmt::join(blocks.sizes(), "x")));
  }
  if (bias.defined() && (bias.scalar_type() != at::kFloat || bias.dim() != 1 || bias.size(0) != out_features)) {
    throw InputError(fmt::format("{} linear: bias must be float32 [{}], not {} {}", format_name(format), out_features,
                                 c10::toString(bias.scalar_type()), fmt::join(bias.sizes(), "x")));
  }
}

}  // namespace

QuantKernel set_quant_kernel(QuantKernel kernel) { return chosen_kernel.exchange(kernel); }

bool quant_kernel_available(QuantKernel kernel) { return kernel != QuantKernel::kAvx2 || cpu_has_avx2(); }

at::Tensor quant_linear(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks, int64_t out_features,
                        const at::Tensor& bias) {
  check_operands(format, x, blocks, out_features, bias);
  const int64_t in = x.size(-1);
  const int64_t tokens = x.numel() / in;
  const int64_t per_row = in / kBlock;
  const at::Tensor input = x.contiguous();

  // Every token's activations quantized once, shared by all output rows.
  std::vector<int8_t> q(tokens * in);
  std::vector<float> d(tokens * per_row);
  std::vector<int32_t> sums(tokens * per_row);
  const float* src = input.data_ptr<float>();
  at::parallel_for(0, tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      quantize_activations(src + t * in, in, q.data() + t * in, d.data() + t * per_row, sums.data() + t * per_row);
    }
  });

  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = out_features;
  at::Tensor out = at::empty(out_sizes, at::kFloat);
  float* y = out.data_ptr<float>();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  const at::Tensor bias_values = bias.defined() ? bias.contiguous() : at::Tensor();
  const float* b = bias_values.defined() ? bias_values.data_ptr<float>() : nullptr;
  const int64_t row_bytes = blocks.size(1);
  const DotFn dot = dot_for(format, chosen_kernel.load());
  // Each weight row is read once from memory and reused from cache for every token.
  at::parallel_for(0, out_features, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t t = 0; t < tokens; ++t) {
        const QuantizedRow row{q.data() + t * in, d.data() + t * per_row, sums.data() + t * per_row};
        y[t * out_features + o] = dot(w + o * row_bytes, row, per_row) + (b ? b[o] : 0.0f);
      }
    }
  });
  return out;
}

}  // namespace torchpatch::nn
