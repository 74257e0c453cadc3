// GGUF's Q8_0 and Q4_0 blocks against llama.cpp's own reference quantizer: every 2-D weight of
// llama_basic and the edge cases (tests/data/quant_llama_basic, computed by gguf-py), byte for byte.
// A mismatch prints the tensor, row, block and both blocks, with the 32 source values as hex floats.
#include "test_prelude.h"
#include "test_util.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/error.h"
#include "torchpatch/nn/quant.h"

using Catch::Matchers::Contains;
using torchpatch::checkpoint::SafetensorsFile;
using torchpatch::nn::QuantFormat;
namespace fs = std::filesystem;

namespace {

const fs::path kQuantDir = testutil::data_dir() / "quant_llama_basic";

// The first block where `actual` and `expected` (uint8 [rows, blocks * bytes]) differ, described; "" if none.
std::string first_difference(const std::string& name, QuantFormat format, const at::Tensor& source,
                             const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) {
    return fmt::format("{}: shape {} != {}", name, fmt::join(actual.sizes(), "x"), fmt::join(expected.sizes(), "x"));
  }
  const int64_t bytes = torchpatch::nn::block_bytes(format);
  const auto a = actual.contiguous(), e = expected.contiguous();
  const auto x = source.to(at::kFloat).contiguous();
  const uint8_t* pa = a.data_ptr<uint8_t>();
  const uint8_t* pe = e.data_ptr<uint8_t>();
  const int64_t per_row = a.size(-1) / bytes;
  for (int64_t block = 0; block < a.numel() / bytes; ++block) {
    if (std::equal(pa + block * bytes, pa + (block + 1) * bytes, pe + block * bytes)) continue;
    std::string text = fmt::format("{}: row {} block {} differs\n  ours:     ", name, block / per_row, block % per_row);
    for (int64_t i = 0; i < bytes; ++i) text += fmt::format("{:02x}", pa[block * bytes + i]);
    text += "\n  llama.cpp: ";
    for (int64_t i = 0; i < bytes; ++i) text += fmt::format("{:02x}", pe[block * bytes + i]);
    text += "\n  source:";
    const float* values = x.data_ptr<float>() + block * torchpatch::nn::kQuantBlockSize;
    for (int64_t i = 0; i < torchpatch::nn::kQuantBlockSize; ++i) text += fmt::format(" {:a}", values[i]);
    return text;
  }
  return "";
}

// Quantizes every tensor of `reference` from its float source and compares; returns the tensors compared.
int compare_file(QuantFormat format, const std::string& file) {
  const auto reference = SafetensorsFile::open(kQuantDir / file);
  CHECK(reference->metadata().at("format") == torchpatch::nn::format_name(format));
  CHECK(reference->metadata().at("block_bytes") == std::to_string(torchpatch::nn::block_bytes(format)));
  const auto source = SafetensorsFile::open(testutil::data_dir() / "llama_basic" / "model.safetensors");
  int compared = 0;
  for (const auto& info : reference->tensors()) {
    const auto weight = source->tensor(info.name);
    const auto expected = reference->tensor(info.name);
    const auto ours = torchpatch::nn::quantize(format, weight, info.name);
    const auto difference = first_difference(info.name, format, weight, ours, expected);
    INFO(difference);
    CHECK(difference.empty());
    ++compared;
  }
  return compared;
}

}  // namespace

TEST_CASE("Q8_0 blocks of every llama_basic weight equal llama.cpp's byte for byte", "[quant]") {
  CHECK(compare_file(QuantFormat::kQ8_0, "q8_0.safetensors") == 23);
}

TEST_CASE("Q4_0 blocks of every llama_basic weight equal llama.cpp's byte for byte", "[quant]") {
  CHECK(compare_file(QuantFormat::kQ4_0, "q4_0.safetensors") == 23);
}

TEST_CASE("Q8_0 and Q4_0 edge cases equal llama.cpp's: zeros, ties, a negative maximum, tiny beside huge",
          "[quant]") {
  const auto edge = SafetensorsFile::open(kQuantDir / "edge_cases.safetensors");
  const auto values = edge->tensor("float");
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const std::string name = torchpatch::nn::format_name(format);
    const auto ours = torchpatch::nn::quantize(format, values, "edge_cases");
    const auto difference = first_difference("edge_cases " + name, format, values, ours, edge->tensor(name));
    INFO(difference);
    CHECK(difference.empty());
  }
}

TEST_CASE("dequantized blocks are d * q (Q8_0) and d * (q - 8) (Q4_0), within half a step of the source",
          "[quant]") {
  const auto weight = SafetensorsFile::open(testutil::data_dir() / "llama_basic" / "model.safetensors")
                          ->tensor("model.layers.0.mlp.down_proj.weight");  // [64, 128]
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const std::string name = torchpatch::nn::format_name(format);
    const auto blocks = torchpatch::nn::quantize(format, weight, "down_proj");
    const auto restored = torchpatch::nn::dequantize(format, blocks, "down_proj");
    REQUIRE(restored.sizes() == weight.sizes());
    // One step of the grid is d: amax / 127 (Q8_0) or |max| / 8 (Q4_0), per block.
    const auto per_block = weight.reshape({64, 4, 32}).abs().amax(-1, /*keepdim=*/true);
    const auto step = format == QuantFormat::kQ8_0 ? per_block / 127 : per_block / 8;
    const auto error = (restored - weight).reshape({64, 4, 32}).abs();
    // Half a step from rounding (Q4_0: a whole one where q = 16 is clipped to 15, at -max), plus the
    // fp16 rounding of d, at most 2^-11 of it for each of the |q| <= 127 (or 8) steps.
    const double bound = format == QuantFormat::kQ8_0 ? 0.5 + 127 * 0x1p-11 : 1.0 + 8 * 0x1p-11;
    const double worst = (error / step).max().item<double>();
    std::printf("%s dequantized: max error %.4f steps (bound %.4f)\n", name.c_str(), worst, bound);
    CHECK(worst <= bound);
    // Requantizing what the blocks stand for gives the same blocks.
    CHECK(at::equal(torchpatch::nn::quantize(format, restored, "down_proj"), blocks));
  }
}

TEST_CASE("bfloat16 and float16 weights quantize as their float32 values", "[quant]") {
  const auto weight = at::randn({8, 64}).mul_(3);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto narrow = weight.to(dtype);
    CHECK(at::equal(torchpatch::nn::quantize(QuantFormat::kQ4_0, narrow, "w"),
                    torchpatch::nn::quantize(QuantFormat::kQ4_0, narrow.to(at::kFloat), "w")));
  }
}

TEST_CASE("shapes and values that cannot be quantized are refused naming the tensor", "[quant]") {
  CHECK_THROWS_WITH(torchpatch::nn::quantize(QuantFormat::kQ8_0, at::zeros({4, 100}), "model.layers.0.mlp.up_proj.weight"),
                    "tensor 'model.layers.0.mlp.up_proj.weight': its input dimension 100 is not a positive multiple "
                    "of 32, the q8_0 block size; keep it in float");
  CHECK_THROWS_WITH(torchpatch::nn::quantize(QuantFormat::kQ4_0, at::zeros({4, 64}, at::kInt), "ids"),
                    Contains("tensor 'ids': only floating-point tensors") && Contains("not Int 4x64"));
  auto poisoned = at::zeros({2, 32});
  poisoned.index_put_({1, 5}, std::numeric_limits<float>::quiet_NaN());
  CHECK_THROWS_WITH(torchpatch::nn::quantize(QuantFormat::kQ8_0, poisoned, "w"),
                    "tensor 'w': value nan at flat index 37 is not finite; it cannot be quantized");
  CHECK_THROWS_WITH(torchpatch::nn::dequantize(QuantFormat::kQ4_0, at::zeros({2, 35}, at::kByte), "w"),
                    "tensor 'w': q4_0 blocks are uint8 rows of whole 18-byte blocks, not Byte 2x35");
  CHECK(torchpatch::nn::parse_quant_format("Q8_0") == QuantFormat::kQ8_0);
  CHECK(torchpatch::nn::parse_quant_format("q5_k") == QuantFormat::kQ5_K);  // read from GGUF files, not written
  CHECK_FALSE(torchpatch::nn::quantizes_to(QuantFormat::kQ5_K));
  CHECK_FALSE(torchpatch::nn::parse_quant_format("q7_x"));
}

TEST_CASE("a subnormal scale saturates instead of overflowing", "[quant]") {
  // amax / 127 is subnormal, so 1 / d is infinite: the values clamp to the grid's ends, no undefined cast.
  auto tiny = at::full({1, 32}, 1e-39f);
  tiny.index_put_({0, 0}, 0.0f);
  for (const auto format : {QuantFormat::kQ8_0, QuantFormat::kQ4_0}) {
    const auto blocks = torchpatch::nn::quantize(format, tiny, "tiny");
    CHECK(blocks.size(1) == torchpatch::nn::block_bytes(format));
  }
}

TEST_CASE("kRows16 packing is a bijection on any bytes and lays blocks out as documented", "[quant][layout]") {
  using torchpatch::nn::pack_blocks;
  using torchpatch::nn::unpack_blocks;
  at::manual_seed(21);
  // Each format's header fields ahead of the quants: {byte in the block, bytes}.
  const std::vector<std::pair<QuantFormat, std::vector<std::pair<int64_t, int64_t>>>> formats = {
      {QuantFormat::kQ8_0, {{0, 2}}},
      {QuantFormat::kQ4_0, {{0, 2}}},
      {QuantFormat::kQ4_1, {{0, 2}, {2, 2}}},
      {QuantFormat::kQ5_0, {{0, 2}, {2, 4}}},
      {QuantFormat::kQ5_1, {{0, 2}, {2, 2}, {4, 4}}}};
  for (const auto& [format, fields] : formats) {
    const int64_t bytes = torchpatch::nn::block_bytes(format);
    const int64_t header = fields.back().first + fields.back().second;
    for (const int64_t rows : {1, 15, 16, 17, 33, 257}) {
      for (const int64_t blocks : {1, 2, 3, 24}) {
        INFO(torchpatch::nn::format_name(format) << " rows " << rows << " blocks " << blocks);
        const auto gguf = at::randint(0, 256, {rows, blocks * bytes}, at::kByte);  // arbitrary bytes, not only real blocks
        const auto packed = pack_blocks(format, gguf, "w");
        CHECK(packed.sizes() == gguf.sizes());
        CHECK(at::equal(unpack_blocks(format, packed, "w"), gguf));
        CHECK(at::equal(pack_blocks(format, unpack_blocks(format, gguf, "w"), "w"), gguf));
        // Row 5, last block, header fields and quant byte 6 where nn/quant.h puts them; the tail rows unmoved.
        if (rows >= 16) {
          const int64_t b = blocks - 1, pair = b / 2 * 2 * 16 * bytes, head = 16 * header, qbytes = 16 * (bytes - header);
          const bool whole_pair = (b | 1) < blocks;
          const int64_t scales = whole_pair ? pair + (b % 2) * head : pair;
          const int64_t quants = whole_pair ? pair + 2 * head + (b % 2) * qbytes : pair + head;
          const auto flat = packed.reshape({-1});
          const int64_t source = 5 * blocks * bytes + b * bytes;
          for (const auto& [at, n] : fields) {  // row 5's value of the field at 16 at + 5 n
            for (int64_t i = 0; i < n; ++i) {
              CHECK(flat[scales + 16 * at + 5 * n + i].item<int>() == gguf.reshape({-1})[source + at + i].item<int>());
            }
          }
          const int q = gguf.reshape({-1})[source + header + 6].item<int>();
          CHECK(flat[quants + 64 * 1 + 4 * 5 + 2].item<int>() == q);
          const int64_t tail = rows / 16 * 16;
          CHECK(at::equal(packed.narrow(0, tail, rows - tail), gguf.narrow(0, tail, rows - tail)));
        }
      }
    }
    // Over 2 MiB: the packed copy is mapped in huge pages (base/huge_pages.h).
    const auto large = at::randint(0, 256, {1024, 96 * bytes}, at::kByte);
    CHECK(at::equal(unpack_blocks(format, pack_blocks(format, large, "large"), "large"), large));
    // 3-D experts: each matrix by itself.
    const auto experts = at::randint(0, 256, {3, 20, 2 * bytes}, at::kByte);
    const auto packed = pack_blocks(format, experts, "experts");
    for (int64_t e = 0; e < 3; ++e) CHECK(at::equal(packed[e], pack_blocks(format, experts[e], "experts")));
    CHECK(at::equal(unpack_blocks(format, packed, "experts"), experts));
  }
  CHECK_THROWS_WITH(pack_blocks(QuantFormat::kQ4_0, at::zeros({2, 35}, at::kByte), "w"),
                    "tensor 'w': q4_0 blocks to lay out are uint8 matrices of whole 18-byte blocks, not Byte 2x35");
  CHECK_THROWS_WITH(unpack_blocks(QuantFormat::kQ8_0, at::zeros({34}, at::kByte), "w"), Contains("not Byte 34"));
  CHECK_THROWS_WITH(pack_blocks(QuantFormat::kQ4_K, at::zeros({16, 144}, at::kByte), "w"),
                    "tensor 'w': only blocks of 32 weights (q8_0, q4_0, q4_1, q5_0, q5_1) are laid out as kRows16, not q4_k");
}
