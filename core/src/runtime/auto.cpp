#include "torchpatch/runtime/auto.h"
#include "torchpatch/runtime/gguf_model.h"

#include <atomic>
#include <cmath>
#include <optional>

#include <unistd.h>  // getpid

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/checkpoint/load.h"
#include "torchpatch/dist/process_group.h"
#include "torchpatch/device.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/patching/scope.h"
#include "torchpatch/models/family.h"
#include "base/huge_pages.h"

namespace torchpatch {

std::shared_ptr<PretrainedModel> construct_model(const ModelConfig& config, const Registries& registries) {
  const auto family = family_of(config.model_type, "config", registries.families());
  std::string cls = family->default_class;
  const auto& arch = config.raw.find("architectures");
  if (arch != config.raw.end() && arch->is_array() && !arch->empty() && arch->front().is_string()) {
    const auto name = arch->front().get<std::string>();
    if (family->model_classes.count(name)) cls = name;
  }
  const PatchMapping* active = active_patch_mapping();
  if (auto quantized = quantized_mapping(config, registries, active ? *active : PatchMapping{})) {
    ApplyPatches scope(std::move(*quantized), active ? active_patch_tables() : registries.patch_tables());
    return family->model_classes.at(cls)(config);
  }
  if (active) return family->model_classes.at(cls)(config);
  ApplyPatches unpatched(PatchMapping{}, registries.patch_tables());
  return family->model_classes.at(cls)(config);
}

const nlohmann::json* quantization_config(const ModelConfig& config) {
  auto it = config.raw.find("quantization_config");
  if (it == config.raw.end() || it->is_null()) return nullptr;
  if (!it->is_object()) throw ConfigError(fmt::format("quantization_config: expected an object, got {}", it->dump()));
  return &*it;
}

std::optional<PatchMapping> quantized_mapping(const ModelConfig& config, const Registries& registries,
                                              const PatchMapping& base) {
  const auto* q = quantization_config(config);
  if (!q) return std::nullopt;
  const auto field = q->find("quant_method");
  const std::string name = field != q->end() && field->is_string() ? field->get<std::string>() : "";
  const auto method = registries.families().quantization_method(name);
  if (!method) {
    const auto known = registries.families().quantization_methods();
    throw ConfigError(fmt::format("quantization_config.quant_method '{}' is not known here ({}; the bundled plugin "
                                  "'quantized' provides 'ggml')",
                                  name, known.empty() ? "none is loaded" : fmt::format("known: {}", fmt::join(known, ", "))));
  }
  PatchMapping mapping = base;
  PatchMapping::Items added;
  for (auto& item : method->patches(*q)) {
    if (item.second.origin.builtin()) item.second.origin = method->origin;  // the plugin that provides them
    if (!mapping.contains(item.first)) added.push_back(std::move(item));  // what the user mapped stays theirs
  }
  mapping.insert(added, /*overwrite=*/false, &registries.classes());
  return mapping;
}

std::shared_ptr<PretrainedModel> from_config(const ModelConfig& config, const Registries& registries) {
  if (active_patch_mapping()) return construct_model(config, registries);
  ApplyPatches scope(registries.patches().get_patch_mapping(), registries.patch_tables());
  return construct_model(config, registries);
}

ModelConfig with_overrides(const ModelConfig& config, const nlohmann::json& overrides, const std::string& source,
                           const Registries& registries) {
  if (overrides.empty()) return config;
  auto raw = config.raw;
  raw.update(overrides);
  return ModelConfig::from_json(raw, source, &registries.families());
}

namespace {

std::string format_bytes(double bytes) {
  if (bytes >= 1e15) return fmt::format("{:.3g} PB", bytes / 1e15);
  if (bytes >= 1e12) return fmt::format("{:.3g} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.3g} GB", bytes / 1e9);
  return fmt::format("{:.3g} MB", bytes / 1e6);
}

// A preset's random weights are drawn in float32 on the host before dtype and device apply, so its
// parameters, counted exactly once built (untouched, under SkipInit), must fit the host's memory as
// float32: the lower bound checked before building leaves out what a model adds beyond it.
void check_preset_memory(const PretrainedModel& model, const PretrainedOptions& options, const std::string& source) {
  if (!options.check_memory) return;
  double parameters = 0;
  for (const auto& p : model.parameters()) parameters += static_cast<double>(p.numel());
  const double memory = device_memory_bytes(c10::Device(c10::kCPU));
  if (memory > 0 && parameters * 4 > memory) {
    throw ConfigError(fmt::format("{}: its {:.4g} parameters need {} as float32 while their random weights are drawn "
                                  "(before --dtype and --device apply), more than this machine's {} of memory "
                                  "(--no-memory-check / PretrainedOptions::check_memory = false builds it anyway)",
                                  source, parameters, format_bytes(parameters * 4), format_bytes(memory)));
  }
}

// Before anything is allocated: the parameters a config implies must fit the machine's memory and,
// loading strictly, the checkpoint that is to fill them.
void check_model_size(const ModelConfig& config, const checkpoint::Checkpoint* weights, const PretrainedOptions& options,
                      const std::string& source) {
  const double parameters = config.decoder.parameter_lower_bound();
  if (weights && options.strict) {
    double stored = 0;
    // Quantized blocks hold more weights than bytes: at most 32 in 18 (Q4_0, the densest format).
    const double per_byte = quantization_config(config) ? 32.0 / 18.0 : 1.0;
    for (const auto& key : weights->keys()) {
      const auto& info = weights->info(key);
      double n = info.dtype == checkpoint::Dtype::U8 ? per_byte : 1.0;
      for (const int64_t d : info.shape) n *= static_cast<double>(d);
      stored += n;
    }
    if (parameters > stored * 1.01 + 4096) {
      throw ConfigError(fmt::format("{}: describes a model of at least {:.4g} parameters, but the checkpoint's tensors "
                                    "hold {:.4g} values in all: a size or count in it is wrong; most of them are {} "
                                    "(checked before building anything; non-strict loading skips this check)",
                                    source, parameters, stored, config.decoder.largest_size_term()));
    }
  }
  if (!options.check_memory) return;
  // On a GPU the parameters live in its memory: the host holds them only untouched, while they move.
  const double element = static_cast<double>(c10::elementSize(options.dtype.value_or(at::kFloat)));
  const double memory = device_memory_bytes(options.device);
  if (memory > 0 && parameters * element > memory) {
    throw ConfigError(fmt::format("{}: a model of at least {:.4g} parameters needs {} as {}, more than {} {} of "
                                  "memory; most of them are {} (checked before building anything; "
                                  "--no-memory-check / PretrainedOptions::check_memory = false builds it anyway)",
                                  source, parameters, format_bytes(parameters * element),
                                  c10::toString(options.dtype.value_or(at::kFloat)),
                                  device_memory_owner(options.device), format_bytes(memory),
                                  config.decoder.largest_size_term()));
  }
}

}  // namespace

void check_device_support(const PretrainedModel& model, c10::Device device) {
  if (!device.is_cpu() && dist::active_group()) {
    throw DeviceError(fmt::format("{} cannot run on {} split over processes: their collectives run over Gloo on the "
                                  "CPU; use --device cpu with --tp (or torchrun)",
                                  model.class_name(), device.str()));
  }
  std::vector<std::string> refused;
  size_t count = 0;
  for (const auto& point : model.patch_points()) {
    const auto& record = point.module->patch_record();
    if (runs_on(record.devices, record.origin.builtin(), device.type())) continue;
    if (++count <= 4) refused.push_back(fmt::format("{} ({}, {})", point.path, record.class_name, record.origin.describe()));
  }
  if (refused.empty()) return;
  throw DeviceError(fmt::format(
      "{} cannot run on {}: {}{} run on the CPU only. A plugin's class runs on the CPU unless it declares its "
      "devices (ModuleClass::devices, docs/cuda.md); use --device cpu, or leave the patch out",
      model.class_name(), device.str(), fmt::join(refused, "; "),
      count > refused.size() ? fmt::format(" and {} more modules", count - refused.size()) : ""));
}

namespace {
// The model in the options' dtype on the options' device, in one pass (no float32 copy on the device).
void place(PretrainedModel& model, const PretrainedOptions& options) {
  check_device_support(model, options.device);
  if (!options.device.is_cpu()) {
    if (options.dtype) {
      model.to(options.device, *options.dtype);
    } else {
      model.to(options.device);
    }
  } else if (options.dtype) {
    model.to(*options.dtype);  // a module may override to(dtype) alone
  }
}
}  // namespace

namespace {

// Builds the model `config` describes and loads `weights` into it, as from_pretrained does.
std::shared_ptr<PretrainedModel> build_and_load(const ModelConfig& config, const checkpoint::Checkpoint& weights,
                                                const PretrainedOptions& options, const std::string& source,
                                                checkpoint::LoadReport* report) {
  const auto& registries = options.registries;
  check_model_size(config, &weights, options, source);
  std::optional<nn::GgufBlocksOnly> gpu_layout;  // quantized weights built and loaded as a GPU reads them
  if (!options.device.is_cpu()) gpu_layout.emplace();
  std::shared_ptr<PretrainedModel> model;
  {
    nn::SkipInit skip;  // the checkpoint provides the values (the report says what it did not)
    model = from_config(config, registries);
  }
  place(*model, options);
  auto result = checkpoint::load_weights(
      *model, weights, checkpoint::LoadOptions{options.strict, &registries.conversions(), options.reject_non_finite,
                                               options.copy_weights, options.progress});
  if (report) *report = std::move(result);
  return model;
}

// A GGUF file: its metadata read as config.json by the family of its architecture, its tensors as
// the hub's.
std::shared_ptr<PretrainedModel> from_gguf(const std::filesystem::path& file, const PretrainedOptions& options,
                                           checkpoint::LoadReport* report) {
  const auto& registries = options.registries;
  const auto gguf = read_gguf_model(file, registries.families(), options.dequantize);
  const auto config = with_overrides(ModelConfig::from_json(gguf.config, file.string(), &registries.families()),
                                     options.config_overrides, file.string() + " (with overrides)", registries);
  auto model = build_and_load(config, checkpoint::Checkpoint::of(gguf.tensors, file), options, file.string(), report);
  if (!options.dequantize) decode_tied_weights_from_blocks(*model, gguf);  // declined off the CPU or in another dtype
  return model;
}

}  // namespace

std::shared_ptr<PretrainedModel> from_pretrained(const std::filesystem::path& dir, const PretrainedOptions& options,
                                                 checkpoint::LoadReport* report) {
  check_device(options.device);
  const auto& registries = options.registries;
  if (const auto gguf = checkpoint::gguf_file_of(dir)) return from_gguf(*gguf, options, report);
  // Config and weights through one directory handle: its shared lock keeps a save from switching its
  // files in between the two. The weights are memory-mapped, so the handle goes before the build.
  const bool is_dir = std::filesystem::is_directory(dir);
  const auto config_path = is_dir ? dir / "config.json" : dir;
  std::optional<checkpoint::DirectoryHandle> handle;
  if (is_dir) handle = checkpoint::DirectoryHandle::open(dir);
  const auto config = with_overrides(
      handle ? ModelConfig::from_file(handle->file("config.json"), &registries.families(), config_path.string())
             : ModelConfig::from_file(dir, &registries.families()),
      options.config_overrides, config_path.string() + " (with overrides)", registries);
  const auto weights = handle ? checkpoint::Checkpoint::open(*handle) : checkpoint::Checkpoint::open(dir.parent_path());
  handle.reset();
  return build_and_load(config, weights, options, config_path.string(), report);
}

namespace {
// Built-in models with fixed shapes, from every family: tiny ones for demos and tests, larger ones
// for benchmarks.
std::vector<std::pair<std::string, nlohmann::json>> presets(const Registries& registries) {
  std::vector<std::pair<std::string, nlohmann::json>> all;
  for (const auto& family : registries.families().all()) {
    all.insert(all.end(), family->presets.begin(), family->presets.end());
  }
  return all;
}
}  // namespace

std::vector<std::string> preset_names(const Registries& registries) {
  std::vector<std::string> names;
  for (const auto& [name, json] : presets(registries)) names.push_back(name);
  return names;
}

ModelConfig preset_config(const std::string& name, const Registries& registries) {
  for (const auto& [preset, json] : presets(registries)) {
    if (preset == name) return ModelConfig::from_json(json, "preset " + name, &registries.families());
  }
  throw ConfigError(
      fmt::format("unknown preset '{}' (presets: {})", name, fmt::join(preset_names(registries), ", ")));
}

namespace {

std::atomic<int> next_preset_dir{0};  // one directory per build, whatever the threads

// A quantized or tensor-parallel preset: the float preset's random weights, saved and loaded back
// through the classes' conversion rules, so it holds exactly what quantizing or sharding the float
// preset gives (random weights drawn for a shard's shape would be other numbers).
std::shared_ptr<PretrainedModel> reloaded_preset(const std::string& name, uint64_t seed, const PretrainedOptions& options) {
  auto float_options = options;
  float_options.config_overrides.erase("quantization_config");
  float_options.dtype.reset();
  float_options.device = c10::Device(c10::kCPU);
  std::optional<dist::ActiveGroup> whole;  // the float preset unsharded, saved in the hub layout
  if (dist::active_group()) whole.emplace(nullptr);
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("torchpatch-preset-{}-{}-{}", name, ::getpid(), next_preset_dir++);
  struct Remove {
    std::filesystem::path dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{dir};
  checkpoint::save_pretrained(*preset_model(name, seed, float_options), dir,
                              checkpoint::SaveOptions{int64_t{5} * 1000 * 1000 * 1000, &options.registries.conversions()});
  whole.reset();
  return from_pretrained(dir, options);
}

}  // namespace

std::shared_ptr<PretrainedModel> preset_model(const std::string& name, uint64_t seed, const PretrainedOptions& options) {
  check_device(options.device);
  const auto& registries = options.registries;
  auto config = with_overrides(preset_config(name, registries), options.config_overrides, "preset " + name, registries);
  check_model_size(config, nullptr, options, "preset " + name);
  if (quantization_config(config) || dist::active_group()) return reloaded_preset(name, seed, options);
  std::shared_ptr<PretrainedModel> model;
  {
    nn::SkipInit untouched;  // init_random_weights writes every parameter
    model = from_config(config, registries);
  }
  check_preset_memory(*model, options, "preset " + name);
  init_random_weights(*model, seed);
  place(*model, options);
  return model;
}

void init_random_weights(torch::nn::Module& model, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const auto& name = item.key();
    auto& p = item.value();
    auto noise = at::normal(0.0, 1.0, p.sizes(), gen, p.options());
    const bool norm = name.find("norm") != std::string::npos || name.find("LayerNorm") != std::string::npos;
    at::Tensor value;
    if (norm && p.dim() == 1 && name.compare(name.size() - 5, 5, ".bias") != 0) {
      value = 1.0 + 0.1 * noise;
    } else if (name.find("embed") != std::string::npos || p.dim() < 2) {
      value = p.dim() < 2 ? 0.1 * noise : noise;
    } else {
      value = noise / std::sqrt(static_cast<double>(p.size(1)));
    }
    // Large weights in huge pages, as a loaded checkpoint's are: decoding streams every weight once a
    // token, and in 4 KiB pages the TLB misses cost a float32 preset a sixth of its decode speed.
    if (p.device().is_cpu() && p.is_contiguous()) {
      p.set_data(base::empty_in_huge_pages(p.sizes(), p.options()).copy_(value));
    } else {
      p.copy_(value);
    }
  }
}

}  // namespace torchpatch
