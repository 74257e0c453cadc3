// Devices: --device and PretrainedOptions::device everywhere a model is made, and the same models,
// patches, plugins and quantized blocks on a CUDA GPU. Tests tagged [cuda] need one: without it they
// print "TORCHPATCH_SKIP: ..." and ctest reports them skipped (tests/CMakeLists.txt). The others run
// everywhere: devices named wrongly, a GPU this machine lacks, a plugin class that runs on the CPU only.
#include "test_prelude.h"
#include "reference_case.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "torchpatch/device.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/runtime/auto.h"

using namespace torchpatch;
using Catch::Matchers::Contains;
using reference::Case;

namespace {

const c10::Device kCpu(c10::kCPU);
const c10::Device kCuda(c10::kCUDA, 0);

// Whether this run has a GPU to test; otherwise says so in the form ctest reports as skipped.
bool cuda_or_skip() {
  if (cuda_device_count() > 0) return true;
  std::cout << "TORCHPATCH_SKIP: no CUDA device here (" << (cuda_built() ? "a CUDA build, no GPU or driver" : "a build without CUDA")
            << "): this [cuda] test did not run\n";
  return false;
}

// The bundled plugins as a catalogue, in registries of their own (the phi3 family, the quantized classes).
struct Bundled {
  Registries registries = default_registries().with_own_patches();
  PluginHost host{PluginHostOptions{}, registries};
  Bundled() { host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue); }
};

Bundled& bundled() {
  static auto* b = new Bundled();  // plugins stay loaded for the process
  return *b;
}

nlohmann::json manifest(const Case& c) {
  std::ifstream in(c.dir / "manifest.json");
  return nlohmann::json::parse(in);
}

std::shared_ptr<PretrainedModel> load_on(const Case& c, c10::Device device, std::optional<c10::ScalarType> dtype = {}) {
  PretrainedOptions options;
  options.registries = bundled().host.registries();
  options.device = device;
  options.dtype = dtype;
  return from_pretrained(c.dir, options);
}

// The decoder cases of tests/data (every one with a causal-LM reference).
std::vector<std::string> decoder_cases() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(testutil::data_dir())) {
    const auto file = entry.path() / "manifest.json";
    if (!std::filesystem::exists(file) || !std::filesystem::exists(entry.path() / "reference.safetensors")) continue;
    std::ifstream in(file);
    const auto m = nlohmann::json::parse(in);
    const auto cls = m.value("hf_class", std::string());
    if (cls.size() > 11 && cls.compare(cls.size() - 11, 11, "ForCausalLM") == 0) names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The message of the DeviceError `run` throws ("" and a failure when it throws none).
template <class F>
std::string device_error(F&& run) {
  try {
    run();
  } catch (const DeviceError& e) {
    return e.what();
  }
  FAIL_CHECK("no DeviceError was thrown");
  return "";
}

// max |logits - reference| at real tokens of the padded batch, for the model in its dtype.
double logits_error(PretrainedModel& model, const Case& c) {
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.position_ids = c.get("position_ids");
  const auto out = on_host(model.forward(in));
  return testutil::max_abs_diff(out.logits, c.get("logits"), in.attention_mask);
}

}  // namespace

// -- everywhere -------------------------------------------------------------------------------------

TEST_CASE("devices are named cpu, cuda or cuda:N", "[device]") {
  CHECK(parse_device("cpu") == kCpu);
  CHECK(parse_device("cuda") == c10::Device(c10::kCUDA));
  CHECK(parse_device("cuda:3") == c10::Device(c10::kCUDA, 3));
  for (const auto* bad : {"gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:1000", "mps", ""}) {
    INFO(bad);
    CHECK_THAT(device_error([&] { parse_device(bad); }), Contains("use cpu, cuda or cuda:N"));
  }
  CHECK_NOTHROW(check_device(kCpu));
}

TEST_CASE("the size checks name whose memory they compare with", "[device]") {
  CHECK(device_memory_bytes(kCpu) > 1e8);
  CHECK(device_memory_owner(kCpu) == "this machine's");
  CHECK(device_memory_owner(c10::Device(c10::kCUDA, 1)) == "GPU cuda:1's");
  CHECK(device_memory_owner(c10::Device(c10::kCUDA)) == "the current GPU's");
}

TEST_CASE("a GPU this machine or build lacks is a clear error, before anything is built", "[device]") {
  if (cuda_device_count() > 0) {
    CHECK_NOTHROW(check_device(kCuda));
    CHECK_THAT(device_error([&] { check_device(c10::Device(c10::kCUDA, 127)); }), Contains("choose one of them"));
    return;
  }
  const auto expected = cuda_built() ? "this machine has no CUDA GPU" : "built without CUDA";
  CHECK_THAT(device_error([&] { check_device(kCuda); }), Contains(expected) && Contains("--device cpu"));
  PretrainedOptions options;
  options.device = kCuda;
  CHECK_THAT(device_error([&] { preset_model("tiny-llama", 0, options); }), Contains(expected));
  CHECK_THAT(device_error([&] { from_pretrained(testutil::data_dir() / "llama_basic", options); }), Contains(expected));

  const auto cli = testutil::torchpatch_cli("run --preset tiny-llama --prompt-ids 1,2 --device cuda");
  INFO(cli.out);
  CHECK(cli.code == 1);
  CHECK_THAT(cli.out, Contains("device 'cuda:0'") || Contains("device 'cuda'"));
  CHECK_THAT(cli.out, Contains(expected));
  CHECK_THAT(cli.out, !Contains("Exception raised from"));  // no LibTorch backtrace
}

// The shared objects a CLI run loaded, from the dynamic loader's own account (LD_DEBUG=files: one
// "calling init: PATH" line per library it initialises).
namespace {
std::string libraries_loaded_by(const std::string& arguments) {
  const auto r = testutil::torchpatch_cli(arguments, "LD_DEBUG=files");
  std::string libraries;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find("calling init: ");
    if (at != std::string::npos) libraries += line.substr(at + 14) + "\n";
  }
  return libraries;
}
}  // namespace

TEST_CASE("a command that asks for no GPU loads no CUDA library; one that does loads torchpatch's", "[device][cli]") {
  for (const auto* command : {"--version", "plan --preset tiny-llama", "run --preset tiny-llama --prompt-ids 1,2"}) {
    const auto loaded = libraries_loaded_by(command);
    INFO(command << " loaded:\n" << loaded);
    REQUIRE_THAT(loaded, Contains("libtorch_cpu.so"));  // the loader's account was read
    CHECK_THAT(loaded, !Contains("libtorch_cuda") && !Contains("libcublas") && !Contains("libcudnn") &&
                           !Contains("libnccl") && !Contains("libtorchpatch_cuda"));
  }
  const auto loaded = libraries_loaded_by("run --preset tiny-llama --prompt-ids 1,2 --device cuda");
  INFO(loaded);
  if (cuda_built()) {
    CHECK_THAT(loaded, Contains("libtorchpatch_cuda.so") && Contains("libtorch_cuda.so"));
  } else {
    CHECK_THAT(loaded, !Contains("libtorch_cuda"));
  }
}

TEST_CASE("every command that builds a model takes --device cpu, cuda or cuda:N", "[device][cli]") {
  for (const auto* command : {"run --prompt-ids 1", "generate --prompt-ids 1", "bench", "verify", "save --output /tmp/x",
                              "plan", "routing record --prompt-ids 1 --output /tmp/x.npy"}) {
    const auto r = testutil::torchpatch_cli(std::string(command) + " --preset tiny-llama --device gpu0");
    INFO(command << ": " << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("--device: device 'gpu0'") && Contains("use cpu, cuda or cuda:N"));
  }
  const auto cpu = testutil::torchpatch_cli("generate --preset tiny-llama --prompt-ids 1,2,3 --max-new-tokens 4 --device cpu");
  INFO(cpu.out);
  CHECK(cpu.code == 0);
}

TEST_CASE("a plugin class that does not declare CUDA is refused on CUDA, naming it", "[device][plugins]") {
  Registries registries = default_registries().with_own_patches();
  PluginHost host(PluginHostOptions{}, registries);
  host.load_directory(std::filesystem::path(TORCHPATCH_TEST_PLUGIN_DIR) / "derived_attention", PluginMode::DropIn);
  PretrainedOptions options;
  options.registries = host.registries();
  const auto model = preset_model("tiny-llama", 0, options);
  CHECK_NOTHROW(check_device_support(*model, kCpu));
  CHECK_THAT(device_error([&] { check_device_support(*model, kCuda); }), Contains("LlamaForCausalLM cannot run on cuda:0") &&
                                      Contains("model.layers.0.self_attn (DerivedLlamaAttention, plugin "
                                               "torchpatch-test-derived-attention 0.4.0") &&
                                      Contains("model.layers.1.self_attn (DerivedLlamaAttention") &&
                                      Contains("run on the CPU only") && Contains("--device cpu"));

  // The bundled CustomLlamaAttention declares CUDA; the built-in classes run everywhere.
  Registries own = default_registries().with_own_patches();
  PretrainedOptions plain;
  plain.registries = own;
  CHECK_NOTHROW(check_device_support(*preset_model("tiny-llama", 0, plain), kCuda));
  const auto custom = bundled().host.find_class("CustomLlamaAttention");
  REQUIRE(custom);
  CHECK(runs_on(custom->devices, custom->origin.builtin(), c10::kCUDA));
  ScopedPatchMapping patch({{"LlamaAttention", *custom}}, false, own.patches());
  CHECK_NOTHROW(check_device_support(*preset_model("tiny-llama", 0, plain), kCuda));
}

TEST_CASE("a model built for a GPU lays its quantized blocks out as GGUF's", "[device][quantized]") {
  {
    const nn::GgufBlocksOnly gpu;
    CHECK(nn::preferred_quant_layout() == nn::QuantLayout::kBlocks);
  }
  CHECK(nn::preferred_quant_layout() ==
        (nn::quant_kernel_available(nn::QuantKernel::kAvx512) ? nn::QuantLayout::kRows16 : nn::QuantLayout::kBlocks));
}

TEST_CASE("decoding over a static cache gives the reference's tokens and logits", "[generate][cache]") {
  // What a CUDA graph replays, run op by op on the CPU: every decoder case, its padded batch.
  for (const auto& name : decoder_cases()) {
    const Case c(name);
    INFO(name);
    const auto model = load_on(c, kCpu);
    auto config = reference::reference_greedy();
    config.static_cache = true;
    const auto out = generate(*model, c.get("input_ids"), c.get("attention_mask"), config);
    CHECK(at::equal(out.sequences, c.get("generated_ids")));
    CHECK(testutil::close(name + " static-cache generated_logits", at::stack(out.logits), c.get("generated_logits")));
    CHECK_FALSE(out.cuda_graph);
    const auto& types = model->config().decoder.layer_types;
    const bool sliding = std::count(types.begin(), types.end(), kSlidingAttention) > 0 ||
                         (model->config().decoder.sliding_window && types.empty());
    const bool recomputes = model->recompute_at(c.get("input_ids").size(1) + 8, 0) ||
                            model->recompute_at(c.get("input_ids").size(1) + 1, 0);
    if (sliding) {
      CHECK_FALSE(out.static_cache);
      CHECK_THAT(out.static_refusal, Contains("sliding-window layers"));
    } else if (!recomputes) {
      CHECK(out.static_cache);
      CHECK(out.static_refusal.empty());
    }
  }
}

// -- on a GPU -----------------------------------------------------------------------------------------

TEST_CASE("every reference case matches on CUDA in float32, and in bfloat16 as closely as on the CPU", "[cuda][reference]") {
  if (!cuda_or_skip()) return;
  for (const auto& name : decoder_cases()) {
    const Case c(name);
    const auto moe_layers = manifest(c).value("moe_layers", std::vector<int64_t>{});
    INFO(name);
    {
      const auto model = load_on(c, kCuda);
      REQUIRE(model->device().is_cuda());
      reference::check_forward(*model, c);
      if (!moe_layers.empty()) reference::check_routing(*model, c, moe_layers);
      reference::check_generation(*model, c);
    }
    // bfloat16 keeps 8 bits of mantissa: a logit of a few units is off by some hundredths after a
    // few layers, on any device. The GPU's may be at most twice as far from float32 as the CPU's
    // bfloat16 is on the same case (plus one bf16 step at 4: 2^-5), whatever its kernels round.
    const double cpu_error = logits_error(*load_on(c, kCpu, at::kBFloat16), c);
    const double cuda_error = logits_error(*load_on(c, kCuda, at::kBFloat16), c);
    std::cout << name << " bfloat16 logits: max abs diff from float32 " << cuda_error << " on CUDA, " << cpu_error
              << " on the CPU\n";
    CHECK(cuda_error <= 2 * cpu_error + 0.03125);
  }
}

TEST_CASE("BERT matches its reference on CUDA", "[cuda][reference][bert]") {
  if (!cuda_or_skip()) return;
  const Case c("bert_model");
  const auto model = load_on(c, kCuda);
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = c.get("input_ids");
  in.attention_mask = c.get("attention_mask");
  in.token_type_ids = c.get("token_type_ids");
  const auto out = on_host(model->forward(in));
  CHECK(testutil::close("bert last_hidden_state", out.last_hidden_state, c.get("last_hidden_state"), in.attention_mask));
  CHECK(testutil::close("bert pooler_output", out.pooler_output, c.get("pooler_output")));
}

TEST_CASE("CUDA graph decoding gives what step-by-step decoding gives", "[cuda][generate]") {
  if (!cuda_or_skip()) return;
  const Case c("llama_basic");
  const auto model = load_on(c, kCuda);
  auto config = reference::reference_greedy();
  config.max_new_tokens = 12;
  const auto graph = generate(*model, c.get("input_ids"), c.get("attention_mask"), config);
  config.cuda_graph = false;
  const auto eager = generate(*model, c.get("input_ids"), c.get("attention_mask"), config);
  CHECK(graph.cuda_graph);
  CHECK(graph.static_cache);
  CHECK(graph.static_refusal.empty());
  CHECK_FALSE(eager.cuda_graph);
  CHECK(at::equal(graph.sequences, eager.sequences));
  CHECK(testutil::close("graph vs eager step logits", at::stack(graph.logits), at::stack(eager.logits), {}, 1e-5, 1e-5));
  // A MoE model says why it decodes step by step.
  const auto moe = load_on(Case("qwen2_moe_basic"), kCuda);
  const auto routed = generate(*moe, c.get("row0_input_ids"), {}, reference::reference_greedy());
  CHECK_FALSE(routed.cuda_graph);
  CHECK_THAT(routed.static_refusal, Contains("mixture-of-experts"));
}

TEST_CASE("on a GPU a model and a key/value cache must fit the GPU's memory", "[cuda][hardening]") {
  if (!cuda_or_skip()) return;
  CHECK(device_memory_bytes(kCuda) > 1e9);
  // 10^12 parameters, refused before anything is built or moved (non-strict: the checkpoint is small).
  const Case c("llama_basic");
  const testutil::ScratchDir dir("gpu-absurd-model");
  auto config = nlohmann::json::parse(std::ifstream(c.dir / "config.json"));
  config["vocab_size"] = int64_t{1000000000000};
  std::ofstream(dir.path / "config.json") << config.dump();
  std::filesystem::copy_file(c.dir / "model.safetensors", dir.path / "model.safetensors");
  PretrainedOptions options;
  options.device = kCuda;
  options.strict = false;
  CHECK_THROWS_WITH(from_pretrained(dir.path, options), Contains("more than GPU cuda:0's") && Contains("--no-memory-check"));
  // The cache of 10^12 positions (dynamic RoPE follows any length).
  auto tiny = preset_config("tiny-llama").raw;
  tiny["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  const auto model = from_config(ModelConfig::from_json(tiny, "dynamic"));
  model->to(kCuda);
  GenerationConfig generation;
  generation.max_new_tokens = 1000000000000;
  CHECK_THROWS_WITH(generate(*model, at::tensor(std::vector<int64_t>{1, 2, 3}).view({1, 3}), {}, generation),
                    Contains("more than GPU cuda:0's") && Contains("lower max_new_tokens"));
}

TEST_CASE("a patch and a plugin class run on CUDA", "[cuda][plugins]") {
  if (!cuda_or_skip()) return;
  const Case c("llama_basic");
  const auto builtin = load_on(c, kCuda);
  const auto custom = bundled().host.find_class("CustomLlamaAttention");
  REQUIRE(custom);
  ScopedPatchMapping patch({{"LlamaAttention", *custom}}, false, bundled().registries.patches());
  const auto patched = load_on(c, kCuda);
  REQUIRE(patched->device().is_cuda());
  reference::check_forward(*patched, c);
  reference::check_generation(*patched, c);
  int64_t calls = 0;
  for (const auto& point : patched->patch_points()) {
    if (point.module->patch_record().class_name == "CustomLlamaAttention") calls += point.module->counters().at("calls");
  }
  CHECK(calls > 0);

  // A plugin class that runs on the CPU only is refused before the model moves.
  const auto cli = testutil::torchpatch_cli("run --model " + c.dir.string() + " --prompt-ids 1,2 --device cuda --plugin-dir " +
                                            (std::filesystem::path(TORCHPATCH_TEST_PLUGIN_DIR) / "derived_attention").string());
  INFO(cli.out);
  CHECK(cli.code == 1);
  CHECK_THAT(cli.out, Contains("DerivedLlamaAttention") && Contains("run on the CPU only"));
}

TEST_CASE("quantized blocks on CUDA are the CPU's, and their products agree", "[cuda][quantized]") {
  if (!cuda_or_skip()) return;
  const auto weight = at::randn({96, 256}, at::TensorOptions().dtype(at::kFloat)) / 16;
  for (const auto format : {nn::QuantFormat::kQ8_0, nn::QuantFormat::kQ4_0}) {
    INFO(nn::format_name(format));
    const auto blocks = nn::quantize(format, weight, "w");
    const auto on_gpu = blocks.to(kCuda);
    // Quantized on the GPU's tensor: the host's quantizer, the same bytes.
    CHECK(at::equal(nn::quantize(format, weight.to(kCuda), "w").cpu(), blocks));
    // Dequantized on the GPU: d * q is exact in float32, so bit for bit the CPU's.
    const auto dequantized = nn::dequantize(format, blocks, "w");
    CHECK(at::equal(nn::dequantize(format, on_gpu, "w").cpu(), dequantized));
    // Products: the decode kernel (1, 3 and 8 tokens) and prefill (dequantized, cuBLAS), against
    // x W^T in float64 from the same blocks. The CPU's kernels quantize x to Q8_0 first, so they are
    // compared with the same float64 product rather than with each other.
    for (const int64_t tokens : {1, 3, 8, 40}) {
      const auto x = at::randn({tokens, 256});
      const auto bias = at::randn({96});
      const auto expected = at::linear(x.to(at::kDouble), dequantized.to(at::kDouble), bias.to(at::kDouble));
      const auto y = nn::quant_linear(format, x.to(kCuda), on_gpu, 96, bias.to(kCuda));
      CHECK(testutil::close(fmt::format("{} x{} float32", nn::format_name(format), tokens), y, expected, {}, 1e-4, 1e-4));
      const auto y16 = nn::quant_linear(format, x.to(kCuda, at::kBFloat16), on_gpu, 96, bias.to(kCuda));
      CHECK(y16.scalar_type() == at::kBFloat16);
      CHECK(testutil::close(fmt::format("{} x{} bfloat16", nn::format_name(format), tokens), y16, expected, {}, 0.05, 0.02));
    }
  }
}

TEST_CASE("a quantized model loads, generates and saves its blocks on CUDA as on the CPU", "[cuda][quantized]") {
  if (!cuda_or_skip()) return;
  const Case c("llama_basic");
  for (const auto* format : {"q8_0", "q4_0"}) {
    INFO(format);
    PretrainedOptions options;
    options.registries = bundled().host.registries();
    options.config_overrides["quantization_config"] = {{"quant_method", "ggml"}, {"format", format}};
    const auto cpu = from_pretrained(c.dir, options);
    options.device = kCuda;
    const auto gpu = from_pretrained(c.dir, options);
    REQUIRE(gpu->device().is_cuda());
    // Both generate; the CPU quantizes activations to Q8_0 and the GPU does not, so their logits
    // differ by that rounding: within 5% of the logits' range here.
    const auto on_cpu = generate(*cpu, c.get("row0_input_ids"), {}, reference::reference_greedy());
    const auto on_gpu = generate(*gpu, c.get("row0_input_ids"), {}, reference::reference_greedy());
    const auto first_cpu = on_cpu.logits.front(), first_gpu = on_gpu.logits.front();
    const double range = (first_cpu.max() - first_cpu.min()).item<double>();
    CHECK(testutil::max_abs_diff(first_gpu, first_cpu) <= 0.05 * range);
    // Saved from the GPU: GGUF's blocks byte for byte as the CPU's model writes them.
    testutil::ScratchDir from_cpu("cuda-quant-cpu"), from_gpu("cuda-quant-gpu");
    checkpoint::save_pretrained(*cpu, from_cpu.path);
    checkpoint::save_pretrained(*gpu, from_gpu.path);
    const auto a = checkpoint::Checkpoint::open(from_cpu.path / "model.safetensors");
    const auto b = checkpoint::Checkpoint::open(from_gpu.path / "model.safetensors");
    REQUIRE(a.keys() == b.keys());
    for (const auto& key : a.keys()) {
      INFO(key);
      CHECK(at::equal(a.tensor(key), b.tensor(key)));
    }
  }
}

TEST_CASE("the CLI runs, generates and benchmarks on CUDA in bfloat16", "[cuda][cli]") {
  if (!cuda_or_skip()) return;
  const auto gen = testutil::torchpatch_cli("generate --preset tiny-llama --device cuda --dtype bfloat16 --prompt-ids 1,2,3 "
                                            "--max-new-tokens 6");
  INFO(gen.out);
  CHECK(gen.code == 0);
  const auto bench = testutil::torchpatch_cli("bench --preset tiny-llama --device cuda --dtype bfloat16 --repeats 1 "
                                              "--prompt-len 16 --decode-tokens 8 --json --no-fused");
  INFO(bench.out);
  CHECK(bench.code == 0);
  CHECK_THAT(bench.out, Contains("\"device\": \"cuda") && Contains("no CUDA graph") && Contains("quantized q4_0"));
  // --tp splits a model over processes whose collectives run on the CPU.
  const auto split = testutil::torchpatch_cli("run --tp 2 --preset tiny-llama --prompt-ids 1,2 --device cuda");
  INFO(split.out);
  CHECK(split.code == 1);
  CHECK_THAT(split.out, Contains("split over processes") && Contains("--device cpu"));
}
