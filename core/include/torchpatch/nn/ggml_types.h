// GGML's element and block types, as numbered in GGUF files, and their dequantization: the formats
// llama.cpp stores weights in. nn/quant.h multiplies some of them directly; checkpoint/gguf.h reads them.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <string>

namespace torchpatch::nn {

/// The GGML element and block types torchpatch reads (numbered as in GGUF files).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

/// What a GGML type is: its name ("Q4_K"), weights per block and bytes per block (1 and the element
/// size for the plain types).
struct TORCHPATCH_API GgmlTypeInfo {
  GgmlType type;
  const char* name;
  int64_t block_size;
  int64_t type_size;
  /// Whether dequantize_ggml reads it (every float and block type; not the integer types).
  bool floating;
};

/// The type numbered `id`, or nullptr for one torchpatch does not know (IQ formats, removed ids).
TORCHPATCH_API const GgmlTypeInfo* ggml_type_info(uint32_t id);
TORCHPATCH_API const GgmlTypeInfo& ggml_type_info(GgmlType type);
/// The type named `name` (either case: "q4_k", "F16"), or nullptr.
TORCHPATCH_API const GgmlTypeInfo* ggml_type_named(const std::string& name);

/// `count` values (a multiple of the block size) from `blocks` of `type` as float32 into `out`, with
/// the arithmetic of the `gguf` package's dequantize (llama.cpp's reference), so the values are the
/// same bit for bit. Throws InputError for an integer type.
TORCHPATCH_API void dequantize_ggml(GgmlType type, const uint8_t* blocks, int64_t count, float* out);

}  // namespace torchpatch::nn
