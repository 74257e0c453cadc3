// Linear and Embedding layers whose parameters can be allocated without being initialised, so a
// model built to receive a checkpoint spends no time (and touches no memory) on values the
// checkpoint replaces. State-dict names are LibTorch's and Hugging Face's: weight, bias.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "torchpatch/export.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch::nn {

/// While one is alive on this thread, layers allocate parameters without initialising them
/// (from_pretrained builds under it; whatever the checkpoint does not provide is then initialised).
class TORCHPATCH_API SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  static bool active();
};

/// Hugging Face's `_init_weights` for a parameter: normal(0, std) for matrices, zeros for biases,
/// ones for norm weights (`is_norm`).
TORCHPATCH_API void init_parameter(at::Tensor& param, bool is_bias, bool is_norm, double std = 0.02);

/// A new float32 parameter tensor: initialised as init_parameter does, or left uninitialised under SkipInit.
TORCHPATCH_API at::Tensor new_parameter(at::IntArrayRef sizes, bool is_bias = false, double std = 0.02);

/// y = x W^T + b. weight [out, in], bias [out] when `bias`.
/// The type reductions run in: float32 as Hugging Face upcasts (softmax, norms, losses), float64
/// when the model runs in float64 (casting that down would lose what it is for).
inline c10::ScalarType reduction_type(c10::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

/// How a single-row float32 product (decoding one token) is computed.
enum class DecodeKernel {
  kAuto,    ///< the widest vector kernel this CPU has (the default)
  kAvx512,  ///< one row at a time with AVX-512, four sums in flight (kBlas without AVX-512)
  kAvx2,    ///< the same with AVX2 + FMA (kBlas without them)
  kBlas     ///< LibTorch's matrix-vector product (the system BLAS's sgemv)
};

/// Chooses the kernel for the whole process (benchmarks compare them); returns the previous choice.
TORCHPATCH_API DecodeKernel set_decode_kernel(DecodeKernel kernel);
/// The kernel single-row float32 products run on now, as resolved for this CPU (never kAuto).
TORCHPATCH_API DecodeKernel decode_kernel();

/// How a float32 product of several rows (prefill, batches) is computed.
enum class MatmulKernel {
  kOneDnn,  ///< oneDNN's sgemm, its columns split over the intra-op threads (the default on LibTorch 1.13)
  kBlas     ///< LibTorch's matrix product: its BLAS's sgemm (MKL in LibTorch 2.x, the default there)
};

/// Chooses the several-row kernel for the whole process; returns the previous choice. Built against
/// LibTorch 2.x the choice is always kBlas (core/CMakeLists.txt says why).
TORCHPATCH_API MatmulKernel set_matmul_kernel(MatmulKernel kernel);

/// y = x @ weight^T + bias, like at::linear. A single row (decoding) streams the weight once through
/// a matrix-vector kernel, where BLAS's matrix-matrix path would pack the whole weight first; several
/// rows of float32 go to the MatmulKernel chosen. Anything that needs gradients goes to at::linear.
TORCHPATCH_API at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

/// The built-in class of the "Linear" patch point (roles::Linear).
class TORCHPATCH_API Linear : public roles::Linear {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias);
  /// Without bias, over a weight it shares (a tied output layer's: the embeddings').
  explicit Linear(const at::Tensor& shared_weight);
  at::Tensor forward(const at::Tensor& x) override;
  int64_t in_features() const override { return weight.size(1); }
  int64_t out_features() const override { return weight.size(0); }

  /// Lets products of 1 to 15 rows (decoding) read `blocks`, GGUF's blocks of `format` [out, in / 32 *
  /// block bytes] holding exactly `weight`'s values (weight was dequantized from them, as a GGUF
  /// model's embeddings are, which a tied output layer shares), instead of weight: a quarter of the
  /// bytes or fewer, multiplied with the float32 activations as they are, so a result differs from
  /// weight's only in float rounding. Declined (false) unless blocks dequantize to weight bit for bit
  /// and weight is a float32 CPU tensor; forgotten as soon as weight is replaced or changed in place.
  bool decode_from_blocks(QuantFormat format, const at::Tensor& blocks);
  /// The blocks products of a few rows read now; undefined when they read weight.
  at::Tensor decode_blocks() const;

  at::Tensor weight;  ///< [out_features, in_features]
  at::Tensor bias;    ///< [out_features], undefined without bias

 private:
  struct DecodeBlocks {
    QuantFormat format;
    at::Tensor blocks;
    const void* weight_data;  // weight's storage and version when they were attached
    int64_t weight_version;
  };
  std::optional<DecodeBlocks> decode_blocks_;
};

/// Projection `name` of the block being built [in -> out], through the "Linear" patch point (the
/// block's path and config are the build's; see build_child): nn::Linear unless a patch maps it.
TORCHPATCH_API std::shared_ptr<roles::Linear> make_linear(const std::string& name, int64_t in_features,
                                                          int64_t out_features, bool bias);

/// Token embeddings: weight [num_embeddings, embedding_dim].
class TORCHPATCH_API Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  at::Tensor forward(const at::Tensor& ids) const;

  at::Tensor weight;
};

}  // namespace torchpatch::nn
