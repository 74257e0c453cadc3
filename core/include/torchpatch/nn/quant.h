// GGUF's block formats, byte for byte: a row of a weight [out, in] is cut into blocks of 32 (or, for
// the K-quants, 256) consecutive input weights, each stored as small integers and fp16 scales
// (nn/ggml_types.h has their layouts). torchpatch writes two of them itself:
//
//   Q8_0  34 bytes: d = amax / 127, then 32 int8 q = round(x / d), half away from zero (x * (1/d))
//   Q4_0  18 bytes: d = max / -8 (max: the signed value of largest magnitude, the first on ties),
//         then 16 bytes; q = min(15, trunc(x * (1/d) + 8.5)), byte j holding q[j] | q[j + 16] << 4
//
// Scales are little-endian IEEE half precision; the arithmetic is float32 without fused
// multiply-add, as llama.cpp's reference quantizer, so the blocks equal what it writes. The others
// (Q4_1, Q5_0, Q5_1 and the K-quants Q2_K..Q6_K) come from GGUF files and are multiplied as they are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "torchpatch/export.h"
#include "torchpatch/nn/ggml_types.h"

namespace torchpatch::nn {

/// The block formats quant_linear multiplies.
enum class QuantFormat { kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K };

/// Weights per block of Q8_0 and Q4_0, the formats torchpatch quantizes to.
constexpr int64_t kQuantBlockSize = 32;

/// Weights per block: 32, or 256 for the K-quants.
TORCHPATCH_API int64_t block_weights(QuantFormat format);

/// Bytes per block: 34 (Q8_0), 18 (Q4_0), ... (GGML's type sizes).
TORCHPATCH_API int64_t block_bytes(QuantFormat format);

/// "q8_0", "q4_0", "q4_k", ...
TORCHPATCH_API const char* format_name(QuantFormat format);

/// The format named "q8_0", "q4_k", ... (either case), or nullopt.
TORCHPATCH_API std::optional<QuantFormat> parse_quant_format(const std::string& name);

/// Whether quantize() writes `format` (Q8_0 and Q4_0); the others are only read from GGUF files.
TORCHPATCH_API bool quantizes_to(QuantFormat format);

/// GGML's number for `format`, and the format of a GGML type (nullopt for one quant_linear does not multiply).
TORCHPATCH_API GgmlType ggml_type(QuantFormat format);
TORCHPATCH_API std::optional<QuantFormat> quant_format_of(GgmlType type);

/// Quantizes `weight` [..., in] (any floating dtype, read as float32) along its last dimension into
/// uint8 [..., in / 32 * block_bytes]. Refuses, naming `name`, a format quantizes_to() does not
/// write, an `in` that is not a multiple of 32 and values that are not finite.
TORCHPATCH_API at::Tensor quantize(QuantFormat format, const at::Tensor& weight, const std::string& name);

/// The float32 weights [..., in] that `blocks` [..., in / block_weights * block_bytes] stand for: d * q
/// (Q8_0), d * (q - 8) (Q4_0), the others as dequantize_ggml, on the blocks' device (Q8_0 and Q4_0 only
/// on a GPU). Refuses, naming `name`, anything but uint8 rows of whole blocks.
TORCHPATCH_API at::Tensor dequantize(QuantFormat format, const at::Tensor& blocks, const std::string& name);

/// How a weight's blocks lie in memory. Both take the same tensor shape [..., rows, in / 32 *
/// block_bytes] and size; each matrix (the last two dimensions) is laid out by itself.
enum class QuantLayout {
  kBlocks,  ///< GGUF's: row after row, each row's blocks in order (what checkpoints hold)
  kRows16,  ///< rows in groups of 16, each group's blocks interleaved so that one 64-byte load feeds all
            ///< 16 rows (below); rows past the last whole group stay as kBlocks rows at the end
};

// kRows16 (the 32-weight formats), per group of 16 rows and per pair of blocks (2p, 2p + 1) of them:
//   [block 2p's header: the 16 rows' fp16 d (32 bytes), then their m (Q4_1, Q5_1; 32 bytes), then
//    their 32-bit words of fifth bits (Q5_0, Q5_1; 64 bytes)][block 2p + 1's header]
//   [block 2p's quants: register k (64 bytes), lane i = row i's quant bytes 4k..4k+3]   Q8_0 512, others 256
//   [block 2p + 1's quants, the same way]
// An odd last block is [its header][its quants]. Every byte is GGUF's (Q8_0's signed: AVX2's
// sign trick takes them as they are, AVX-512 flips them to VNNI's unsigned w + 128 as they load; stored
// flipped, AVX2's decoding ran 5-10 % slower for the extra XOR). A group is as long as its 16
// rows were, so the tail rows sit where they were. A 256-bit half of each 64 bytes is 8 rows (AVX2).

/// The layout quant_linear reads the 32-weight formats fastest with the kernel it runs now
/// (active_quant_kernel): kRows16 with kAvx512 and kAvx2, kBlocks with kScalar; kBlocks while a
/// GgufBlocksOnly is alive on this thread.
TORCHPATCH_API QuantLayout preferred_quant_layout();
/// The layout for `format`: preferred_quant_layout() for the 32-weight formats (Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1), kBlocks for the K-quants.
TORCHPATCH_API QuantLayout preferred_quant_layout(QuantFormat format);

/// While alive on a thread, preferred_quant_layout() answers kBlocks there: a model built and loaded
/// for a GPU, whose kernels read GGUF's blocks as they are. (Blocks on a GPU are always kBlocks.)
class TORCHPATCH_API GgufBlocksOnly {
 public:
  GgufBlocksOnly();
  ~GgufBlocksOnly();
  GgufBlocksOnly(const GgufBlocksOnly&) = delete;
  GgufBlocksOnly& operator=(const GgufBlocksOnly&) = delete;
};

/// `blocks` (kBlocks) [..., rows, whole blocks] rearranged into kRows16; refuses, naming `name`, a tensor
/// that is not uint8 rows of whole blocks, and a K-quant.
TORCHPATCH_API at::Tensor pack_blocks(QuantFormat format, const at::Tensor& blocks, const std::string& name);

/// The inverse of pack_blocks: kRows16 back to GGUF's kBlocks, byte for byte.
TORCHPATCH_API at::Tensor unpack_blocks(QuantFormat format, const at::Tensor& packed, const std::string& name);

/// How products with quantized weights are computed. Activations are quantized to Q8_0 per row first
/// (llama.cpp's scheme), so every kernel sums the same int8 products exactly; they differ only in
/// float rounding (the order the per-block scaled sums are added in).
enum class QuantKernel {
  kAuto,    ///< the best this CPU has: AVX-512 VNNI, else AVX2 (with FMA and F16C), else scalar (the default)
  kScalar,  ///< plain C++
  kAvx2,    ///< AVX2 with FMA and F16C (maddubs / madd): kRows16 weights 8 rows a register, 1-4 tokens
            ///< a pass; GGUF rows in tiles of 4 rows x 2 tokens (scalar without AVX2)
  kAvx512,  ///< AVX-512 VNNI (dpbusd): decoding streams kRows16 weights 16 rows at a time (GGUF rows one
            ///< at a time), prefill works in tiles of 4 rows x 4 tokens (kAvx2, else scalar, without
            ///< AVX-512 F/BW/VL/VNNI)
};

/// Chooses the kernel for the whole process (tests and benchmarks compare them); returns the previous one.
TORCHPATCH_API QuantKernel set_quant_kernel(QuantKernel kernel);

/// Whether this CPU runs `kernel` itself (kAuto and kScalar always).
TORCHPATCH_API bool quant_kernel_available(QuantKernel kernel);

/// The kernel quant_linear runs now: set_quant_kernel's choice resolved for this CPU (kScalar, kAvx2
/// or kAvx512).
TORCHPATCH_API QuantKernel active_quant_kernel();

/// "auto", "scalar", "avx2" or "avx512".
TORCHPATCH_API const char* quant_kernel_name(QuantKernel kernel);

/// The kernel named as quant_kernel_name names it (either case), or nullopt.
TORCHPATCH_API std::optional<QuantKernel> parse_quant_kernel(const std::string& name);

/// y = x W^T + bias for x float32 [..., in] and W's blocks uint8 [out_features, in / 32 * block_bytes]
/// laid out as `layout` says: float32 [..., out_features]. Output rows are split across the intra-op
/// threads. The AVX-512 and AVX2 kernels read kRows16's groups themselves, in another order than GGUF
/// rows (float rounding apart, the same result); the scalar kernel reads an unpacked copy. A token's
/// outputs do not depend on how many tokens share the product, except with AVX-512 on GGUF rows
/// (decoding's pair kernel and prefill's tiles add in different orders).
/// The formats read from GGUF files (Q4_1 ... Q6_K, CPU only; kBlocks, the 32-weight ones kRows16 too): decoding's
/// 1-3 tokens of the 32-weight ones (Q4_1, Q5_0, Q5_1) quantize the activations as Q8_0 and Q4_0 do,
/// with the same kernels; 4 tokens and more, and the K-quants, multiply each weight row dequantized
/// once in cache with the float32 activations: the dequantized product within float rounding
/// (nn/quant_ggml.h).
/// On a CUDA device (torchpatch built with CUDA): x float32, bfloat16 or float16, blocks kBlocks on the
/// same device, the result in x's dtype; activations are not quantized there (nn/quant_device.h).
TORCHPATCH_API at::Tensor quant_linear(QuantFormat format, const at::Tensor& x, const at::Tensor& blocks,
                                       int64_t out_features, const at::Tensor& bias = {},
                                       QuantLayout layout = QuantLayout::kBlocks);

}  // namespace torchpatch::nn
