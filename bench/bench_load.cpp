// Checkpoint loading benchmark. Generates a ~500 MB float32 Llama-shaped checkpoint (hidden 768,
// 12 layers, 12 heads, 4 KV heads, intermediate 2048, vocab 32000) if DIR lacks one, then measures,
// each in a fresh process so peak memory is its own:
//   read       read() the safetensors bytes from the page cache into memory (the baseline)
//   load       from_pretrained(DIR)
//   load-fused from_pretrained(DIR) with FusedQKVAttention patched in (q/k/v concatenated on load)
//   load-q8_0  from_pretrained(DIR) quantized to Q8_0 as it loads (the bundled plugin `quantized`)
//   idle       nothing: the resident memory of the process itself (LibTorch and this program)
// then, on DIR-q8_0 (that model saved as its blocks, generated if missing), read and load again: a
// quantized checkpoint's load against reading its bytes.
//   finite     the loader's finiteness check alone: aminmax over every tensor of the mapped file,
//              timed on a second pass, so the page faults a load pays anyway are not counted
// Every mode ends by reading every weight once (a sum), so lazily mapped pages are paid for too.
//
//   usage: bench_load DIR [--runs N]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/patching/scope.h"
#include "torchpatch/plugin_host.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

void generate(const fs::path& dir) {
  const auto config = torchpatch::ModelConfig::from_json(
      {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 768},
       {"intermediate_size", 2048}, {"num_hidden_layers", 12}, {"num_attention_heads", 12},
       {"num_key_value_heads", 4}, {"max_position_embeddings", 2048}},
      "bench config");
  auto model = torchpatch::construct_model(config);
  torchpatch::init_random_weights(*model, 7);
  torchpatch::checkpoint::save_pretrained(*model, dir);
}

double touch(const torchpatch::PretrainedModel& model) {
  double total = 0;
  for (const auto& p : model.parameters()) total += p.sum().item<double>();
  return total;
}

nlohmann::json q8_0_config() {
  return {{"quant_method", "ggml"}, {"format", "q8_0"}, {"modules_to_not_convert", nlohmann::json::array()}};
}

// "seconds checksum peak_rss_kb" of this process.
void print_measurement(double seconds, double checksum) {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  std::printf("%.6f %.6g %ld\n", seconds, checksum, usage.ru_maxrss);
}

// One measurement in this process.
int measure(const std::string& mode, const fs::path& dir, const fs::path& plugin_dir) {
  const auto start = Clock::now();
  double checksum = 0;
  if (mode == "idle") {  // the process alone: LibTorch loaded, nothing read
    checksum = 0;
  } else if (mode == "finite") {
    const auto file = torchpatch::checkpoint::SafetensorsFile::open(dir / "model.safetensors");
    const auto scan = [&] {
      double sum = 0;
      for (const auto& info : file->tensors()) {
        const auto [low, high] = at::aminmax(file->tensor(info.name));
        sum += low.item<double>() + high.item<double>();
      }
      return sum;
    };
    scan();  // maps every page
    const auto scan_start = Clock::now();
    checksum = scan();
    print_measurement(std::chrono::duration<double>(Clock::now() - scan_start).count(), checksum);
    return 0;
  } else if (mode == "read") {
    const auto file = dir / "model.safetensors";
    std::vector<char> bytes(fs::file_size(file));
    std::ifstream(file, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    // Same final pass as the loads: every float read once.
    checksum = at::from_blob(bytes.data() + bytes.size() % 4, {static_cast<int64_t>(bytes.size() / 4)}, at::kFloat)
                   .sum()
                   .item<double>();
  } else {
    std::optional<torchpatch::ApplyPatches> scope;
    static torchpatch::PluginHost host;
    host.load_file(plugin_dir / "quantized.so", torchpatch::PluginMode::Catalogue);  // quantized checkpoints
    torchpatch::PretrainedOptions options;
    if (mode == "load-q8_0") options.config_overrides["quantization_config"] = q8_0_config();
    if (mode == "load-fused") {
      host.load_file(plugin_dir / "fused_qkv_attention.so", torchpatch::PluginMode::Catalogue);
      scope.emplace(torchpatch::PatchMapping({{"LlamaAttention", *host.find_class("FusedQKVAttention")}}));
    }
    const auto plugin_time = Clock::now();
    auto model = torchpatch::from_pretrained(dir, options);
    checksum = touch(*model);
    print_measurement(std::chrono::duration<double>(Clock::now() - plugin_time).count(), checksum);
    return 0;
  }
  print_measurement(std::chrono::duration<double>(Clock::now() - start).count(), checksum);
  return 0;
}

struct Result {
  double seconds = 0;
  double peak_mb = 0;
};

Result run_child(const std::string& self, const std::string& mode, const fs::path& dir) {
  const std::string command = fmt::format("'{}' --measure {} '{}'", self, mode, dir.string());
  FILE* pipe = ::popen(command.c_str(), "r");
  double seconds = -1, checksum = 0;
  long peak_kb = 0;
  if (!pipe || std::fscanf(pipe, "%lf %lf %ld", &seconds, &checksum, &peak_kb) != 3) {
    throw std::runtime_error("measurement failed: " + mode);
  }
  ::pclose(pipe);
  return {seconds, peak_kb * 1024.0 / 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const fs::path plugin_dir = self.parent_path().parent_path() / "lib" / "torchpatch" / "plugins";
  if (argc == 4 && std::string(argv[1]) == "--measure") return measure(argv[2], argv[3], plugin_dir);
  if (argc != 2 && argc != 4) {
    std::cerr << "usage: bench_load DIR [--runs N]\n";
    return 2;
  }
  const fs::path dir = argv[1];
  const int runs = argc == 4 ? std::stoi(argv[3]) : 5;
  if (!fs::exists(dir / "model.safetensors")) {
    std::cout << "generating " << dir << " ...\n";
    generate(dir);
  }
  const double size_mb = fs::file_size(dir / "model.safetensors") / 1e6;
  std::cout << fmt::format("checkpoint: {:.0f} MB, best of {} runs each, page cache warm\n", size_mb, runs);

  std::map<std::string, Result> best;
  const auto timed = [&](const std::string& mode, const fs::path& where, const std::string& label) {
    run_child(self, mode, where);  // warm-up: page cache and code
    Result result{1e9, 0};
    for (int i = 0; i < runs; ++i) {
      const auto r = run_child(self, mode, where);
      result.seconds = std::min(result.seconds, r.seconds);
      result.peak_mb = std::max(result.peak_mb, r.peak_mb);
    }
    best[label] = result;
    std::cout << fmt::format("  {:<15} {:7.3f} s   peak RSS {:6.0f} MB\n", label, result.seconds, result.peak_mb);
  };
  for (const std::string mode : {"idle", "read", "finite", "load", "load-fused", "load-q8_0"}) timed(mode, dir, mode);
  const fs::path quantized_dir = dir.string() + "-q8_0";
  if (!fs::exists(quantized_dir / "model.safetensors")) {
    torchpatch::PluginHost host;
    host.load_file(plugin_dir / "quantized.so", torchpatch::PluginMode::Catalogue);
    torchpatch::PretrainedOptions options;
    options.config_overrides["quantization_config"] = q8_0_config();
    torchpatch::checkpoint::save_pretrained(*torchpatch::from_pretrained(dir, options), quantized_dir);
  }
  std::cout << fmt::format("quantized checkpoint {}: {:.0f} MB\n", quantized_dir.string(),
                           fs::file_size(quantized_dir / "model.safetensors") / 1e6);
  timed("read", quantized_dir, "q8_0 read");
  timed("load", quantized_dir, "q8_0 load");
  const double read = best["read"].seconds;
  std::cout << fmt::format("load / read:        {:.2f}x (target <= 1.5)\n", best["load"].seconds / read);
  std::cout << fmt::format("finiteness check:   {:.0f} ms of a {:.0f} ms load ({:.0f}%; pages mapped already)\n",
                           best["finite"].seconds * 1e3, best["load"].seconds * 1e3,
                           100 * best["finite"].seconds / best["load"].seconds);
  std::cout << fmt::format("peak RSS / size:    {:.2f}x (target <= 1.3); without the process's own {:.0f} MB: {:.2f}x\n",
                           best["load"].peak_mb / size_mb, best["idle"].peak_mb,
                           (best["load"].peak_mb - best["idle"].peak_mb) / size_mb);
  std::cout << fmt::format("fused / plain load: {:.2f}x (target <= 1.10)\n", best["load-fused"].seconds / best["load"].seconds);
  std::cout << fmt::format("quantize on load:   {:.2f}x the float load\n", best["load-q8_0"].seconds / best["load"].seconds);
  std::cout << fmt::format("q8_0 load / read:   {:.2f}x (target <= 1.2)\n", best["q8_0 load"].seconds / best["q8_0 read"].seconds);
  return 0;
}
