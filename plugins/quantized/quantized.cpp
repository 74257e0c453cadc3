// quantized: projections and MoE experts with GGUF's Q8_0 / Q4_0 weights (nn/quant.h), projections in
// the formats GGUF files bring (Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K: Q4_1Linear ... Q6_KLinear), and the
// quantization method "ggml" that builds them for any config whose `quantization_config` names it:
//
//   "quantization_config": {"quant_method": "ggml", "format": "q4_0",
//                            "modules_to_not_convert": ["shared_expert_gate"],
//                            "module_formats": {"lm_head": "q8_0"}}
//
// Every Linear patch point becomes Q8_0Linear / Q4_0Linear (module_formats picks another format by
// module path, modules_to_not_convert keeps a projection in float), the fused experts (the `experts`
// kind) become Q8_0Experts / Q4_0Experts and GPT-OSS's (`clamped_swiglu_experts`)
// Q8_0ClampedSwigluExperts / Q4_0ClampedSwigluExperts, each expert quantized along its input dimension.
// Routers, norms and embeddings are not Linear patch points and stay in float. Float weights are
// quantized one tensor at a time as they load (the classes' conversion rules); a quantized
// checkpoint's blocks load as they are. Either way the blocks are then laid out for this CPU's kernels
// (Repack: nn::QuantLayout). Saving reverses the rules and writes the hub layout in float unless asked
// to keep the blocks, which are then GGUF's again.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "torchpatch/error.h"
#include "torchpatch/models/blocks.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/plugin_api.h"

namespace {

using torchpatch::BuildContext;
using torchpatch::ConfigError;
using torchpatch::nn::QuantFormat;
namespace checkpoint = torchpatch::checkpoint;

constexpr const char* kMethod = "ggml";

// -- conversion ops -------------------------------------------------------------------------------------

// Float weights [..., in] -> blocks [..., in / 32 * bytes]; blocks (uint8) pass as they are, so a
// quantized checkpoint loads through the same rule (the loader checks their shape). `transposed`:
// the float weights are [..., in, out] (GPT-OSS's experts), quantized as [..., out, in].
class QuantizeOp : public checkpoint::ConversionOp {
 public:
  explicit QuantizeOp(QuantFormat format, bool transposed = false) : format_(format), transposed_(transposed) {}
  std::string name() const override { return fmt::format("Quantize({})", torchpatch::nn::format_name(format_)); }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override;
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override;
  bool encodes() const override { return true; }

 private:
  QuantFormat format_;
  bool transposed_;
};

// Blocks -> float32 weights (saving the hub layout).
class DequantizeOp : public checkpoint::ConversionOp {
 public:
  explicit DequantizeOp(QuantFormat format, bool transposed) : format_(format), transposed_(transposed) {}
  std::string name() const override { return fmt::format("Dequantize({})", torchpatch::nn::format_name(format_)); }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    for (auto& t : tensors) {
      t = torchpatch::nn::dequantize(format_, t, targets.at(0));
      if (transposed_) t = t.transpose(-1, -2).contiguous();
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<QuantizeOp>(format_, transposed_);
  }

 private:
  QuantFormat format_;
  bool transposed_;
};

checkpoint::PatternTensors QuantizeOp::convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                               const std::vector<std::string>& targets) const {
  auto& tensors = inputs.at(0).second;
  for (auto& t : tensors) {
    if (t.scalar_type() == at::kByte) continue;
    t = torchpatch::nn::quantize(format_, transposed_ ? t.transpose(-1, -2).contiguous() : t, targets.at(0));
  }
  return {{targets.at(0), std::move(tensors)}};
}

std::shared_ptr<checkpoint::ConversionOp> QuantizeOp::reverse() const {
  return std::make_shared<DequantizeOp>(format_, transposed_);
}

checkpoint::OpPtr quantize_op(QuantFormat format, bool transposed = false) {
  return std::make_shared<QuantizeOp>(format, transposed);
}

// GGUF blocks -> the layout this CPU's kernels read fastest (nn::preferred_quant_layout: kRows16 with
// AVX-512 VNNI), and back. Not an encoding: saving always unpacks, so files hold GGUF's blocks. A
// tensor that is not rows of whole blocks passes as it is, for the loader to name.
class LayoutOp : public checkpoint::ConversionOp {
 public:
  LayoutOp(QuantFormat format, bool pack) : format_(format), pack_(pack) {}
  std::string name() const override {
    return fmt::format("{}({})", pack_ ? "Repack" : "Unpack", torchpatch::nn::format_name(format_));
  }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    if (torchpatch::nn::preferred_quant_layout(format_) == torchpatch::nn::QuantLayout::kRows16) {
      for (auto& t : tensors) {
        if (!t.is_cpu()) continue;  // blocks on a GPU are GGUF's as they are
        if (t.scalar_type() != at::kByte || t.dim() < 2 || t.size(-1) % torchpatch::nn::block_bytes(format_) != 0) continue;
        t = pack_ ? torchpatch::nn::pack_blocks(format_, t, targets.at(0))
                  : torchpatch::nn::unpack_blocks(format_, t, targets.at(0));
      }
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<LayoutOp>(format_, !pack_);
  }

 private:
  QuantFormat format_;
  bool pack_;
};

checkpoint::OpPtr repack_op(QuantFormat format) { return std::make_shared<LayoutOp>(format, /*pack=*/true); }

// -- shared ---------------------------------------------------------------------------------------------

// A weight's blocks: uninitialised under SkipInit (a checkpoint fills them), else `init`'s float
// values quantized, in the preferred layout (zeros for a format only read from GGUF files).
at::Tensor new_blocks(QuantFormat format, std::vector<int64_t> float_shape, const std::string& name) {
  if (torchpatch::nn::SkipInit::active() || !torchpatch::nn::quantizes_to(format)) {
    auto shape = float_shape;
    shape.back() = shape.back() / torchpatch::nn::block_weights(format) * torchpatch::nn::block_bytes(format);
    return torchpatch::nn::SkipInit::active() ? at::empty(shape, at::kByte) : at::zeros(shape, at::kByte);
  }
  const auto blocks = torchpatch::nn::quantize(format, torchpatch::nn::new_parameter(float_shape), name);
  if (torchpatch::nn::preferred_quant_layout(format) == torchpatch::nn::QuantLayout::kBlocks) return blocks;
  return torchpatch::nn::pack_blocks(format, blocks, name);
}

void check_quantizable(QuantFormat format, int64_t in_features, const std::string& tensor) {
  const int64_t weights = torchpatch::nn::block_weights(format);
  if (in_features % weights != 0 || in_features <= 0) {
    throw ConfigError(fmt::format("{} has {} input features, not a multiple of {}, so {} cannot hold it; keep its "
                                  "module in float (quantization_config.modules_to_not_convert)",
                                  tensor, in_features, weights, torchpatch::nn::format_name(format)));
  }
}

// "Q8_0Linear", "Q4_KExperts": GGML's name of the format, then what it replaces.
std::string class_name(QuantFormat format, const char* what) {
  return std::string(torchpatch::nn::ggml_type_info(torchpatch::nn::ggml_type(format)).name) + what;
}

// x in any float dtype -> float32 for the kernels, and the result back to x's dtype.
template <typename Fn>
at::Tensor in_float(const at::Tensor& x, Fn&& fn) {
  if (x.scalar_type() == at::kFloat) return fn(x.contiguous());
  return fn(x.to(at::kFloat).contiguous()).to(x.scalar_type());
}

// Blocks moved to a GPU in the layout its kernels read (GGUF's, kBlocks), and back in the CPU's.
void move_blocks(QuantFormat format, torch::nn::Module& module, torchpatch::nn::QuantLayout& layout,
                 torch::Device device) {
  using torchpatch::nn::QuantLayout;
  const auto wanted = device.is_cpu() ? torchpatch::nn::preferred_quant_layout(format) : QuantLayout::kBlocks;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    auto& blocks = item.value();
    if (blocks.scalar_type() != at::kByte) {
      blocks.set_data(blocks.to(device));
      continue;
    }
    auto host = blocks.cpu();
    if (layout != wanted) {
      host = wanted == QuantLayout::kRows16 ? torchpatch::nn::pack_blocks(format, host, item.key())
                                            : torchpatch::nn::unpack_blocks(format, host, item.key());
    }
    blocks.set_data(host.to(device));
  }
  layout = wanted;
}

// Quantized modules keep their blocks as they are when a model changes dtype; only float parts follow.
#define TORCHPATCH_KEEP_BLOCKS_ON_DTYPE_CHANGE                                                          \
  using torch::nn::Module::to;                                                                          \
  void to(torch::Dtype dtype, bool non_blocking = false) override { convert_float_parts(dtype, non_blocking); } \
  void to(torch::Device device, bool non_blocking = false) override {                                  \
    const auto here = weight_device();                                                                 \
    if (device.type() != here.type() || (device.has_index() && device.index() != here.index())) {      \
      move_blocks(kFormat, *this, layout_, device);                                                     \
    }                                                                                                   \
  }                                                                                                     \
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override {              \
    to(device, non_blocking);                                                                           \
    convert_float_parts(dtype, non_blocking);                                                           \
  }                                                                                                     \
  torch::Device weight_device() const { return parameters(false).front().device(); }

// -- Linear -----------------------------------------------------------------------------------------------

template <QuantFormat F>
class QuantizedLinear : public torchpatch::roles::Linear {
 public:
  explicit QuantizedLinear(const BuildContext& ctx)
      : in_(ctx.arg("in_features", -1)), out_(ctx.arg("out_features", -1)) {
    check_quantizable(F, in_, ctx.path + ".weight");
    weight = register_parameter("weight", new_blocks(F, {out_, in_}, ctx.path + ".weight"), /*requires_grad=*/false);
    if (ctx.flag("bias", false)) bias = register_parameter("bias", torchpatch::nn::new_parameter({out_}, true));
  }

  at::Tensor forward(const at::Tensor& x) override {
    if (x.is_cuda()) return torchpatch::nn::quant_linear(F, x, weight, out_, bias, layout_);  // any float dtype there
    return in_float(x, [&](const at::Tensor& x32) {
      return torchpatch::nn::quant_linear(F, x32, weight, out_, bias.defined() ? bias.to(at::kFloat) : bias, layout_);
    });
  }
  int64_t in_features() const override { return in_; }
  int64_t out_features() const override { return out_; }
  TORCHPATCH_KEEP_BLOCKS_ON_DTYPE_CHANGE

  at::Tensor weight;  ///< uint8 [out, in / 32 * block bytes], in nn::preferred_quant_layout()
  at::Tensor bias;    ///< float [out] or undefined

 private:
  static constexpr QuantFormat kFormat = F;
  torchpatch::nn::QuantLayout layout_ = torchpatch::nn::preferred_quant_layout(F);
  void convert_float_parts(torch::Dtype dtype, bool non_blocking) {
    if (bias.defined()) bias.set_data(bias.to(dtype, non_blocking));
  }
  int64_t in_, out_;
};

checkpoint::ConversionRules linear_rules(QuantFormat format) {
  return {checkpoint::WeightConverter{{"weight"}, {"weight"}, {quantize_op(format), repack_op(format)}}};
}

// -- Experts ----------------------------------------------------------------------------------------------

// Qwen2-MoE / Qwen3-MoE experts with every expert's gate_up_proj [E, 2*Im, H] and down_proj [E, H, Im]
// quantized along its input dimension, run by the shared grouped loop.
template <QuantFormat F>
class QuantizedExperts : public torchpatch::roles::Experts {
 public:
  explicit QuantizedExperts(const BuildContext& ctx) {
    const auto options = torchpatch::experts_options(torchpatch::model_config(ctx).decoder);
    num_experts_ = options.num_experts;
    intermediate_ = options.intermediate_size;
    hidden_ = options.hidden_size;
    act_ = options.act;
    check_quantizable(F, hidden_, ctx.path + ".gate_up_proj");
    check_quantizable(F, intermediate_, ctx.path + ".down_proj");
    gate_up_proj = register_parameter(
        "gate_up_proj", new_blocks(F, {num_experts_, 2 * intermediate_, hidden_}, ctx.path + ".gate_up_proj"), false);
    down_proj = register_parameter(
        "down_proj", new_blocks(F, {num_experts_, hidden_, intermediate_}, ctx.path + ".down_proj"), false);
  }
  TORCHPATCH_KEEP_BLOCKS_ON_DTYPE_CHANGE

  at::Tensor gate_up_proj;  ///< uint8 [E, 2*Im, H / 32 * block bytes], each expert in nn::preferred_quant_layout()
  at::Tensor down_proj;     ///< uint8 [E, H, Im / 32 * block bytes], likewise

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override {
    const torchpatch::nn::ExpertProjections projections{
        [&](int64_t e, const at::Tensor& x) {
          return torchpatch::nn::quant_linear(F, x, gate_up_proj[e], 2 * intermediate_, {}, layout_);
        },
        [&](int64_t e, const at::Tensor& x) { return torchpatch::nn::quant_linear(F, x, down_proj[e], hidden_, {}, layout_); }};
    return in_float(hidden, [&](const at::Tensor& h32) {
      return torchpatch::nn::grouped_experts(h32, indices, weights.to(at::kFloat), num_experts_, act_, projections);
    });
  }
  int64_t expert_count() const override { return num_experts_; }

 private:
  void convert_float_parts(torch::Dtype, bool) {}
  static constexpr QuantFormat kFormat = F;
  torchpatch::nn::QuantLayout layout_ = torchpatch::nn::preferred_quant_layout(F);
  int64_t num_experts_ = 0, intermediate_ = 0, hidden_ = 0;
  torchpatch::nn::Activation act_ = torchpatch::nn::Activation::kSilu;
};

// The hub's per-expert weights, stacked and quantized (the family's fusing rules, then Quantize);
// tensors already fused under the module's own names ([E, ...], float or blocks) are quantized and
// laid out too. Saving takes the first rule that matches a parameter: per expert.
// The family's per-expert hub weights (its experts layout: gate_proj/up_proj/down_proj, Mixtral's
// w1/w3/w2) or the fused ones, quantized as they load.
checkpoint::ConversionRules experts_rules(QuantFormat format, const torchpatch::ExpertsLayout& layout) {
  using namespace checkpoint;
  const auto expert = [](const std::string& proj) { return "*." + proj + ".weight"; };
  return {WeightConverter{{expert(layout.gate), expert(layout.up)},
                          {"gate_up_proj"},
                          {MergeModulelist(0), Concatenate(1), quantize_op(format), repack_op(format)}},
          WeightConverter{{expert(layout.down)}, {"down_proj"}, {MergeModulelist(0), quantize_op(format), repack_op(format)}},
          WeightConverter{{"gate_up_proj"}, {"gate_up_proj"}, {quantize_op(format), repack_op(format)}},
          WeightConverter{{"down_proj"}, {"down_proj"}, {quantize_op(format), repack_op(format)}}};
}

// GPT-OSS's experts (nn::ClampedSwigluExperts): the hub's gate_up_proj [E, H, 2*Im] and down_proj
// [E, Im, H] quantized along their input dimension (held [E, 2*Im, H] and [E, H, Im] in blocks, gate
// and up still interleaved by row), their biases and the clamped SwiGLU as they are.
template <QuantFormat F>
class QuantizedClampedSwigluExperts : public torchpatch::roles::Experts {
 public:
  explicit QuantizedClampedSwigluExperts(const BuildContext& ctx)
      : options_(torchpatch::clamped_swiglu_experts_options(torchpatch::model_config(ctx).decoder)) {
    const auto e = options_.num_experts, h = options_.hidden_size, i = options_.intermediate_size;
    check_quantizable(F, h, ctx.path + ".gate_up_proj");
    check_quantizable(F, i, ctx.path + ".down_proj");
    gate_up_proj = register_parameter("gate_up_proj", new_blocks(F, {e, 2 * i, h}, ctx.path + ".gate_up_proj"), false);
    gate_up_proj_bias = register_parameter("gate_up_proj_bias", torchpatch::nn::new_parameter({e, 2 * i}, true));
    down_proj = register_parameter("down_proj", new_blocks(F, {e, h, i}, ctx.path + ".down_proj"), false);
    down_proj_bias = register_parameter("down_proj_bias", torchpatch::nn::new_parameter({e, h}, true));
  }
  TORCHPATCH_KEEP_BLOCKS_ON_DTYPE_CHANGE

  at::Tensor gate_up_proj;       ///< uint8 [E, 2*Im, H / 32 * block bytes], in nn::preferred_quant_layout()
  at::Tensor gate_up_proj_bias;  ///< float [E, 2*Im]
  at::Tensor down_proj;          ///< uint8 [E, H, Im / 32 * block bytes]
  at::Tensor down_proj_bias;     ///< float [E, H]

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override {
    const auto i = options_.intermediate_size;
    const torchpatch::nn::ExpertProjections projections{
        [&](int64_t e, const at::Tensor& x) {
          return torchpatch::nn::quant_linear(F, x, gate_up_proj[e], 2 * i, gate_up_proj_bias[e].to(at::kFloat), layout_);
        },
        [&](int64_t e, const at::Tensor& x) {
          return torchpatch::nn::quant_linear(F, x, down_proj[e], options_.hidden_size, down_proj_bias[e].to(at::kFloat),
                                              layout_);
        },
        [&](const at::Tensor& gate_up) { return torchpatch::nn::clamped_swiglu(gate_up, options_.limit, options_.alpha); }};
    return in_float(hidden, [&](const at::Tensor& h32) {
      return torchpatch::nn::grouped_experts(h32, indices, weights.to(at::kFloat), options_.num_experts,
                                             torchpatch::nn::Activation::kSilu, projections);
    });
  }
  int64_t expert_count() const override { return options_.num_experts; }

 private:
  void convert_float_parts(torch::Dtype dtype, bool non_blocking) {
    gate_up_proj_bias.set_data(gate_up_proj_bias.to(dtype, non_blocking));
    down_proj_bias.set_data(down_proj_bias.to(dtype, non_blocking));
  }
  static constexpr QuantFormat kFormat = F;
  torchpatch::nn::QuantLayout layout_ = torchpatch::nn::preferred_quant_layout(F);
  torchpatch::nn::ClampedSwigluExpertsOptions options_;
};

// The hub's fused [.., in, out] weights, quantized as [.., out, in] as they load.
checkpoint::ConversionRules clamped_swiglu_experts_rules(QuantFormat format) {
  using namespace checkpoint;
  // Anchored both ways: the biases beside them (gate_up_proj_bias) stay as they are.
  return {WeightConverter{{"gate_up_proj$"}, {"gate_up_proj$"}, {quantize_op(format, true), repack_op(format)}},
          WeightConverter{{"down_proj$"}, {"down_proj$"}, {quantize_op(format, true), repack_op(format)}}};
}

// -- the "ggml" quantization method --------------------------------------------------------------------

// Q8_0 and Q4_0 run on the CPU's kernels and on CUDA's, the formats read from GGUF files on the CPU's (nn/quant.h).
torchpatch::ModuleClass on_devices(QuantFormat format, torchpatch::ModuleClass cls) {
  if (!torchpatch::nn::quantizes_to(format)) return torchpatch::with_devices(std::move(cls), {c10::kCPU});
  return torchpatch::with_devices(std::move(cls), {c10::kCPU, c10::kCUDA});
}

template <QuantFormat F>
torchpatch::ModuleClass linear_class() {
  return on_devices(F, torchpatch::module_class<QuantizedLinear<F>>(class_name(F, "Linear")));
}

template <QuantFormat F>
torchpatch::ModuleClass experts_class() {
  return on_devices(F, torchpatch::module_class<QuantizedExperts<F>>(class_name(F, "Experts")));
}

QuantFormat format_field(const nlohmann::json& value, const std::string& field) {
  const auto format = value.is_string() ? torchpatch::nn::parse_quant_format(value.get<std::string>()) : std::nullopt;
  if (!format) {
    throw ConfigError(fmt::format("quantization_config.{}: {} is not a format of quant_method '{}' (q8_0, q4_0, and "
                                  "from GGUF files q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k)",
                                  field, value.dump(), kMethod));
  }
  return *format;
}

std::vector<std::string> string_list(const nlohmann::json& config, const char* field) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return {};
  std::vector<std::string> out;
  if (it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_string()) break;
      out.push_back(v.get<std::string>());
    }
    if (out.size() == it->size()) return out;
  }
  throw ConfigError(fmt::format("quantization_config.{}: expected a list of module path patterns, got {}", field,
                                it->dump()));
}

template <QuantFormat F>
torchpatch::ModuleClass clamped_swiglu_experts_class() {
  return on_devices(F, torchpatch::module_class<QuantizedClampedSwigluExperts<F>>(class_name(F, "ClampedSwigluExperts")));
}

/// What each format replaces: a Linear, nn::FusedExperts, nn::ClampedSwigluExperts.
enum class Replaced { kLinear, kExperts, kClampedSwigluExperts };

torchpatch::ModuleClass linear_of(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0: return linear_class<QuantFormat::kQ8_0>();
    case QuantFormat::kQ4_0: return linear_class<QuantFormat::kQ4_0>();
    case QuantFormat::kQ4_1: return linear_class<QuantFormat::kQ4_1>();
    case QuantFormat::kQ5_0: return linear_class<QuantFormat::kQ5_0>();
    case QuantFormat::kQ5_1: return linear_class<QuantFormat::kQ5_1>();
    case QuantFormat::kQ2_K: return linear_class<QuantFormat::kQ2_K>();
    case QuantFormat::kQ3_K: return linear_class<QuantFormat::kQ3_K>();
    case QuantFormat::kQ4_K: return linear_class<QuantFormat::kQ4_K>();
    case QuantFormat::kQ5_K: return linear_class<QuantFormat::kQ5_K>();
    case QuantFormat::kQ6_K: return linear_class<QuantFormat::kQ6_K>();
  }
  throw ConfigError("unknown quantization format");
}

// Experts in Q8_0 or Q4_0 (the formats torchpatch quantizes to).
torchpatch::ModuleClass of_format(QuantFormat format, Replaced what) {
  const bool q8 = format == QuantFormat::kQ8_0;
  switch (what) {
    case Replaced::kExperts: return q8 ? experts_class<QuantFormat::kQ8_0>() : experts_class<QuantFormat::kQ4_0>();
    case Replaced::kClampedSwigluExperts:
      return q8 ? clamped_swiglu_experts_class<QuantFormat::kQ8_0>() : clamped_swiglu_experts_class<QuantFormat::kQ4_0>();
    case Replaced::kLinear: break;
  }
  return linear_of(format);
}

// {"Linear": the format's class (minus what is kept in float or given another format), then per
// other format that module_formats names a pattern matching Linear for its modules (`^Linear$`, then
// `^Linear$(?!q6_k)` naming the format, as keys are unique), then the experts of the MoE families}.
torchpatch::PatchMapping::Items ggml_patches(const nlohmann::json& config) {
  const auto format = format_field(config.contains("format") ? config["format"] : nlohmann::json(), "format");
  auto keep = string_list(config, "modules_to_not_convert");
  std::map<QuantFormat, std::vector<std::string>> others;  // format -> its module paths
  if (auto it = config.find("module_formats"); it != config.end() && !it->is_null()) {
    if (!it->is_object()) throw ConfigError("quantization_config.module_formats: expected {\"pattern\": \"q8_0\", ...}");
    for (const auto& [pattern, value] : it->items()) {
      const auto f = format_field(value, "module_formats." + pattern);
      if (f != format) others[f].push_back(pattern);
    }
  }
  auto main_excludes = keep;
  for (const auto& [f, paths] : others) main_excludes.insert(main_excludes.end(), paths.begin(), paths.end());
  torchpatch::PatchMapping::Items items{{"Linear", torchpatch::with_paths(linear_of(format), {}, main_excludes)}};
  for (const auto& [f, paths] : others) {
    const auto key = items.size() == 1 ? std::string("^Linear$") : fmt::format("^Linear$(?!{})", torchpatch::nn::format_name(f));
    items.emplace_back(key, torchpatch::with_paths(linear_of(f), paths, keep));
  }
  if (!torchpatch::nn::quantizes_to(format)) return items;  // GGUF files' MoE layouts are not read yet
  using torchpatch::PatchMapping;
  namespace kind = torchpatch::block_kind;
  items.emplace_back(PatchMapping::kind_key(kind::kExperts), torchpatch::with_paths(of_format(format, Replaced::kExperts), {}, keep));
  items.emplace_back(PatchMapping::kind_key(kind::kClampedSwigluExperts),
                     torchpatch::with_paths(of_format(format, Replaced::kClampedSwigluExperts), {}, keep));
  return items;
}

void register_plugin(torchpatch::Registrar& registrar) {
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const auto experts = of_format(format, Replaced::kExperts), clamped = of_format(format, Replaced::kClampedSwigluExperts);
    for (const auto& cls : {experts, clamped}) registrar.add_replacement(cls, {});
    registrar.add_conversion(experts.name, [format](const torchpatch::Config& config) {
      return experts_rules(format, torchpatch::experts_layout(config.as<torchpatch::ModelConfig>()));
    });
    registrar.add_conversion(clamped.name, [format](const torchpatch::Config&) { return clamped_swiglu_experts_rules(format); });
  }
  // A Linear in every format; GGUF files' projections of these types load as their blocks, byte for
  // byte (docs/gguf.md).
  std::vector<std::string> ggml_types;
  for (int f = 0; f <= static_cast<int>(QuantFormat::kQ6_K); ++f) {
    const auto format = static_cast<QuantFormat>(f);
    const auto linear = linear_of(format);
    registrar.add_replacement(linear, {});
    registrar.add_conversion(linear.name, [format](const torchpatch::Config&) { return linear_rules(format); });
    ggml_types.emplace_back(torchpatch::nn::ggml_type_info(torchpatch::nn::ggml_type(format)).name);
  }
  registrar.add_quantization_method({kMethod, ggml_patches, {}, ggml_types});
}

}  // namespace

TORCHPATCH_PLUGIN("quantized", "1.0.0", register_plugin)
