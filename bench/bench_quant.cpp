// Products with Q8_0 / Q4_0 weights (nn/quant.h) against float32, on llama-125m's shapes (hidden 768,
// intermediate 3072, vocab 32000), at 1 and 2 threads, every kernel this CPU has on GGUF rows, and
// the vector kernels also on kRows16 weights ("avx2/r16", "avx512/r16": the layout models hold):
//   decode   one token; enough distinct copies of the weight (as a model's layers are) that they
//            stream from memory, not cache; float32 baseline torchpatch::nn::linear (the gemv kernels)
//   prefill  128 tokens, one weight; float32 baseline at::linear (the BLAS's sgemm)
// The machine's stream bandwidth is measured in the same run (a float32 sum over 256 MB at one
// thread), and each decode is also compared with "f32 at bandwidth": the time a float32 gemv would
// take to stream its weight at that bandwidth. Also the accuracy cost of quantizing activations:
// max |quant_linear - x @ dequantize(W)^T| over max |x @ dequantize(W)^T|. Times are medians of
// single calls (decode: every call on the next copy of the weight).
//
//   usage: bench_quant [--quick] [--threads N]   (--quick: fewer repetitions, no scalar prefill)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/quant.h"

using Clock = std::chrono::steady_clock;
using torchpatch::nn::QuantFormat;
using torchpatch::nn::QuantKernel;
using torchpatch::nn::QuantLayout;

namespace {

struct Shape {
  const char* name;
  int64_t out, in;
};

const char* kernel_name(QuantKernel k) {
  switch (k) {
    case QuantKernel::kScalar: return "scalar";
    case QuantKernel::kAvx2: return "avx2";
    case QuantKernel::kAvx512: return "avx512";
    default: return "auto";
  }
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Best of `rounds` of `body()` (which does `per_round` operations): seconds per operation.
template <typename F>
double best_of(int rounds, int per_round, F body) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    body();
    best = std::min(best, seconds_since(start) / per_round);
  }
  return best;
}

// Median over `rounds` passes of `count` calls `body(i)`, each timed alone: a call the scheduler
// interrupts (the machine is shared) moves the median little, where it would spoil a whole pass.
template <typename F>
double median_call(int rounds, int count, F body) {
  std::vector<double> times;
  times.reserve(static_cast<size_t>(rounds) * count);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < count; ++i) {
      const auto start = Clock::now();
      body(i);
      times.push_back(seconds_since(start));
    }
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// Bytes per second one thread reads: a float32 sum over 256 MB.
double stream_bandwidth() {
  const auto buffer = at::rand({64 * 1024 * 1024});
  volatile float sink = 0;
  const double s = best_of(5, 1, [&] { sink = sink + buffer.sum().item<float>(); });
  return static_cast<double>(buffer.numel() * 4) / s;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int max_threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) max_threads = std::atoi(argv[++i]);
  }
  at::manual_seed(1);
  const int rounds = quick ? 3 : 9;
  const int64_t kPrefillTokens = 128;
  const int64_t kStreamBytes = 96ll << 20;  // decode: at least this much of the smallest (Q4_0) weight per round

  at::set_num_threads(1);
  const double bandwidth = stream_bandwidth();
  std::printf("stream bandwidth (1 thread, f32 sum over 256 MB): %.1f GB/s\n", bandwidth / 1e9);
  at::set_num_threads(max_threads);
  const double bandwidth_mt = stream_bandwidth();
  std::printf("stream bandwidth (%d threads): %.1f GB/s\n\n", max_threads, bandwidth_mt / 1e9);

  // Every kernel this CPU has on GGUF rows, and the vector ones also on kRows16 (what models hold).
  std::vector<std::pair<QuantKernel, QuantLayout>> variants;
  for (const auto k : {QuantKernel::kScalar, QuantKernel::kAvx2, QuantKernel::kAvx512}) {
    if (torchpatch::nn::quant_kernel_available(k)) variants.emplace_back(k, QuantLayout::kBlocks);
  }
  for (const auto k : {QuantKernel::kAvx2, QuantKernel::kAvx512}) {
    if (torchpatch::nn::quant_kernel_available(k)) variants.emplace_back(k, QuantLayout::kRows16);
  }
  const std::vector<Shape> shapes = {
      {"q/k/v/o 768x768", 768, 768}, {"gate/up 3072x768", 3072, 768}, {"down 768x3072", 768, 3072},
      {"lm_head 32000x768", 32000, 768}};

  std::printf("decode: us per product; GB/s of weight streamed; 'vs f32' = f32 linear time / this time;\n"
              "'vs bw' = (f32 weight bytes / stream bandwidth) / this time, the bar being 2.6 (q8_0), 3.6 (q4_0)\n"
              "prefill (%lld tokens): ms per product; 'vs f32' = at::linear time / this time\n\n",
              static_cast<long long>(kPrefillTokens));
  std::printf("%-18s %-5s %-10s %3s | %9s %7s %7s %7s | %9s %7s\n", "shape", "fmt", "kernel", "thr", "decode us",
              "GB/s", "vs f32", "vs bw", "prefill ms", "vs f32");

  for (const auto& shape : shapes) {
    const auto w = at::randn({shape.out, shape.in}) * 0.02;
    const int64_t q4_bytes = shape.out * shape.in / 32 * 18;
    const int copies = static_cast<int>(std::max<int64_t>(4, (kStreamBytes + q4_bytes - 1) / q4_bytes));
    std::vector<at::Tensor> dense(copies);
    for (auto& d : dense) d = w.clone();
    const auto x1 = at::randn({1, shape.in});
    const auto xp = at::randn({kPrefillTokens, shape.in});
    const double f32_bytes = static_cast<double>(shape.out * shape.in * 4);

    for (int threads = 1; threads <= max_threads; ++threads) {
      at::set_num_threads(threads);
      const double bw = threads == 1 ? bandwidth : bandwidth_mt;
      const double f32_decode = median_call(rounds, copies, [&](int i) { torchpatch::nn::linear(x1, dense[i]); });
      const double f32_prefill = median_call(rounds, 1, [&](int) { at::linear(xp, w); });
      std::printf("%-18s %-5s %-10s %3d | %9.1f %7.1f %7.2f %7.2f | %9.3f %7.2f\n", shape.name, "f32", "linear", threads,
                  f32_decode * 1e6, f32_bytes / f32_decode / 1e9, 1.0, f32_bytes / bw / f32_decode, f32_prefill * 1e3,
                  1.0);
      for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
        const auto blocks = torchpatch::nn::quantize(format, w, "w");
        const auto packed = torchpatch::nn::pack_blocks(format, blocks, "w");
        std::vector<at::Tensor> copies_q(copies), copies_packed(copies);
        for (int i = 0; i < copies; ++i) {
          copies_q[i] = blocks.clone();
          copies_packed[i] = packed.clone();
        }
        const double q_bytes = static_cast<double>(blocks.numel());
        for (const auto& variant : variants) {
          const QuantKernel kernel = variant.first;  // (named copies: lambdas cannot capture bindings in C++17)
          const QuantLayout layout = variant.second;
          const bool rows16 = layout == QuantLayout::kRows16;
          const auto& weights = rows16 ? copies_packed : copies_q;
          const auto previous = torchpatch::nn::set_quant_kernel(kernel);
          const double decode = median_call(rounds, copies, [&](int i) {
            torchpatch::nn::quant_linear(format, x1, weights[i], shape.out, {}, layout);
          });
          double prefill = 0;
          const bool slow = kernel == QuantKernel::kScalar && (quick || shape.out * shape.in > 4 * 1024 * 1024);
          if (!slow) {
            prefill = median_call(kernel == QuantKernel::kScalar ? 1 : rounds, 1, [&](int) {
              torchpatch::nn::quant_linear(format, xp, rows16 ? packed : blocks, shape.out, {}, layout);
            });
          }
          torchpatch::nn::set_quant_kernel(previous);
          const std::string name = std::string(kernel_name(kernel)) + (rows16 ? "/r16" : "");
          std::printf("%-18s %-5s %-10s %3d | %9.1f %7.1f %7.2f %7.2f |", shape.name,
                      torchpatch::nn::format_name(format), name.c_str(), threads, decode * 1e6, q_bytes / decode / 1e9,
                      f32_decode / decode, f32_bytes / bw / decode);
          if (prefill > 0) {
            std::printf(" %9.3f %7.2f\n", prefill * 1e3, f32_prefill / prefill);
          } else {
            std::printf(" %9s %7s\n", "-", "-");
          }
        }
      }
    }
  }

  // Accuracy of quantizing the activations (the weights' own quantization error is not counted):
  // against the float64 product of the dequantized weights, relative to the output's largest value.
  std::printf("\naccuracy (activations quantized to Q8_0 per 32): max abs error / max |output|, 128 tokens\n");
  for (const auto& shape : shapes) {
    const auto w = at::randn({shape.out, shape.in}) * 0.02;
    const auto x = at::randn({kPrefillTokens, shape.in});
    for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
      const auto blocks = torchpatch::nn::quantize(format, w, "w");
      const auto dense = torchpatch::nn::dequantize(format, blocks, "w").to(at::kDouble);
      const auto expected = at::matmul(x.to(at::kDouble), dense.t());
      const auto got = torchpatch::nn::quant_linear(format, x, blocks, shape.out).to(at::kDouble);
      const double scale = expected.abs().max().item<double>();
      const double err = (got - expected).abs().max().item<double>();
      const double rms = (got - expected).pow(2).mean().sqrt().item<double>() /
                         expected.pow(2).mean().sqrt().item<double>();
      std::printf("%-18s %-5s max err / max |y| = %.2e   rms err / rms y = %.2e\n", shape.name,
                  torchpatch::nn::format_name(format), err / scale, rms);
    }
  }
  return 0;
}
