// Tests of the safetensors reader and writer: round trips and every kind of corrupt file.
#include "test_prelude.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/error.h"


namespace fs = std::filesystem;
using torchpatch::CheckpointError;
using torchpatch::checkpoint::Dtype;
using torchpatch::checkpoint::SafetensorsFile;
using torchpatch::checkpoint::save_safetensors;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

/// A fresh directory under the system temp directory, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = fs::temp_directory_path() /
           ("torchpatch_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
            std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path / name; }
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string u64_le(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

/// Writes a raw safetensors file: u64 header length (the real one unless given), header, data bytes.
void write_raw(const fs::path& path, const std::string& header, size_t data_bytes, int64_t claimed_len = -1) {
  const uint64_t len = claimed_len < 0 ? header.size() : static_cast<uint64_t>(claimed_len);
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = static_cast<char>(i * 7 + 1);
  write_bytes(path, u64_le(len) + header + data);
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous();
  const at::Tensor cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() && (ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

bool has_tmp_file(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

// The error must be a CheckpointError whose message matches (file name, tensor and cause).
#define REQUIRE_CHECKPOINT_ERROR(expr, matcher) \
  do {                                          \
    REQUIRE_THROWS_AS(expr, CheckpointError);   \
    REQUIRE_THROWS_WITH(expr, matcher);         \
  } while (0)

std::vector<std::pair<std::string, at::Tensor>> every_dtype() {
  at::manual_seed(1234);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<std::pair<std::string, at::Tensor>> t;
  t.emplace_back("f64", at::randn({3, 4}, at::TensorOptions().dtype(at::kDouble)));
  t.emplace_back("f32", at::randn({2, 3, 4}, f32));
  t.emplace_back("f32.special",
                 at::tensor({0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                             std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()},
                            f32));
  t.emplace_back("f16", at::randn({5, 2}, f32).to(at::kHalf));
  t.emplace_back("bf16", at::randn({7}, f32).to(at::kBFloat16));
  t.emplace_back("i64", at::tensor({std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                                    std::numeric_limits<int64_t>::max()},
                                   at::TensorOptions().dtype(at::kLong)));
  t.emplace_back("i32", at::randint(-100000, 100000, {4, 4}, at::TensorOptions().dtype(at::kInt)));
  t.emplace_back("i16", at::randint(-30000, 30000, {9}, at::TensorOptions().dtype(at::kShort)));
  t.emplace_back("i8", at::randint(-128, 128, {3, 3}, at::TensorOptions().dtype(at::kChar)));
  t.emplace_back("u8", at::randint(0, 256, {11}, at::TensorOptions().dtype(at::kByte)));
  t.emplace_back("bool", at::randint(0, 2, {2, 5}, at::TensorOptions().dtype(at::kLong)).to(at::kBool));
  t.emplace_back("scalar", at::scalar_tensor(3.25, at::TensorOptions().dtype(at::kDouble)));
  t.emplace_back("empty", at::empty({0, 3}, f32));
  t.emplace_back("transposed", at::arange(12, f32).reshape({3, 4}).t());  // not contiguous
  return t;
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype is bit exact", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "model.safetensors";
  const auto tensors = every_dtype();
  save_safetensors(file, tensors);

  auto st = SafetensorsFile::open(file);
  REQUIRE(st->path() == file);
  REQUIRE(st->tensors().size() == tensors.size());
  REQUIRE(st->metadata().empty());
  for (size_t i = 1; i < st->tensors().size(); ++i) {
    CHECK(st->tensors()[i - 1].end <= st->tensors()[i].begin);
  }
  for (const auto& [name, expected] : tensors) {
    INFO("tensor " << name);
    const auto* info = st->find(name);
    REQUIRE(info != nullptr);
    CHECK(info->name == name);
    CHECK(info->shape == expected.sizes().vec());
    CHECK(torchpatch::checkpoint::to_scalar_type(info->dtype) == expected.scalar_type());
    CHECK(info->end - info->begin ==
          static_cast<uint64_t>(expected.numel()) * static_cast<uint64_t>(expected.element_size()));
    const at::Tensor got = st->tensor(name);
    CHECK(got.device().is_cpu());
    CHECK(got.scalar_type() == expected.scalar_type());
    CHECK(got.sizes() == expected.sizes());
    CHECK(at::equal(got, expected));
    CHECK(same_bytes(got, expected));
  }
  CHECK(st->find("absent") == nullptr);
  CHECK(st->tensor("scalar").dim() == 0);
  CHECK(st->tensor("scalar").item<double>() == 3.25);
  CHECK(st->tensor("empty").sizes() == at::IntArrayRef({0, 3}));
}

TEST_CASE("safetensors NaN payloads and misaligned tensors survive", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "odd.safetensors";
  const at::Tensor nan = at::tensor({std::nanf(""), 1.0f, -std::nanf("")});
  // 3 bytes of U8 first: the following tensors start at odd offsets and must be copied, not viewed.
  const at::Tensor u8 = at::tensor({1, 2, 3}, at::TensorOptions().dtype(at::kByte));
  const at::Tensor f64 = at::arange(5, at::TensorOptions().dtype(at::kDouble)) / 3.0;
  const at::Tensor i16 = at::tensor({-5, 300, 7}, at::TensorOptions().dtype(at::kShort));
  save_safetensors(file, {{"u8", u8}, {"f64", f64}, {"nan", nan}, {"i16", i16}});

  auto st = SafetensorsFile::open(file);
  CHECK(same_bytes(st->tensor("nan"), nan));
  CHECK(at::equal(st->tensor("u8"), u8));
  CHECK(at::equal(st->tensor("f64"), f64));
  CHECK(at::equal(st->tensor("i16"), i16));
  // Tensors handed out are usable through the normal API whatever their alignment.
  CHECK(st->tensor("f64").sum().item<double>() == Approx(10.0 / 3.0));
}

TEST_CASE("safetensors tensors keep the mapping alive after the file object is gone", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "keep.safetensors";
  const at::Tensor w = at::randn({64, 32});
  save_safetensors(file, {{"w", w}});
  at::Tensor view;
  {
    auto st = SafetensorsFile::open(file);
    view = st->tensor("w");
  }
  CHECK(at::equal(view, w));
  CHECK(at::equal(view.clone() * 2, w * 2));
}

TEST_CASE("safetensors metadata round trip", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "meta.safetensors";
  const std::map<std::string, std::string> metadata{
      {"format", "pt"}, {"source", "torchpatch"}, {"note", "quotes \" and \\ and unicode \xc3\xa9"}};
  save_safetensors(file, {{"x", at::ones({2})}}, metadata);
  auto st = SafetensorsFile::open(file);
  CHECK(st->metadata() == metadata);
  CHECK(at::equal(st->tensor("x"), at::ones({2})));

  // Metadata only, no tensors.
  const auto only = dir / "only_meta.safetensors";
  save_safetensors(only, {}, {{"k", "v"}});
  auto st2 = SafetensorsFile::open(only);
  CHECK(st2->tensors().empty());
  CHECK(st2->metadata() == std::map<std::string, std::string>{{"k", "v"}});
}

TEST_CASE("safetensors header is padded to a multiple of 8 and keeps the given order", "[safetensors]") {
  TempDir dir;
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    INFO("name " << name);
    const auto file = dir / (name + ".safetensors");
    save_safetensors(file, {{name, at::ones({3})}, {"b", at::zeros({2}, at::kLong)}}, {{"m", name}});
    const std::string bytes = read_bytes(file);
    REQUIRE(bytes.size() >= 8);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(bytes[i]);
    CHECK(len % 8 == 0);
    REQUIRE(bytes.size() == 8 + len + 3 * 4 + 2 * 8);
    const std::string header = bytes.substr(8, len);
    const auto json = nlohmann::ordered_json::parse(header);
    std::vector<std::string> keys;
    for (const auto& item : json.items()) keys.push_back(item.key());
    CHECK(keys == std::vector<std::string>{"__metadata__", name, "b"});
    CHECK(json[name]["data_offsets"] == nlohmann::ordered_json::array({0, 12}));
    CHECK(json["b"]["data_offsets"] == nlohmann::ordered_json::array({12, 28}));
    CHECK(json["b"]["dtype"] == "I64");
    // Padding is spaces after the JSON text.
    const auto last = header.find_last_not_of(' ');
    CHECK(header[last] == '}');
  }
}

TEST_CASE("safetensors rejects corrupt files", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "bad.safetensors";
  const std::string where = file.string();

  SECTION("file of 3 bytes") {
    write_bytes(file, "abc");
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("truncated: 3 bytes, a safetensors file needs at least 8"));
  }
  SECTION("empty file") {
    write_bytes(file, "");
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file), StartsWith(where) && Contains("truncated: 0 bytes"));
  }
  SECTION("missing file") {
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(dir / "nope.safetensors"),
                             Contains("nope.safetensors") && Contains("cannot open"));
  }
  SECTION("header length larger than the file") {
    write_raw(file, "{}", 0, 1000);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("header claims 1000 bytes but only 2 follow"));
  }
  SECTION("header length near 2^64") {
    write_raw(file, "{}", 0, std::numeric_limits<int64_t>::max());
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file), StartsWith(where) && Contains("header claims"));
  }
  SECTION("header not JSON") {
    write_raw(file, "{not json", 0);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("header is not valid JSON") && Contains("parse error"));
  }
  SECTION("header a JSON array") {
    write_raw(file, "[1, 2]", 0);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file), StartsWith(where) && Contains("not a JSON object"));
  }
  SECTION("entry not an object") {
    write_raw(file, R"({"w": 3})", 0);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("not a JSON object"));
  }
  SECTION("unknown dtype") {
    write_raw(file, R"({"model.norm.weight": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", 2);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'model.norm.weight': unknown dtype 'F8'"));
  }
  SECTION("dtype not a string") {
    write_raw(file, R"({"w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("'dtype' is not a string"));
  }
  SECTION("missing dtype") {
    write_raw(file, R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w': missing 'dtype'"));
  }
  SECTION("missing shape") {
    write_raw(file, R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w': missing 'shape'"));
  }
  SECTION("negative dimension") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("non-negative integer"));
  }
  SECTION("fractional dimension") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("non-negative integer"));
  }
  SECTION("missing data_offsets") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [2]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w': missing 'data_offsets'"));
  }
  SECTION("data_offsets of three numbers") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("'data_offsets'"));
  }
  SECTION("negative data_offsets") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("'data_offsets'"));
  }
  SECTION("begin after end") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w'") && Contains("begin after end"));
  }
  SECTION("offsets out of range") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(
        SafetensorsFile::open(file),
        StartsWith(where) && Contains("tensor 'w': offsets [0, 16) out of range: data section is 8 bytes"));
  }
  SECTION("two overlapping tensors") {
    write_raw(file,
              R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                  "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
              24);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'b'") && Contains("overlaps tensor 'a'"));
  }
  SECTION("a tensor inside another one") {
    write_raw(file,
              R"({"big": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                  "mid": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]},
                  "tail": {"dtype": "F32", "shape": [1], "data_offsets": [28, 32]}})",
              32);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'mid'") && Contains("overlaps tensor 'big'"));
  }
  SECTION("end - begin != numel * itemsize") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
    REQUIRE_CHECKPOINT_ERROR(
        SafetensorsFile::open(file),
        StartsWith(where) && Contains("tensor 'w': holds 20 bytes but shape [2, 3] of F32 needs 24"));
  }
  SECTION("numel overflow") {
    write_raw(file,
              R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296, 2], "data_offsets": [0, 8]}})", 8);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("tensor 'w': holds 8 bytes but shape"));
  }
  SECTION("an empty tensor whose other dimensions overflow int64") {
    write_raw(file, R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
    REQUIRE_CHECKPOINT_ERROR(
        SafetensorsFile::open(file),
        StartsWith(where) && Contains("tensor 'w': shape [0, 4294967296, 4294967296] spans more than 2^63 elements"));
  }
  SECTION("__metadata__ with a non-string value") {
    write_raw(file, R"({"__metadata__": {"format": 1}})", 0);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file), StartsWith(where) && Contains("__metadata__") &&
                                                              Contains("'format' is not a string"));
  }
  SECTION("__metadata__ not an object") {
    write_raw(file, R"({"__metadata__": "pt"})", 0);
    REQUIRE_CHECKPOINT_ERROR(SafetensorsFile::open(file),
                             StartsWith(where) && Contains("__metadata__ is not a JSON object"));
  }
  SECTION("a missing tensor name in tensor()") {
    save_safetensors(file, {{"present", at::ones({1})}});
    auto st = SafetensorsFile::open(file);
    REQUIRE_CHECKPOINT_ERROR(st->tensor("absent.weight"),
                             StartsWith(where) && Contains("no tensor named 'absent.weight'"));
  }
}

TEST_CASE("safetensors accepts gaps, empty tensors and unordered entries", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "gaps.safetensors";
  // A 4-byte gap between tensors, an empty tensor sitting inside another's range, entries not in
  // offset order.
  write_raw(file,
            R"({"z": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]},
                "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [2, 2]},
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
            12);
  auto st = SafetensorsFile::open(file);
  REQUIRE(st->tensors().size() == 3);
  CHECK(st->tensors()[0].name == "a");
  CHECK(st->tensors()[2].name == "z");
  CHECK(st->tensor("e").sizes() == at::IntArrayRef({0, 3}));
  const at::Tensor z = st->tensor("z");
  for (int i = 0; i < 4; ++i) CHECK(z[i].item<int64_t>() == static_cast<uint8_t>((8 + i) * 7 + 1));
}

TEST_CASE("save_safetensors replaces files atomically", "[safetensors]") {
  TempDir dir;
  const auto file = dir / "model.safetensors";

  save_safetensors(file, {{"old", at::zeros({4})}});
  save_safetensors(file, {{"new", at::ones({2, 2})}});
  CHECK_FALSE(has_tmp_file(dir.path));
  {
    auto st = SafetensorsFile::open(file);
    CHECK(st->find("old") == nullptr);
    CHECK(at::equal(st->tensor("new"), at::ones({2, 2})));
  }

  const std::string before = read_bytes(file);
  SECTION("unsupported dtype") {
    REQUIRE_CHECKPOINT_ERROR(
        save_safetensors(file, {{"ok", at::ones({2})}, {"cplx", at::zeros({2}, at::kComplexFloat)}}),
        StartsWith(file.string()) && Contains("tensor 'cplx'") && Contains("ComplexFloat"));
  }
  SECTION("duplicate name") {
    REQUIRE_CHECKPOINT_ERROR(save_safetensors(file, {{"x", at::ones({2})}, {"x", at::ones({3})}}),
                             StartsWith(file.string()) && Contains("tensor 'x'") && Contains("duplicate"));
  }
  SECTION("tensor not on CPU") {
    REQUIRE_CHECKPOINT_ERROR(save_safetensors(file, {{"m", at::empty({2}, at::TensorOptions().device(at::kMeta))}}),
                             StartsWith(file.string()) && Contains("tensor 'm'") && Contains("not on CPU"));
  }
  SECTION("directory that does not exist") {
    const auto missing = dir / "no_such_dir" / "model.safetensors";
    REQUIRE_CHECKPOINT_ERROR(save_safetensors(missing, {{"x", at::ones({2})}}),
                             StartsWith(missing.string()) && Contains("No such file or directory"));
  }
  CHECK(read_bytes(file) == before);
  CHECK_FALSE(has_tmp_file(dir.path));
}

TEST_CASE("safetensors dtype helpers", "[safetensors]") {
  using namespace torchpatch::checkpoint;
  const std::vector<std::tuple<Dtype, const char*, int64_t, c10::ScalarType>> table{
      {Dtype::F64, "F64", 8, at::kDouble}, {Dtype::F32, "F32", 4, at::kFloat},  {Dtype::F16, "F16", 2, at::kHalf},
      {Dtype::BF16, "BF16", 2, at::kBFloat16}, {Dtype::I64, "I64", 8, at::kLong}, {Dtype::I32, "I32", 4, at::kInt},
      {Dtype::I16, "I16", 2, at::kShort},  {Dtype::I8, "I8", 1, at::kChar},     {Dtype::U8, "U8", 1, at::kByte},
      {Dtype::BOOL, "BOOL", 1, at::kBool}};
  for (const auto& [dtype, name, size, scalar] : table) {
    CHECK(std::string(dtype_name(dtype)) == name);
    CHECK(dtype_size(dtype) == size);
    CHECK(to_scalar_type(dtype) == scalar);
    CHECK(from_scalar_type(scalar) == dtype);
  }
  CHECK_THROWS_AS(from_scalar_type(at::kComplexDouble), CheckpointError);
}
