// GGUF files: every metadata type and block format against files and values made by the `gguf`
// package (tests/data/gguf*/make_*.py), hostile files refused with the field named, and the
// writer read back byte for byte.
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"
#include "random_blocks.h"

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/gguf.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/quant.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/plugin_host.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/runtime/gguf_model.h"
#include "torchpatch/text/tokenizer.h"

using namespace torchpatch;
using namespace torchpatch::checkpoint;
using Catch::Matchers::Contains;

namespace {

std::filesystem::path gguf_data(const std::string& name) { return testutil::data_dir() / "gguf" / name; }

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Builds GGUF bytes field by field, hostile ones included.
struct GgufBytes {
  std::vector<uint8_t> bytes;
  template <class T>
  GgufBytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& header(uint32_t version, uint64_t tensors, uint64_t values) {
    bytes.insert(bytes.end(), {'G', 'G', 'U', 'F'});
    return put(version).put(tensors).put(values);
  }
  GgufBytes& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(4).put(v); }
  // A tensor entry of `dims` (GGUF order) and `type` at `offset`.
  GgufBytes& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(dims.size());
    for (const auto d : dims) put(d);
    return put(type).put(offset);
  }
  GgufBytes& pad(size_t alignment = 32) {
    bytes.resize((bytes.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }
  std::filesystem::path write(const std::string& name) const {
    const auto path = testutil::temp_file(name + ".gguf");
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return path;
  }
};

#define REQUIRE_GGUF_ERROR(path, text)                                                       \
  do {                                                                                       \
    const auto file_ = (path);                                                               \
    INFO("file " << file_.string());                                                         \
    REQUIRE_THROWS_WITH(GgufFile::open(file_), Contains(file_.string()) && Contains(text)); \
    std::filesystem::remove(file_);                                                          \
  } while (false)

}  // namespace

TEST_CASE("GGUF: every block format dequantizes bit for bit as the gguf package does", "[gguf][quant]") {
  const auto ref = SafetensorsFile::open(testutil::data_dir() / "gguf_blocks" / "blocks.safetensors");
  const auto manifest = read_json(testutil::data_dir() / "gguf_blocks" / "manifest.json");
  int formats = 0;
  for (const auto& [name, info] : manifest["types"].items()) {
    const auto* type = ggml_type_named(name);
    REQUIRE(type != nullptr);
    CHECK(type->block_size == info["block_size"].get<int64_t>());
    CHECK(type->type_size == info["type_size"].get<int64_t>());
    const auto blocks = ref->tensor(name + ".blocks").contiguous();
    const auto expected = ref->tensor(name + ".values").contiguous();
    auto values = at::empty_like(expected);
    dequantize_ggml(type->type, blocks.data_ptr<uint8_t>(), expected.numel(), values.data_ptr<float>());
    const bool same = std::memcmp(values.data_ptr(), expected.data_ptr(), expected.nbytes()) == 0;
    std::cout << name << ": " << blocks.size(0) << " blocks, max abs diff = "
              << (values - expected).abs().max().item<double>() << (same ? " (bit for bit)" : " (BITS DIFFER)") << "\n";
    CHECK(same);
    ++formats;
  }
  CHECK(formats == 12);  // F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K
}

TEST_CASE("GGUF: versions 2 and 3 read every metadata type and tensor the gguf package wrote", "[gguf]") {
  const auto expected = read_json(gguf_data("all_types_v3.json"));
  for (const auto* name : {"all_types_v3.gguf", "all_types_v2.gguf"}) {
    INFO(name);
    const auto file = GgufFile::open(gguf_data(name));
    CHECK(file->version() == (std::string(name).find("v2") != std::string::npos ? 2u : 3u));
    REQUIRE(file->metadata().size() == expected["metadata"].size());
    size_t i = 0;
    const std::function<void(const GgufValue&, const nlohmann::json&, const std::string&)> same =
        [&](const GgufValue& v, const nlohmann::json& e, const std::string& type) {
          CHECK(std::string(gguf_type_name(v.type)) == type);
          if (type == "ARRAY") {
            REQUIRE(v.array.size() == e.size());
            return;
          }
          if (type == "STRING") CHECK(v.text == e.get<std::string>());
          else if (type == "BOOL") CHECK(v.boolean == e.get<bool>());
          else if (type == "FLOAT32" || type == "FLOAT64") CHECK(v.real == e.get<double>());
          else if (v.is_signed()) CHECK(static_cast<int64_t>(v.integer) == e.get<int64_t>());
          else CHECK(v.integer == e.get<uint64_t>());
        };
    for (const auto& entry : expected["metadata"]) {
      const auto& [key, value] = file->metadata()[i++];
      INFO("key " << key);
      CHECK(key == entry["key"].get<std::string>());
      same(value, entry["value"], entry["type"].get<std::string>());
      if (entry["type"] == "ARRAY" && entry.contains("element_type") && entry["element_type"] != "ARRAY") {
        CHECK(std::string(gguf_type_name(value.element_type)) == entry["element_type"].get<std::string>());
        for (size_t k = 0; k < value.array.size(); ++k) same(value.array[k], entry["value"][k], entry["element_type"]);
      }
    }
    REQUIRE(file->tensors().size() == expected["tensors"].size());
    for (const auto& t : expected["tensors"]) {
      const auto name_t = t["name"].get<std::string>();
      INFO("tensor " << name_t);
      const auto* info = file->find(name_t);
      REQUIRE(info != nullptr);
      CHECK(std::string(ggml_type_info(info->type).name) == t["type"].get<std::string>());
      CHECK(info->shape() == t["shape_torch"].get<std::vector<int64_t>>());
      const auto values = file->tensor(name_t).flatten();
      const auto want = t["values"].get<std::vector<float>>();
      REQUIRE(values.numel() == static_cast<int64_t>(want.size()));
      CHECK(std::memcmp(values.data_ptr<float>(), want.data(), want.size() * 4) == 0);
    }
  }
}

TEST_CASE("GGUF: save_gguf writes what reads back byte for byte", "[gguf]") {
  const auto original = GgufFile::open(gguf_data("all_types_v3_flat.gguf"));
  std::vector<GgufTensorToWrite> tensors;
  for (const auto& t : original->tensors()) {
    auto shape = t.shape();
    tensors.push_back({t.name, t.type, shape, original->raw(t.name)});
  }
  const auto copy_path = testutil::temp_file("copy.gguf");
  save_gguf(copy_path, original->metadata(), tensors);
  const auto copy = GgufFile::open(copy_path);
  REQUIRE(copy->metadata().size() == original->metadata().size());
  for (const auto& t : original->tensors()) {
    CHECK(at::equal(copy->raw(t.name), original->raw(t.name)));
  }
  // The gguf package writes the same layout: the files are identical.
  std::ifstream a(gguf_data("all_types_v3_flat.gguf"), std::ios::binary), b(copy_path, std::ios::binary);
  const std::string bytes_a((std::istreambuf_iterator<char>(a)), {}), bytes_b((std::istreambuf_iterator<char>(b)), {});
  CHECK(bytes_a == bytes_b);
  std::filesystem::remove(copy_path);
}

TEST_CASE("GGUF: every truncation of a file is refused with the file named, never read past its end", "[gguf][hardening]") {
  std::ifstream in(gguf_data("all_types_v3.gguf"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // The file ends in padding after its last tensor: every cut before that tensor's end must be refused.
  uint64_t data_end = 0;
  const auto whole = GgufFile::open(gguf_data("all_types_v3.gguf"));
  for (const auto& t : whole->tensors()) data_end = std::max(data_end, t.end);
  REQUIRE(data_end <= bytes.size());
  const auto path = testutil::temp_file("truncated.gguf");
  int refused = 0;
  for (size_t n = 0; n < data_end; n += (n < 200 ? 1 : 7)) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(n));
    try {
      GgufFile::open(path);
      FAIL("a file cut at byte " << n << " of " << bytes.size() << " was read");
    } catch (const CheckpointError& e) {
      CHECK_THAT(e.what(), Contains(path.string()));
      ++refused;
    }
  }
  std::filesystem::remove(path);
  CHECK(refused > 200);
}

TEST_CASE("GGUF: hostile headers are refused naming the field and the cause", "[gguf][hardening]") {
  auto not_gguf = GgufBytes().header(3, 0, 0);
  not_gguf.bytes[0] = 'X';
  REQUIRE_GGUF_ERROR(not_gguf.write("magic"), "not a GGUF file");
  REQUIRE_GGUF_ERROR(GgufBytes().header(1, 0, 0).write("v1"), "GGUF version 1");
  REQUIRE_GGUF_ERROR(GgufBytes().header(4, 0, 0).write("v4"), "GGUF version 4");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, uint64_t{1} << 60, 0).write("count"), "the tensor count is 1152921504606846976");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 0, 1).str("k").put<uint32_t>(8).put<uint64_t>(~uint64_t{0}).write("string"),
                     "metadata 'k': a string of 18446744073709551615 bytes");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 0, 1).str("k").put<uint32_t>(13).write("type"), "unknown value type 13");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1000000).write("array"),
                     "the array's length is 1000000");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).write("duplicate"), "metadata 'k': the key is given twice");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 0, 1).str("b").put<uint32_t>(7).put<uint8_t>(2).write("bool"), "a BOOL holds 2");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 0, 1).kv_u32("general.alignment", 24).write("alignment"),
                     "'general.alignment' must be a UINT32 power of two");
  // Arrays of arrays nested past any writer's use.
  auto nested = GgufBytes().header(3, 0, 1).str("n").put<uint32_t>(9);
  for (int i = 0; i < 8; ++i) nested.put<uint32_t>(9).put<uint64_t>(1);
  REQUIRE_GGUF_ERROR(nested.write("nested"), "arrays nested more than 4 deep");
}

TEST_CASE("GGUF: lying tensor entries are refused naming the tensor", "[gguf][hardening]") {
  const auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data) {
    return GgufBytes().header(3, 1, 0).tensor("w", std::move(dims), type, offset).pad().zeros(data);
  };
  REQUIRE_GGUF_ERROR(one({32, 2}, 8, 0, 40).write("short"), "tensor 'w' (Q8_0 [32, 2]): its 68 bytes at offset 0 run past");
  REQUIRE_GGUF_ERROR(one({32, 1}, 8, 16, 64).write("misaligned"), "offset 16 is not a multiple of the alignment 32");
  REQUIRE_GGUF_ERROR(one({33}, 8, 0, 64).write("partial"), "first dimension 33 is not a multiple of Q8_0's block of 32");
  REQUIRE_GGUF_ERROR(one({32}, 20, 0, 64).write("iq4"), "GGML type 20 is not one torchpatch reads");
  REQUIRE_GGUF_ERROR(one({1, 1, 1, 1, 1}, 0, 0, 64).write("dims"), "5 dimensions (GGUF allows 1 to 4)");
  REQUIRE_GGUF_ERROR(one({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 64).write("huge"), "multiply past 2^63");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().zeros(128).write("overlap"),
                     "tensor 'b': data [32, 96) overlaps tensor 'a' at [0, 64)");
  REQUIRE_GGUF_ERROR(GgufBytes().header(3, 2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad().zeros(64).write("twice"),
                     "tensor 'a': the name is given twice");
  // A well-formed one reads: the entries above differ from it in one field each.
  const auto fine = one({32, 2}, 8, 0, 68).write("fine");
  CHECK(GgufFile::open(fine)->raw("w").sizes() == at::IntArrayRef({2, 34}));
  std::filesystem::remove(fine);
}

TEST_CASE("GGUF: a Llama written as llama.cpp writes one loads as the checkpoint it came from", "[gguf][reference]") {
  // llama_basic.gguf: tests/data/llama_basic by the gguf package, q/k rows permuted (make_llama_basic_gguf.py).
  const auto from_gguf = from_pretrained(gguf_data("llama_basic.gguf"));
  const auto from_hub = from_pretrained(testutil::data_dir() / "llama_basic");
  CHECK(from_gguf->class_name() == "LlamaForCausalLM");
  CHECK(from_gguf->config().to_json()["num_key_value_heads"] == 2);
  const auto hub = from_hub->named_parameters();
  for (const auto& p : from_gguf->named_parameters()) {
    INFO(p.key());
    CHECK(at::equal(p.value(), hub[p.key()]));
  }
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = at::arange(3, 15, at::kLong).unsqueeze(0);
  CHECK(testutil::close("llama_basic.gguf logits", from_gguf->forward(in).logits, from_hub->forward(in).logits, {}, 0, 0));
  // Its tokenizer: byte-level BPE with the file's merges ("Ġthe" is one token), no BOS added.
  const auto tokenizer = tokenizer_of(gguf_data("llama_basic.gguf"));
  const auto ids = tokenizer.encode("the theater").ids;
  CHECK(tokenizer.decode(ids) == "the theater");
  const auto the = tokenizer.token_to_id("Ġthe");
  REQUIRE(the.has_value());
  CHECK(std::count(ids.begin(), ids.end(), *the) == 1);
  CHECK(tokenizer.bos_token_id() == 1);
}

namespace {

// Logits of the reference case's padded batch (at real tokens) and of each row alone, within the
// manifest's tolerance; prints each max difference.
void check_reference_logits(PretrainedModel& model, const std::string& name, const nlohmann::json& entry) {
  const auto ref = SafetensorsFile::open(testutil::data_dir() / entry["reference"].get<std::string>() /
                                         "reference.safetensors");
  const auto atol = entry["atol"].get<double>(), rtol = entry["rtol"].get<double>();
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = ref->tensor("input_ids");
  in.attention_mask = ref->tensor("attention_mask");
  in.position_ids = ref->tensor("position_ids");
  CHECK(testutil::close(name + " logits", model.forward(in).logits, ref->tensor("logits"), in.attention_mask, atol,
                        rtol));
  for (const std::string row : {"row0_", "row1_"}) {
    ModelInputs alone;
    alone.input_ids = ref->tensor(row + "input_ids");
    CHECK(testutil::close(name + " " + row + "logits", model.forward(alone).logits, ref->tensor(row + "logits"), {},
                          atol, rtol));
  }
}

// Two metadata values alike: numbers by value (a UINT32 and an INT32 16 are the same), the rest by type and content.
bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != GgufType::BOOL && b.type != GgufType::BOOL && a.as_number() && b.as_number()) {
    return *a.as_number() == *b.as_number();
  }
  if (a.type != b.type) return false;
  if (a.type == GgufType::STRING) return a.text == b.text;
  if (a.type == GgufType::BOOL) return a.boolean == b.boolean;
  if (a.type != GgufType::ARRAY || a.array.size() != b.array.size()) return false;
  for (size_t i = 0; i < a.array.size(); ++i) {
    if (!same_value(a.array[i], b.array[i])) return false;
  }
  return true;
}

// `ours` holds every tensor of `theirs` (and no other) with the same type, shape and bytes, and every
// key of the architecture that `theirs` has, with the same value, but for the keys of `overridden`
// (key: value), which a config override gave the value there (as float32 where a number).
void check_same_file(const GgufFile& ours, const GgufFile& theirs, const nlohmann::json& overridden) {
  CHECK(ours.tensors().size() == theirs.tensors().size());
  for (const auto& t : theirs.tensors()) {
    INFO("tensor " << t.name);
    const auto* mine = ours.find(t.name);
    REQUIRE(mine != nullptr);
    CHECK(mine->type == t.type);
    CHECK(mine->dims == t.dims);
    CHECK(at::equal(ours.raw(t.name), theirs.raw(t.name)));
  }
  const auto arch = theirs.find_value("general.architecture")->text;
  CHECK(ours.find_value("general.architecture")->text == arch);
  for (const auto& [key, value] : theirs.metadata()) {
    if (key.rfind(arch + ".", 0) != 0) continue;
    INFO("metadata " << key);
    const auto* mine = ours.find_value(key);
    REQUIRE(mine != nullptr);
    const auto expected = overridden.contains(key) ? GgufValue::of(overridden[key].get<float>()) : value;
    CHECK(same_value(*mine, expected));
  }
}

}  // namespace

TEST_CASE("GGUF: llama.cpp's converter's files load as the reference checkpoints and save back byte for byte",
          "[gguf][reference]") {
  // tests/data/gguf/converted: the reference checkpoints of several families as llama.cpp's own
  // converter writes them (make_converted_gguf.py); manifest.json says which case each file is.
  const auto dir = gguf_data("converted");
  static PluginHost host;  // Phi-3's family comes from the bundled phi3 plugin
  static const bool loaded = (host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue), true);
  (void)loaded;
  const auto manifest = read_json(dir / "manifest.json");
  REQUIRE(!manifest["cases"].empty());
  for (const auto& entry : manifest["cases"]) {
    const std::string name = entry["case"];
    INFO("case " << name);
    const auto file = dir / entry["file"].get<std::string>();
    const auto hub_config = read_json(testutil::data_dir() / entry["reference"].get<std::string>() / "config.json");
    // The config llama.cpp runs the file with, before any override.
    const auto read = read_gguf_model(file, default_registries().families());
    auto config = ModelConfig::from_json(read.config, file.string()).to_json();  // the family's fields
    for (const auto& [field, value] : read.config.items()) {
      if (!config.contains(field)) config[field] = value;  // and config.json's own (head_dim)
    }
    const auto from_file = entry.value("config_from_file", nlohmann::json::object());
    for (const auto& [field, value] : from_file.items()) {
      INFO("config field " << field);
      REQUIRE(config.contains(field));
      CHECK(config.at(field) == value);
    }
    PretrainedOptions options;
    options.config_overrides = entry.value("config_overrides", nlohmann::json::object());
    const auto model = from_pretrained(file, options);
    CHECK(model->class_name() == hub_config["architectures"][0].get<std::string>());
    check_reference_logits(*model, name + ".gguf", entry);

    // Saved as GGUF: the converter's tensors byte for byte and its keys, read back as the same model.
    const auto saved = testutil::temp_file(name + "-saved.gguf");
    GgufSaveOptions save;
    save.gguf_from = file;
    save_gguf_model(*model, saved, default_registries().families(), save);
    check_same_file(*GgufFile::open(saved), *GgufFile::open(file),
                    entry.value("keys_from_overrides", nlohmann::json::object()));
    const auto back = from_pretrained(saved);  // no overrides: the saved file says what they said
    auto theirs = back->named_parameters();
    for (const auto& p : model->named_parameters()) {
      INFO(p.key());
      CHECK(at::equal(p.value(), theirs[p.key()]));
    }
    check_reference_logits(*back, name + " saved back", entry);
    std::filesystem::remove(saved);
  }
}

TEST_CASE("GGUF: a projection of one row written 1-D, as llama-quantize writes it, loads as its [1, in] weight",
          "[gguf]") {
  // ggml drops trailing dimensions of 1 when it writes a file: Qwen2-MoE's shared expert gate [1, hidden]
  // leaves llama-quantize as [hidden]. The converter's file rewritten so must load as the same model.
  const auto source = GgufFile::open(gguf_data("converted") / "qwen2_moe_basic.gguf");
  std::vector<GgufTensorToWrite> tensors;
  int flattened = 0;
  for (const auto& t : source->tensors()) {
    auto shape = t.shape();
    if (t.name.find("ffn_gate_inp_shexp") != std::string::npos) {
      REQUIRE(shape.size() == 2);
      REQUIRE(shape[0] == 1);
      shape.erase(shape.begin());
      ++flattened;
    }
    tensors.push_back({t.name, t.type, shape, source->raw(t.name).reshape({-1})});
  }
  REQUIRE(flattened > 0);
  const auto file = testutil::temp_file("qwen2moe-1d-gate.gguf");
  save_gguf(file, source->metadata(), tensors);
  const auto original = from_pretrained(source->path());
  const auto flat = from_pretrained(file);
  auto theirs = flat->named_parameters();
  for (const auto& p : original->named_parameters()) {
    INFO(p.key());
    CHECK(at::equal(p.value(), theirs[p.key()]));
  }
  std::filesystem::remove(file);
}

TEST_CASE("GGUF: a Phi-3 file with LongRoPE's factors is refused naming the tensor, not run with plain RoPE", "[gguf]") {
  static PluginHost host;  // the phi3 family
  static const bool loaded = (host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue), true);
  (void)loaded;
  const auto source = GgufFile::open(gguf_data("converted") / "phi3_fused.gguf");
  std::vector<checkpoint::GgufTensorToWrite> tensors;
  for (const auto& t : source->tensors()) {
    const auto shape = t.shape();
    tensors.push_back({t.name, t.type, shape, source->tensor(t.name)});
  }
  tensors.push_back({"rope_factors_long.weight", GgmlType::F32, {8}, at::ones({8})});
  tensors.push_back({"rope_factors_short.weight", GgmlType::F32, {8}, at::ones({8})});
  const auto file = testutil::temp_file("phi3-longrope.gguf");
  checkpoint::save_gguf(file, source->metadata(), tensors);
  CHECK_THROWS_WITH(from_pretrained(file), Contains("tensor 'rope_factors_long.weight': the file's RoPE is LongRoPE"));
  std::filesystem::remove(file);
}

TEST_CASE("GGUF: a DeepSeek-2 file with kv_b whole (older converters) loads the same, and one scoring with softmax "
          "is refused", "[gguf][deepseek_v3]") {
  const auto path = gguf_data("converted") / "deepseek_v3_mla_v5.gguf";
  const auto split = GgufFile::open(path);
  const auto model = from_pretrained(path);
  const auto kv_b = model->named_parameters()["model.layers.0.self_attn.kv_b_proj.weight"];
  // Older converters wrote kv_b_proj as one tensor and the per-head sizes as key_length / value_length.
  std::vector<checkpoint::GgufTensorToWrite> tensors;
  for (const auto& t : split->tensors()) {
    if (t.name.find("attn_v_b") != std::string::npos) continue;
    if (t.name.find("attn_k_b") != std::string::npos) {
      const auto layer = t.name.substr(0, t.name.find(".attn_k_b"));
      const auto whole = model->named_parameters()["model.layers." + layer.substr(4) + ".self_attn.kv_b_proj.weight"];
      tensors.push_back({layer + ".attn_kv_b.weight", GgmlType::F32, whole.sizes().vec(), whole.clone()});
      continue;
    }
    tensors.push_back({t.name, t.type, t.shape(), split->tensor(t.name)});
  }
  std::vector<std::pair<std::string, GgufValue>> older;
  for (const auto& [key, value] : split->metadata()) {
    if (key == "deepseek2.attention.key_length") {
      older.emplace_back(key, GgufValue::of(uint32_t{24}));  // nope + rope
    } else if (key == "deepseek2.attention.value_length") {
      older.emplace_back(key, GgufValue::of(uint32_t{16}));
    } else if (key.find("_mla") == std::string::npos) {
      older.emplace_back(key, value);
    }
  }
  const auto file = testutil::temp_file("deepseek2-kv-b.gguf");
  checkpoint::save_gguf(file, older, tensors);
  const auto whole = from_pretrained(file);
  CHECK(at::equal(whole->named_parameters()["model.layers.0.self_attn.kv_b_proj.weight"], kv_b));
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = at::arange(1, 9).unsqueeze(0);
  CHECK(at::equal(whole->forward(in).logits, model->forward(in).logits));
  // Without expert_gating_func llama.cpp scores experts with softmax (DeepSeek-V2's router).
  std::vector<std::pair<std::string, GgufValue>> softmax;
  for (const auto& [key, value] : split->metadata()) {
    if (key != "deepseek2.expert_gating_func") softmax.emplace_back(key, value);
  }
  std::vector<checkpoint::GgufTensorToWrite> same;
  for (const auto& t : split->tensors()) same.push_back({t.name, t.type, t.shape(), split->tensor(t.name)});
  checkpoint::save_gguf(file, softmax, same);
  CHECK_THROWS_WITH(from_pretrained(file), Contains("metadata 'deepseek2.expert_gating_func': missing: llama.cpp then "
                                                    "scores experts with softmax"));
  std::filesystem::remove(file);
}

TEST_CASE("GGUF: a file no family reads is refused naming its architecture and those that are read", "[gguf]") {
  REQUIRE_THROWS_WITH(from_pretrained(gguf_data("all_types_v3.gguf")),
                      Contains("general.architecture 'test' is not one torchpatch reads from GGUF files (it reads: "
                               "deepseek2, gemma2, gemma3, glm4moe, gpt-oss, granite, llama, olmo2, olmoe, qwen2, qwen2moe, "
                               "qwen3, qwen3moe, smollm3)"));
  const auto r = testutil::torchpatch_cli("run --model " + gguf_data("all_types_v3.gguf").string() + " --prompt-ids 1,2");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Contains("general.architecture 'test'") && !Contains("Exception raised from"));
}

TEST_CASE("GGUF: a SentencePiece vocabulary gives transformers' ids, with Llama's, Phi-3's and Gemma's pipelines",
          "[gguf][tokenizer]") {
  // Vocabulary-only files of a 32,000-token SentencePiece vocabulary with scores and no merges
  // (tests/data/gguf/make_sentencepiece_gguf.py): the merges come from the scores (Gemma's from the
  // tokens' order), the pipeline from the architecture.
  const auto dir = gguf_data("sentencepiece");
  const auto reference = read_json(dir / "reference.json");
  const auto texts = read_json(testutil::data_dir() / reference["texts"].get<std::string>())["texts"];
  for (const auto& [name, file] : reference["files"].items()) {
    const auto tokenizer = gguf_tokenizer(dir / name);
    const auto& cases = file["cases"];
    REQUIRE(cases.size() >= 400);
    size_t equal = 0;
    for (const auto& c : cases) {
      const auto text = texts[c["text"].get<size_t>()]["text"].get<std::string>();
      INFO(name << " text " << c["text"] << ": " << text);
      const auto want = c["ids"].get<std::vector<int64_t>>();
      const auto ids = tokenizer.encode(text).ids;
      CHECK(ids == want);
      equal += ids == want;
      auto plain = want;
      if (!plain.empty() && plain.front() == tokenizer.bos_token_id()) plain.erase(plain.begin());
      if (c.contains("ids_add_special_tokens_false")) plain = c["ids_add_special_tokens_false"].get<std::vector<int64_t>>();
      CHECK(tokenizer.encode(text, false).ids == plain);
      CHECK(tokenizer.decode(ids, /*skip_special_tokens=*/true) == c.value("decoded", text));
    }
    std::cout << name << ": " << equal << " of " << cases.size() << " texts give transformers' ids\n";
  }
  // Gemma's special tokens by their own names; a run of spaces the file spells "  " is found as "▁▁"
  // (259 in this vocabulary).
  const auto gemma = gguf_tokenizer(dir / "gemma2.gguf");
  CHECK(gemma.bos_token_id() == 32000);
  CHECK(gemma.pad_token_id() == 32002);
  CHECK(gemma.encode("  ", false).ids == std::vector<int64_t>{259});
}

TEST_CASE("GGUF: save --format gguf writes what llama.cpp's converter writes, and reads back bit for bit", "[gguf][cli]") {
  // llama_basic from its hub checkpoint: the same tensors, names and q/k order as the gguf package's file.
  const auto written = testutil::temp_file("llama_basic_written.gguf");
  const auto r = testutil::torchpatch_cli("save --model " + testutil::llama_dir() + " --format gguf --output " +
                                          written.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("30 tensors (30 F32)") && Contains("tokenizer: none"));
  const auto ours = GgufFile::open(written);
  const auto theirs = GgufFile::open(gguf_data("llama_basic.gguf"));
  REQUIRE(ours->tensors().size() == theirs->tensors().size());
  for (const auto& t : theirs->tensors()) {
    INFO(t.name);
    const auto* mine = ours->find(t.name);
    REQUIRE(mine != nullptr);
    CHECK(mine->type == t.type);
    CHECK(mine->dims == t.dims);
    CHECK(at::equal(ours->raw(t.name), theirs->raw(t.name)));
  }
  for (const auto* key : {"llama.block_count", "llama.attention.head_count_kv", "llama.context_length"}) {
    INFO(key);
    CHECK(ours->find_value(key)->integer == theirs->find_value(key)->integer);
  }
  // Quantized blocks go out as their GGML type, byte for byte, and come back as the same values.
  const auto q8 = testutil::temp_file("tiny_q8.gguf");
  REQUIRE(testutil::torchpatch_cli("save --preset tiny-llama --quantize q8_0 --format gguf --output " + q8.string()).code == 0);
  const testutil::ScratchDir hub("tiny_q8_hub");
  REQUIRE(testutil::torchpatch_cli("save --preset tiny-llama --quantize q8_0 --output " + hub.path.string()).code == 0);
  const auto v_proj = SafetensorsFile::open(hub.path / "model.safetensors")->tensor("model.layers.1.self_attn.v_proj.weight");
  const auto file = GgufFile::open(q8);
  CHECK(file->find("blk.1.attn_v.weight")->type == GgmlType::Q8_0);
  CHECK(at::equal(file->raw("blk.1.attn_v.weight"), v_proj));
  const auto back = from_pretrained(q8);
  CHECK(at::equal(back->named_parameters()["model.layers.1.self_attn.v_proj.weight"],
                  nn::dequantize(nn::QuantFormat::kQ8_0, v_proj, "v_proj")));
  // A configuration llama.cpp's architecture cannot express is refused before anything is written.
  const auto refused = testutil::torchpatch_cli("save --preset tiny-qwen2 --format gguf --output " +
                                                testutil::temp_file("refused.gguf").string());
  CHECK(refused.code != 0);
  CHECK_THAT(refused.out, Contains("a sliding window, which llama.cpp's 'qwen2' does not apply"));
  CHECK_FALSE(std::filesystem::exists(testutil::temp_file("refused.gguf")));
  std::filesystem::remove(written);
  std::filesystem::remove(q8);
}

TEST_CASE("GGUF: presets of the families with a GGUF architecture go through GGUF and come back as the same model",
          "[gguf]") {
  for (const std::string preset :
       {"tiny-qwen3", "tiny-llama", "tiny-olmo2", "tiny-granite", "tiny-smollm3", "tiny-gemma3", "tiny-olmoe",
        "tiny-mixtral", "tiny-glm4-moe"}) {
    INFO(preset);
    const auto file = testutil::temp_file(preset + ".gguf");
    const auto r = testutil::torchpatch_cli("save --preset " + preset + " --format gguf --output " + file.string());
    INFO(r.out);
    REQUIRE(r.code == 0);
    const auto original = preset_model(preset, 0);
    const auto back = from_pretrained(file);
    CHECK(back->class_name() == original->class_name());
    // Gemma 3's alternating layers go out as attention.sliding_window_pattern and come back.
    CHECK(back->config().decoder.layer_types == original->config().decoder.layer_types);
    auto theirs = back->named_parameters();
    for (const auto& p : original->named_parameters()) {
      INFO(p.key());
      // Gemma's norms travel as 1 + w: that sum, what the norm multiplies by, comes back bit for bit.
      const bool plus_one = preset == "tiny-gemma3" && p.key().size() > 11 &&
                            p.key().compare(p.key().size() - 11, 11, "norm.weight") == 0;
      const bool same =
          plus_one ? at::equal(p.value() + 1, theirs[p.key()] + 1) : at::equal(p.value(), theirs[p.key()]);
      CHECK(same);
    }
    // Without a vocabulary of its own the file says so as llama.cpp does, and reading text from it
    // asks for a tokenizer.
    const auto saved = GgufFile::open(file);
    const auto* vocabulary = saved->find_value("tokenizer.ggml.model");
    REQUIRE(vocabulary != nullptr);
    CHECK(vocabulary->text == "none");
    CHECK(gguf_tokenizer_files(file).empty());
    CHECK_THROWS_WITH(gguf_tokenizer(file), Contains("carries no vocabulary") && Contains("--tokenizer"));
    std::filesystem::remove(file);
  }
}

TEST_CASE("GGUF: the CLI refuses a broken file with the file and field named, and a non-zero exit", "[gguf][cli][hardening]") {
  std::ifstream in(gguf_data("llama_basic.gguf"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const auto cut = testutil::temp_file("cut.gguf");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  for (const char* command : {"run --prompt-ids 1,2", "generate --prompt hello", "plan"}) {
    const auto r = testutil::torchpatch_cli(std::string(command) + " --model " + cut.string());
    INFO(r.out);
    CHECK(r.code != 0);
    CHECK_THAT(r.out, Contains(cut.string()) && Contains("run past the end of the data section") &&
                          !Contains("Exception raised from"));
  }
  std::filesystem::remove(cut);
}

TEST_CASE("GGUF: Q8_0 and Q4_0 projections load as the file's blocks and run as the quantized model", "[gguf][cli][quant]") {
  for (const std::string format : {"q8_0", "q4_0"}) {
    INFO(format);
    const auto file = testutil::temp_file("tiny_" + format + ".gguf");
    REQUIRE(testutil::torchpatch_cli("save --preset tiny-llama --quantize " + format + " --format gguf --output " +
                                     file.string()).code == 0);
    const auto plan = testutil::torchpatch_cli("plan --model " + file.string() + " --json");
    REQUIRE(plan.code == 0);
    CHECK_THAT(plan.out, Contains(format == "q8_0" ? "Q8_0Linear" : "Q4_0Linear"));
    // The same blocks through the same kernels: the same logits as the quantized preset, to the bit.
    const auto rows = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{')))["rows"]; };
    const auto from_file = testutil::torchpatch_cli("run --model " + file.string() + " --prompt-ids 1,2,3 --json");
    const auto preset = testutil::torchpatch_cli("run --preset tiny-llama --quantize " + format + " --prompt-ids 1,2,3 --json");
    REQUIRE(from_file.code == 0);
    REQUIRE(preset.code == 0);
    CHECK(rows(from_file.out) == rows(preset.out));
    // Saved again, the blocks are the file's bytes.
    const auto again = testutil::temp_file("tiny_" + format + "_again.gguf");
    REQUIRE(testutil::torchpatch_cli("save --model " + file.string() + " --format gguf --output " + again.string()).code == 0);
    const auto a = GgufFile::open(file), b = GgufFile::open(again);
    for (const auto& t : a->tensors()) {
      INFO(t.name);
      CHECK(b->find(t.name)->type == t.type);
      CHECK(at::equal(a->raw(t.name), b->raw(t.name)));
    }
    // --dequantize holds them in float: plain Linear modules.
    const auto dequantized = testutil::torchpatch_cli("plan --model " + file.string() + " --dequantize --json");
    REQUIRE(dequantized.code == 0);
    CHECK_THAT(dequantized.out, !Contains("Q8_0Linear") && !Contains("Q4_0Linear"));
    std::filesystem::remove(file);
    std::filesystem::remove(again);
  }
}

TEST_CASE("GGUF: Q4_1, Q5_0 and Q5_1 projections run from kRows16 as from the file's rows, and save back byte for byte",
          "[gguf][quant]") {
  // tiny-llama saved with Q8_0 projections, each then replaced by random blocks of the format: the
  // file's projections are the format's blocks, loaded into the layout the kernel reads.
  static PluginHost host;  // the quantized plugin multiplies the blocks
  static const bool loaded = (host.load_directory(TORCHPATCH_BUNDLED_PLUGIN_DIR, PluginMode::Catalogue), true);
  (void)loaded;
  at::manual_seed(31);
  const auto q8 = testutil::temp_file("tiny_q8_for_gguf_formats.gguf");
  REQUIRE(testutil::torchpatch_cli("save --preset tiny-llama --quantize q8_0 --format gguf --output " + q8.string()).code == 0);
  const auto source = GgufFile::open(q8);
  for (const auto format : {nn::QuantFormat::kQ4_1, nn::QuantFormat::kQ5_0, nn::QuantFormat::kQ5_1}) {
    INFO(nn::format_name(format));
    std::vector<GgufTensorToWrite> tensors;
    int replaced = 0;
    for (const auto& t : source->tensors()) {
      auto shape = t.shape();
      if (t.type == nn::GgmlType::Q8_0 && shape.size() == 2 && t.name.find("token_embd") == std::string::npos) {
        tensors.push_back({t.name, nn::ggml_type(format), shape, testutil::random_blocks(format, shape[0], shape[1])});
        ++replaced;
      } else {
        tensors.push_back({t.name, t.type, shape, source->raw(t.name)});
      }
    }
    REQUIRE(replaced > 0);
    const auto file = testutil::temp_file(std::string("tiny_") + nn::format_name(format) + ".gguf");
    save_gguf(file, source->metadata(), tensors);
    // Logits for 3 tokens (the integer kernels) and 6 (the float path) with every vector kernel this
    // CPU has, each on kRows16, against the scalar kernel on the file's rows: float rounding apart, the same.
    const auto logits = [&](nn::QuantKernel kernel, int64_t tokens) {
      const auto previous = nn::set_quant_kernel(kernel);
      const auto model = from_pretrained(file);
      at::NoGradGuard no_grad;
      ModelInputs in;
      in.input_ids = at::arange(1, 1 + tokens, at::kLong).unsqueeze(0);
      const auto out = model->forward(in).logits;
      nn::set_quant_kernel(previous);
      return out;
    };
    // Bound: 1e-3 of the largest logit, loose enough for an activation that the 8-bit quantization of
    // a later layer rounds the other way after a different float rounding upstream; a misplaced
    // scale, offset or fifth bit moves logits by their own size.
    for (const int64_t tokens : {3, 6}) {
      const auto rows = logits(nn::QuantKernel::kScalar, tokens);
      const double bound = 1e-3 * rows.abs().max().item<double>();
      for (const auto kernel : {nn::QuantKernel::kAvx2, nn::QuantKernel::kAvx512}) {
        if (!nn::quant_kernel_available(kernel)) continue;
        const auto name = std::string(nn::format_name(format)) + " " + nn::quant_kernel_name(kernel) + " " +
                          std::to_string(tokens) + " tokens";
        CHECK(testutil::close(name, logits(kernel, tokens), rows, {}, bound, 0));
      }
    }
    // Saved from the packed model, the blocks are the file's bytes.
    const auto again = testutil::temp_file(std::string("tiny_") + nn::format_name(format) + "_again.gguf");
    REQUIRE(testutil::torchpatch_cli("save --model " + file.string() + " --format gguf --output " + again.string()).code == 0);
    const auto a = GgufFile::open(file), b = GgufFile::open(again);
    for (const auto& t : a->tensors()) {
      INFO(t.name);
      CHECK(b->find(t.name)->type == t.type);
      CHECK(at::equal(a->raw(t.name), b->raw(t.name)));
    }
    std::filesystem::remove(file);
    std::filesystem::remove(again);
  }
  std::filesystem::remove(q8);
}
