// A GGUF file read as a Hugging Face checkpoint: the config.json its metadata describes (through the
// family that reads its `general.architecture`) and its tensors under Hugging Face's names, so it
// builds, patches, loads and saves like any checkpoint.
#pragma once

#include "torchpatch/export.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <optional>

#include <nlohmann/json.hpp>

#include "torchpatch/checkpoint/gguf.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/models/family.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/text/tokenizer.h"

namespace torchpatch {

struct TORCHPATCH_API GgufModel {
  std::shared_ptr<const checkpoint::GgufFile> file;
  /// What config.json would hold (Family::gguf's config).
  nlohmann::json config;
  /// The tensors under Hugging Face's names, the projections kept as blocks as uint8 rows, the rest
  /// dequantized to float32 as they are read (q/k rows put back in Hugging Face's order where
  /// llama.cpp permuted them). A tensor no naming rule knows keeps its GGUF name, so loading reports
  /// it as unexpected.
  std::shared_ptr<const checkpoint::TensorSource> tensors;
};

/// Reads `path` (a .gguf file). Projections whose block type a quantization method of `families`
/// multiplies (QuantizationMethod::ggml_types: the bundled plugin 'quantized' has Q8_0 and Q4_0) are
/// kept as the file's blocks, byte for byte, under that method's quantization_config; the rest, and
/// everything with `dequantize`, is dequantized to float32. ConfigError naming the file when no
/// family reads its architecture (listing those that are read) or its metadata lacks what the family
/// needs; CheckpointError for a file that is not valid GGUF.
TORCHPATCH_API GgufModel read_gguf_model(const std::filesystem::path& path, const FamilyRegistry& families,
                                         bool dequantize = false);

/// Lets each nn::Linear of `model` whose weight is tied to one the file holds as blocks (a tied output
/// layer, sharing the file's Q8_0 or Q6_K token embeddings) decode from those blocks
/// (nn::Linear::decode_from_blocks): a fourth of the bytes or fewer per token than the float32 copy,
/// the same values. Returns the tied weights' names that do.
TORCHPATCH_API std::vector<std::string> decode_tied_weights_from_blocks(PretrainedModel& model, const GgufModel& gguf);

/// The tokenizer a GGUF file carries (tokenizer.ggml.*): the tokenizer.json llama.cpp's converter
/// read, rebuilt (runtime/gguf_tokenizer.cpp; docs/gguf.md lists the pre-tokenizers). ConfigError
/// naming the file and key for a vocabulary kind or pre-tokenizer torchpatch does not rebuild.
TORCHPATCH_API text::Tokenizer gguf_tokenizer(const std::filesystem::path& file);

/// What gguf_tokenizer reads the file's tokenizer as: tokenizer.json and tokenizer_config.json, by
/// name and text (what a Hugging Face checkpoint saved from the file carries); none for a file
/// without a tokenizer, a ConfigError as gguf_tokenizer's for one it cannot read.
TORCHPATCH_API std::vector<std::pair<std::string, std::string>> gguf_tokenizer_files(const std::filesystem::path& file);

/// The tokenizer of a model path: a GGUF file's (a .gguf file, or a directory holding one and no
/// tokenizer.json), else text::Tokenizer::from_pretrained's.
TORCHPATCH_API text::Tokenizer tokenizer_of(const std::filesystem::path& model);

/// How save_gguf_model writes.
struct TORCHPATCH_API GgufSaveOptions {
  /// The conversion rules reversed to reach the hub layout first (nullptr: global_conversions()).
  const checkpoint::ConversionRegistry* conversions = nullptr;
  /// The GGUF file the model was read from: its tokenizer.* keys are written too (and its other
  /// general.* keys). Empty: no tokenizer is written (the report says so; a tokenizer.json is not
  /// converted to GGUF's yet).
  std::filesystem::path gguf_from;
};

/// What save_gguf_model wrote.
struct TORCHPATCH_API GgufSaveReport {
  int64_t tensors = 0;
  std::map<std::string, int64_t> types;  ///< tensors per GGML type ("F32": 61, "Q8_0": 210)
  std::string tokenizer;                 ///< where the tokenizer came from, or why there is none
};

/// Writes `model` as a GGUF file llama.cpp loads: its family's architecture (Family::gguf) and
/// metadata, llama.cpp's tensor names (q/k rows permuted back where the family's converter does),
/// float weights as F32 / F16 / BF16 as they are held and quantized blocks as their GGML type. Read
/// back with from_pretrained, it gives the same parameters bit for bit. ConfigError naming the
/// model for a family without a GGUF architecture or a config llama.cpp's cannot express.
TORCHPATCH_API GgufSaveReport save_gguf_model(const PretrainedModel& model, const std::filesystem::path& file,
                                              const FamilyRegistry& families, const GgufSaveOptions& options = {});

}  // namespace torchpatch
