// Internal: products of float32 activations with weights held as GGUF blocks, the activations as
// they are (not quantized): the formats quant_linear reads from GGUF files only (Q4_1, Q5_0, Q5_1,
// Q2_K .. Q6_K; nn/quant.h) for prompts, the K-quants always, and Q8_0 and Q4_0 where blocks stand in
// for a float weight (Linear::decode_from_blocks). quant_linear's own kernels (quant_kernels.cpp)
// quantize the activations, as llama.cpp does: for Q8_0 and Q4_0 always, for the other 32-weight
// formats when decoding.
//
// Every one of them stores a weight as w = a * q + b, with q a small unsigned integer (2 to 8 bits;
// Q8_0's int8 read as q + 128) and a, b shared by 16 or 32 consecutive weights (Q4_1: d and m; Q6_K:
// d * scale and -32 d * scale; ...). So one kernel serves them all: each weight row is unpacked into
// bytes q and a and b per 16 weights, dequantized in cache and multiplied with the activations: the
// result is the product with the dequantized weights, within float rounding.
#pragma once

#include <cstdint>

#include "torchpatch/nn/quant.h"

namespace torchpatch::nn::ggml {

/// The kernel quant_linear runs now (set_quant_kernel's choice resolved for this CPU: kScalar, kAvx2
/// or kAvx512).
QuantKernel resolved_quant_kernel();

/// y[t * out_features + o] = x[t] . W[o] + bias[o] for `tokens` rows of x [in] and W's GGUF rows of
/// `format` blocks laid out as `layout` (kRows16: a row is copied out of its group when its turn
/// comes), with `kernel` (resolved: kScalar, kAvx2 or kAvx512). Output rows are split across the
/// threads; a result does not depend on how many there are.
void linear(QuantFormat format, QuantKernel kernel, const float* x, int64_t tokens, int64_t in, const uint8_t* w,
            int64_t out_features, const float* bias, float* y, QuantLayout layout = QuantLayout::kBlocks);

}  // namespace torchpatch::nn::ggml
