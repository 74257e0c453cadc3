// torchpatch bench: decode and prefill speed of a model against this machine's own limits, measured
// in the same run: decode tokens/s as a fraction of what memory bandwidth allows (every weight read
// once per token), prefill as a fraction of the float32 matmul rate (the model's own product's).
// With and without FusedQKVAttention when the plugin is there; for MoE models also the eager
// experts, SequentialExperts and a naive all-experts loop.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "commands.h"
#include "session.h"
#include "launch.h"
#include "llama_bench.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/nn/attention.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/mlp.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/models/blocks.h"
#include "torchpatch/nn/moe.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/patching/scope.h"

namespace torchpatch::cli {

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_seconds(int repeats, F&& run) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// STREAM's "copy": bytes read plus bytes written per second, one thread, buffers far larger than cache.
double copy_bandwidth(int repeats) {
  const int64_t bytes = int64_t{256} << 20;
  auto src = at::ones({bytes / 4}, at::kFloat);  // written once, so every page is really there
  auto dst = at::zeros({bytes / 4}, at::kFloat);
  const double seconds = best_seconds(repeats + 2, [&] { std::memcpy(dst.data_ptr(), src.data_ptr(), bytes); });
  return 2.0 * static_cast<double>(bytes) / seconds;
}

// A float32 product shaped as prefill's (128 rows, a 1024 x 1024 weight): the model's own (nn::linear,
// oneDNN's sgemm) and the system BLAS's (at::mm), in flop/s.
struct MatmulRates {
  double own;
  double blas;
};

// On a GPU: a copy of 1 GiB on the device (read + written per second), and a product shaped as a
// prefill's on the model's dtype (512 rows, a 4096 x 4096 weight), each waited for.
double device_copy_bandwidth(int repeats, c10::Device device) {
  const int64_t bytes = int64_t{1} << 30;
  auto src = at::ones({bytes / 4}, at::TensorOptions().device(device));
  auto dst = at::empty_like(src);
  const auto copy = [&] {
    dst.copy_(src);
    torch::cuda::synchronize(device.index());
  };
  copy();
  return 2.0 * static_cast<double>(bytes) / best_seconds(repeats + 2, copy);
}

double device_matmul_rate(int repeats, c10::Device device, c10::ScalarType dtype) {
  const int64_t rows = 512, n = 4096;
  const auto on = at::TensorOptions().device(device).dtype(dtype);
  auto a = at::randn({rows, n}, on), b = at::randn({n, n}, on);
  const auto product = [&] {
    at::linear(a, b);
    torch::cuda::synchronize(device.index());
  };
  product();
  return 2.0 * static_cast<double>(rows * n * n) / best_seconds(repeats + 5, product);
}

MatmulRates matmul_rates(int repeats) {
  const int64_t rows = 128, n = 1024;
  auto a = at::randn({rows, n}), b = at::randn({n, n}), c = at::empty({rows, n});
  const double flops = 2.0 * static_cast<double>(rows * n * n);
  nn::linear(a, b);  // warm up
  const double own = best_seconds(repeats + 20, [&] { nn::linear(a, b); });
  at::mm_out(c, a, b);
  const double blas = best_seconds(repeats + 20, [&] { at::mm_out(c, a, b); });
  return {flops / own, flops / blas};
}

// The share of a parameter one token uses: top_k / num_experts for routed experts, else all of it.
double active_share(const PretrainedModel& model, const std::string& name) {
  const auto& moe = model.config().decoder.moe;
  const bool routed = name.find(".experts.") != std::string::npos;
  return routed && moe.num_experts > 0
             ? static_cast<double>(moe.num_experts_per_tok) / static_cast<double>(moe.num_experts)
             : 1.0;
}

// Bytes a decode step reads: every parameter except the embedding table (one row per token), which
// still counts when the language-model head shares it (as the blocks it decodes from, if any); of
// routed experts, only the chosen ones.
double weight_bytes_per_token(const PretrainedModel& model) {
  std::map<const void*, double> read_as_blocks;  // weights whose few-row products read blocks instead
  for (const auto& m : model.named_modules()) {
    const auto* linear = dynamic_cast<const nn::Linear*>(m.value().get());
    if (linear == nullptr) continue;
    if (const auto blocks = linear->decode_blocks(); blocks.defined()) {
      read_as_blocks[linear->weight.data_ptr()] = static_cast<double>(blocks.nbytes());
    }
  }
  std::set<const void*> seen;
  double bytes = 0;
  for (const auto& p : model.named_parameters()) {
    if (p.key().find("embed_tokens") != std::string::npos) continue;
    if (!seen.insert(p.value().data_ptr()).second) continue;
    const auto blocks = read_as_blocks.find(p.value().data_ptr());
    const double size = blocks != read_as_blocks.end() ? blocks->second
                                                       : static_cast<double>(p.value().numel() * p.value().element_size());
    bytes += size * active_share(model, p.key());
  }
  return bytes;
}

// Floating-point work of a prefill of `tokens`: every layer matmul, eager attention's two [T, T]
// products per head, and the head for the last position.
double prefill_flops(const PretrainedModel& model, int64_t tokens) {
  const auto& d = model.config().decoder;
  double flops = 0;
  for (const auto& p : model.named_parameters()) {
    if (p.value().dim() >= 2 && p.key().find(".layers.") != std::string::npos) {
      flops += 2.0 * static_cast<double>(tokens * p.value().numel()) * active_share(model, p.key());
    }
  }
  const double t = static_cast<double>(tokens);
  flops += 4.0 * t * t * static_cast<double>(d.num_attention_heads * d.head_dim * d.num_hidden_layers);
  flops += 2.0 * static_cast<double>(d.vocab_size * d.hidden_size);
  return flops;
}

struct Measurement {
  std::string variant;
  double decode_tokens_per_second;
  double prefill_tokens_per_second;
  double weight_bytes_per_token;  ///< this variant's own (quantized weights read fewer)
};

struct BenchRun {
  int64_t prompt_len, decode_tokens;
  int64_t decode_prompt_len;  ///< tokens prefilled before the timed decoding (llama-bench's tg: from empty)
  int repeats;
};

// Best of `run.repeats` generations after a warm-up. Decoding is timed after a prompt of
// run.decode_prompt_len tokens: where that is not the prefill's prompt, decoding gets runs of its own
// (every cached token is read again at each step, so the context decoding starts from matters).
Measurement measure(const std::string& variant, PretrainedModel& model, const BenchRun& run, bool cuda_graph = true) {
  const auto vocab = model.config().decoder.vocab_size;
  const auto ids = at::randint(3, vocab, {1, run.prompt_len}, at::kLong);
  const bool separate = run.decode_prompt_len != run.prompt_len;
  const auto decode_ids = separate ? at::randint(3, vocab, {1, run.decode_prompt_len}, at::kLong) : ids;
  GenerationConfig prefill_config, decode_config;
  prefill_config.cuda_graph = decode_config.cuda_graph = cuda_graph;
  prefill_config.max_new_tokens = separate ? 1 : run.decode_tokens + 1;
  decode_config.max_new_tokens = run.decode_tokens + 1;
  generate(model, ids, {}, prefill_config);  // warm up
  if (separate) generate(model, decode_ids, {}, decode_config);
  Measurement m{variant, 0, 0, weight_bytes_per_token(model)};
  for (int i = 0; i < run.repeats; ++i) {
    const auto out = generate(model, ids, {}, prefill_config);
    m.prefill_tokens_per_second = std::max(m.prefill_tokens_per_second, out.prefill_tokens_per_second());
    const auto decoded = separate ? generate(model, decode_ids, {}, decode_config) : out;
    m.decode_tokens_per_second = std::max(m.decode_tokens_per_second, decoded.decode_tokens_per_second());
  }
  return m;
}

// The key of the patch points whose path ends in `suffix`, e.g. "LlamaAttention" for "self_attn".
std::string key_of(const PretrainedModel& model, const std::string& suffix) {
  for (const auto& point : model.patch_points()) {
    const auto& path = point.path;
    if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return point.module->patch_record().key;
    }
  }
  return "";
}

// Quantized weights are held as uint8 blocks. A model built quantized (from a quantized checkpoint or
// with --quantize) has no float experts for the float variants to take over.
bool holds_blocks(const PretrainedModel& model) {
  for (const auto& p : model.parameters()) {
    if (p.scalar_type() == at::kByte) return true;
  }
  return false;
}

// The benchmark's baseline for MoE: every expert runs on every token, weighted by the routing
// (zero for experts not chosen), one expert after another.
class NaiveAllExperts : public nn::FusedExperts {
 public:
  explicit NaiveAllExperts(const BuildContext& ctx) : FusedExperts(experts_options(model_config(ctx).decoder)) {}

 protected:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& indices, const at::Tensor& weights) override {
    auto out = at::zeros_like(hidden);
    for (int64_t e = 0; e < num_experts; ++e) {
      auto gate_up = at::linear(hidden, gate_up_proj[e]).chunk(2, -1);
      auto y = at::linear(nn::activate(act, gate_up[0]) * gate_up[1], down_proj[e]);
      out = out + y * (weights * (indices == e)).sum(-1, /*keepdim=*/true);
    }
    return out;
  }
};

// The variants beside the model as built: with FusedQKVAttention (when its plugin is there), and for
// MoE models the eager experts, SequentialExperts and a naive all-experts loop. Each is built afresh;
// `built` is released first so one model is in memory at a time.
void measure_variants(PluginHost& host, BuiltModel& built, const Args& args, const std::vector<OptionSpec>& specs,
                      const std::vector<std::string>& forwarded, const BenchRun& run, std::vector<Measurement>& results) {
  const auto fused = host.find_class("FusedQKVAttention");
  const auto key = key_of(*built.model, "self_attn");
  const auto experts_key = key_of(*built.model, ".experts");
  // In a group the parallel classes hold the attention, MLP and experts keys: the variants that replace
  // them would measure a model that is not split.
  const bool in_group = process_group() != nullptr;
  const bool quantized = holds_blocks(*built.model);
  if (fused && !args.flag("no-fused") && !args.has("patch") && !key.empty() && !in_group) {
    built.model.reset();  // one model in memory at a time
    ScopedPatchMapping patch({{key, *fused}}, false, host.registries().patches());
    BuiltModel patched = build_model(host, Args(specs, forwarded));
    results.push_back(measure("FusedQKVAttention", *patched.model, run));
  }
  if (!experts_key.empty() && !args.has("patch") && !args.has("experts") && !in_group && !quantized) {
    built.model.reset();
    auto eager_argv = forwarded;
    eager_argv.insert(eager_argv.end(), {"--experts", "eager"});
    results.push_back(measure("eager experts", *build_model(host, Args(specs, eager_argv)).model, run));
    if (const auto sequential = host.find_class("SequentialExperts")) {
      ScopedPatchMapping patch({{experts_key, *sequential}}, false, host.registries().patches());
      results.push_back(measure("SequentialExperts", *build_model(host, Args(specs, forwarded)).model, run));
    }
    ScopedPatchMapping naive({{experts_key, module_class<NaiveAllExperts>("NaiveAllExperts")}}, false,
                             host.registries().patches());
    results.push_back(measure("naive: all experts, all tokens", *build_model(host, Args(specs, forwarded)).model, run));
  }
  // Quantized: every projection and the experts in GGUF's blocks, built from the same float weights.
  if (host.registries().families().quantization_method("ggml") && !args.has("quantize") && !args.flag("no-quantized") &&
      !in_group && !quantized) {
    for (const char* format : {"q8_0", "q4_0"}) {
      built.model.reset();
      auto quantized_argv = forwarded;
      quantized_argv.insert(quantized_argv.end(), {"--quantize", format});
      results.push_back(measure(fmt::format("quantized {}", format), *build_model(host, Args(specs, quantized_argv)).model,
                                run));
    }
  }
}

// ATEN_CPU_CAPABILITY, which caps LibTorch's kernels and torchpatch's at an x86 level; "" when unset.
std::string cpu_capability_cap() {
  const char* value = std::getenv("ATEN_CPU_CAPABILITY");
  return value ? value : "";
}

// --quant-kernel NAME for the whole run (the model is then built in the layout that kernel reads).
void choose_quant_kernel(const std::string& name) {
  const auto kernel = nn::parse_quant_kernel(name);
  if (!kernel) throw UsageError(fmt::format("--quant-kernel: '{}' is not a kernel (auto, avx512, avx2, scalar)", name));
  if (!nn::quant_kernel_available(*kernel)) {
    std::string runs;
    for (const auto k : {nn::QuantKernel::kAvx512, nn::QuantKernel::kAvx2, nn::QuantKernel::kScalar}) {
      if (nn::quant_kernel_available(k)) runs += std::string(runs.empty() ? "" : ", ") + nn::quant_kernel_name(k);
    }
    throw UsageError(fmt::format("--quant-kernel {}: this CPU cannot run it (it runs {}{})", name, runs,
                                 cpu_capability_cap().empty() ? "" : " under ATEN_CPU_CAPABILITY=" + cpu_capability_cap()));
  }
  nn::set_quant_kernel(*kernel);
}

void print_machine(const nlohmann::json& report) {
  const auto cap = report["cpu_capability_cap"].get<std::string>();
  std::cout << fmt::format("machine: copy bandwidth {:.2f} GB/s (memcpy of 256 MiB, read + written, best of before and after the variants), float32 matmul "
                           "{:.1f} GFLOP/s (128x1024x1024, oneDNN; the system BLAS {:.1f}), {} thread(s), quantized "
                           "kernel {} ({} layout){}\n",
                           report["copy_bandwidth_bytes_per_second"].get<double>() / 1e9,
                           report["matmul_flops_per_second"].get<double>() / 1e9,
                           report["blas_matmul_flops_per_second"].get<double>() / 1e9, report["threads"].get<int>(),
                           report["quant_kernel"].get<std::string>(), report["quant_layout"].get<std::string>(),
                           cap.empty() ? "" : fmt::format(", kernels capped at ATEN_CPU_CAPABILITY={}", cap));
}

// With --compare-llama-bench: llama.cpp's figures, and each variant's over them.
void print_llama_bench(const nlohmann::json& report) {
  if (!report.contains("llama_bench")) return;
  const auto& l = report["llama_bench"];
  std::cout << fmt::format("llama.cpp {} on {} ({}), {} thread(s), best of its runs: prefill {:.1f} tok/s, decode "
                           "{:.1f} tok/s\n",
                           l["build_commit"].get<std::string>(), l["model"].get<std::string>(),
                           l["model_type"].get<std::string>(), l["threads"].get<int64_t>(),
                           l["prefill_tokens_per_second"].get<double>(), l["decode_tokens_per_second"].get<double>());
  std::cout << fmt::format("{:<32} {:>24} {:>24}\n", "variant", "decode x llama.cpp", "prefill x llama.cpp");
  for (const auto& r : report["results"]) {
    std::cout << fmt::format("{:<32} {:>24.2f} {:>24.2f}\n", r["variant"].get<std::string>(),
                             r["decode_vs_llama_bench"].get<double>(), r["prefill_vs_llama_bench"].get<double>());
  }
}

void print_table(const nlohmann::json& report) {
  std::cout << fmt::format("model: {} ({:.1f}M parameters), {:.1f} MB of weights read per decoded token, "
                           "decode limit {:.1f} tokens/s; prefill of {} tokens = {:.2f} GFLOP; {} decode steps "
                           "timed after a prompt of {}\n",
                           report["model"].get<std::string>(), report["parameters"].get<double>() / 1e6,
                           report["weight_bytes_per_token"].get<double>() / 1e6,
                           report["decode_limit_tokens_per_second"].get<double>(), report["prompt_len"].get<int64_t>(),
                           report["prefill_flops"].get<double>() / 1e9, report["decode_tokens"].get<int64_t>(),
                           report["decode_prompt_len"].get<int64_t>());
  std::cout << "(of limit: decode tok/s against the variant's own bytes per token; x limit: against the model as "
               "built's)\n";
  std::cout << fmt::format("{:<32} {:>14} {:>10} {:>10} {:>16} {:>10} {:>12}\n", "variant", "decode tok/s", "of limit",
                           "x limit", "prefill tok/s", "GFLOP/s", "of matmul");
  for (const auto& r : report["results"]) {
    std::cout << fmt::format("{:<32} {:>14.1f} {:>10.2f} {:>10.2f} {:>16.1f} {:>10.1f} {:>12.2f}\n",
                             r["variant"].get<std::string>(), r["decode_tokens_per_second"].get<double>(),
                             r["decode_fraction_of_bandwidth_limit"].get<double>(),
                             r["decode_multiple_of_model_limit"].get<double>(),
                             r["prefill_tokens_per_second"].get<double>(), r["prefill_gflops"].get<double>(),
                             r["prefill_fraction_of_matmul_rate"].get<double>());
  }
}

void print_report(const nlohmann::json& report) {
  if (report["device"].get<std::string>() != "cpu") {
    std::cout << fmt::format("device: {}: copy bandwidth {:.1f} GB/s (1 GiB copied on the device, read + written), "
                             "{} matmul {:.1f} TFLOP/s (512x4096x4096)\n",
                             report["device"].get<std::string>(), report["copy_bandwidth_bytes_per_second"].get<double>() / 1e9,
                             report["dtype"].get<std::string>(), report["matmul_flops_per_second"].get<double>() / 1e12);
  } else {
    print_machine(report);
  }
  print_table(report);
  print_llama_bench(report);
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.push_back(tp_option());
  specs.insert(specs.begin() + 3,
               {{"prompt-len", "N", "prefill length (default 128)"},
                {"decode-tokens", "N", "decode steps timed per run (default 32)"},
                {"decode-prompt-len", "N", "tokens prefilled before the timed decode steps (default: --prompt-len; "
                                           "with --compare-llama-bench 1, as llama-bench's tg test decodes from an "
                                           "empty cache)"},
                {"repeats", "N", "timed runs; the best is reported (default 3)"},
                {"no-fused", "", "skip the FusedQKVAttention variant"},
                {"no-blas", "", "skip the variant whose float32 products run on the system BLAS"},
                {"no-eager-attention", "", "skip the variant whose prefill attention is eager instead of fused"},
                {"no-quantized", "", "skip the q8_0 and q4_0 variants"},
                {"quant-kernel", "NAME", "the quantized products' kernel: auto (default: the best this CPU has), avx512, "
                                         "avx2 or scalar"},
                {"compare-llama-bench", "FILE", "llama-bench's JSON for the same weights (`llama-bench -m FILE -t T -p "
                                                "PROMPT-LEN -n DECODE-TOKENS -o json`): print each variant's ratios to it"}});
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("bench",
                       "Measure decode and prefill speed against this machine's memory bandwidth and matmul rate "
                       "(default: --preset llama-125m).",
                       specs);
    return 0;
  }
  const int64_t prompt_len = int_option(args, "prompt-len", 128, 1);
  const int64_t decode_tokens = int_option(args, "decode-tokens", 32, 1);
  // Checked before narrowing to int: 4294967297 must not quietly become 1.
  const int64_t repeats_wanted = int_option(args, "repeats", 3, 1);
  if (repeats_wanted > 1000000) throw UsageError(fmt::format("--repeats: {} is more than 1000000", repeats_wanted));
  const int repeats = static_cast<int>(repeats_wanted);
  // llama-bench times its tg test from an empty cache: compared with it, decoding starts there too.
  const int64_t decode_prompt_len =
      int_option(args, "decode-prompt-len", args.has("compare-llama-bench") ? 1 : prompt_len, 1);
  if (args.has("quant-kernel")) choose_quant_kernel(args.value("quant-kernel"));
  // One thread unless asked: on the CPU the figures compare with the one-thread limits. On a GPU the
  // host only loads (and quantizes) the weights, with every core.
  const bool on_gpu = args.has("device") && args.value("device") != "cpu";
  apply_threads(args, /*fallback=*/on_gpu ? 0 : 1);
  // Read before anything is measured: a file that does not match the run fails at once.
  std::optional<LlamaBenchFigures> llama;
  if (args.has("compare-llama-bench")) {
    llama = read_llama_bench(args.value("compare-llama-bench"), at::get_num_threads(), prompt_len, decode_tokens);
  }
  std::vector<std::string> forwarded = argv;
  if (!args.has("model") && !args.has("preset")) forwarded.insert(forwarded.end(), {"--preset", "llama-125m"});
  const Args model_args(specs, forwarded);

  const auto host = open_plugin_host(model_args);
  const auto options = pretrained_options(model_args, *host);
  const bool cpu = options.device.is_cpu();
  // On the CPU the machine is measured before the model takes its memory; a GPU is measured with the
  // model on it, in the model's dtype.
  double bandwidth = cpu ? copy_bandwidth(repeats) : 0;
  const auto rates = cpu ? matmul_rates(repeats) : MatmulRates{0, 0};
  BuiltModel built = build_model(*host, model_args);
  at::NoGradGuard no_grad;
  const auto model_parameters = built.model->parameters();
  const auto dtype = model_parameters.empty() ? at::kFloat : model_parameters.front().scalar_type();
  if (!cpu) bandwidth = device_copy_bandwidth(repeats, options.device);
  const double matmul = cpu ? rates.own : device_matmul_rate(repeats, options.device, dtype);
  const double bytes = weight_bytes_per_token(*built.model);
  const double flops = prefill_flops(*built.model, prompt_len);
  int64_t parameters = 0;
  for (const auto& p : model_parameters) parameters += p.numel();

  const BenchRun run{prompt_len, decode_tokens, decode_prompt_len, repeats};
  std::vector<Measurement> results{measure(args.has("patch") ? "as patched" : "built-in", *built.model, run)};
  if (!cpu) {
    // CUDA graph decoding's baseline: one forward pass per token, each operation launched by the host.
    results.push_back(measure(results[0].variant + ", no CUDA graph", *built.model, run, /*cuda_graph=*/false));
  }
  if (!args.flag("no-blas") && cpu) {
    // The same model with every float32 product on the system BLAS (sgemv for one token, sgemm for
    // prefill): the baseline of the decoding kernel and of oneDNN's sgemm.
    const auto previous_decode = nn::set_decode_kernel(nn::DecodeKernel::kBlas);
    const auto previous_matmul = nn::set_matmul_kernel(nn::MatmulKernel::kBlas);
    results.push_back(measure(results[0].variant + ", system BLAS", *built.model, run));
    nn::set_decode_kernel(previous_decode);
    nn::set_matmul_kernel(previous_matmul);
  }
  if (!args.flag("no-eager-attention")) {
    // Prefill attention as two matmuls and a softmax: the baseline of LibTorch's fused attention.
    const auto previous = nn::set_prefill_attention(nn::PrefillAttention::kEager);
    if (previous == nn::PrefillAttention::kFused)
      results.push_back(measure(results[0].variant + ", eager attention", *built.model, run));
    nn::set_prefill_attention(previous);
  }
  measure_variants(*host, built, args, specs, forwarded, run, results);
  // Measured again after the variants, and the higher figure kept: on a shared machine the bandwidth
  // drifts, and the limit should be the best this machine showed during the run.
  bandwidth = std::max(bandwidth, cpu ? copy_bandwidth(repeats) : device_copy_bandwidth(repeats, options.device));

  const double limit = bandwidth / bytes;  // tokens/s if decoding only streamed the weights
  auto rows = nlohmann::json::array();
  for (const auto& m : results) {
    const double gflops = m.prefill_tokens_per_second * flops / static_cast<double>(prompt_len) / 1e9;
    rows.push_back({{"variant", m.variant},
                    {"decode_tokens_per_second", m.decode_tokens_per_second},
                    {"weight_bytes_per_token", m.weight_bytes_per_token},
                    {"decode_fraction_of_bandwidth_limit", m.decode_tokens_per_second / (bandwidth / m.weight_bytes_per_token)},
                    {"decode_multiple_of_model_limit", m.decode_tokens_per_second / limit},
                    {"prefill_tokens_per_second", m.prefill_tokens_per_second},
                    {"prefill_gflops", gflops},
                    {"prefill_fraction_of_matmul_rate", gflops * 1e9 / matmul}});
    if (llama) {
      rows.back()["decode_vs_llama_bench"] = m.decode_tokens_per_second / llama->decode_tokens_per_second;
      rows.back()["prefill_vs_llama_bench"] = m.prefill_tokens_per_second / llama->prefill_tokens_per_second;
    }
  }
  nlohmann::json report{{"model", built.source},
                              {"device", options.device.str()},
                              {"dtype", c10::toString(dtype)},
                              {"parameters", parameters},
                              {"weight_bytes_per_token", bytes},
                              {"threads", at::get_num_threads()},
                              {"quant_kernel", nn::quant_kernel_name(nn::active_quant_kernel())},
                              {"quant_layout", nn::preferred_quant_layout() == nn::QuantLayout::kRows16 ? "kRows16" : "kBlocks"},
                              // LibTorch's and torchpatch's kernels stop at this x86 level ("" when unset).
                              {"cpu_capability_cap", cpu_capability_cap()},
                              {"prompt_len", prompt_len},
                              {"decode_tokens", decode_tokens},
                              {"decode_prompt_len", decode_prompt_len},
                              {"copy_bandwidth_bytes_per_second", bandwidth},
                              {"matmul_flops_per_second", matmul},
                              {"blas_matmul_flops_per_second", rates.blas},
                              {"decode_limit_tokens_per_second", limit},
                              {"prefill_flops", flops},
                              {"results", rows}};
  if (llama) {
    report["llama_bench"] = {{"model", llama->model},
                             {"model_type", llama->model_type},
                             {"build_commit", llama->build_commit},
                             {"threads", llama->threads},
                             {"prefill_tokens_per_second", llama->prefill_tokens_per_second},
                             {"decode_tokens_per_second", llama->decode_tokens_per_second}};
  }
  if (args.flag("json")) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  print_report(report);
  return 0;
}

}  // namespace torchpatch::cli
