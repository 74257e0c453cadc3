// GGUF files (llama.cpp's format), read through a memory map with every field checked, and written.
//
// Layout (little-endian, versions 2 and 3): "GGUF", u32 version, u64 tensor count, u64 metadata
// count; the metadata as (string key, u32 type, value); each tensor's (string name, u32 dimension
// count, u64 dimensions from the fastest-varying, u32 GGML type, u64 offset); padding to the
// alignment (`general.alignment`, 32 by default); then the data, each tensor at its offset from
// there, a multiple of the alignment. A string is a u64 length and its bytes (no terminator).
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "torchpatch/nn/ggml_types.h"

namespace torchpatch::checkpoint {

// GGML's types live with the block formats (nn/ggml_types.h); the reader names them here too.
using nn::dequantize_ggml;
using nn::GgmlType;
using nn::ggml_type_info;
using nn::ggml_type_named;
using nn::GgmlTypeInfo;

/// GGUF metadata value types (as numbered in the file).
enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

/// "UINT32", "ARRAY", ...
TORCHPATCH_API const char* gguf_type_name(GgufType type);

/// One metadata value. Integers are kept as read (`integer` holds the bits of a signed one), floats
/// as double, arrays as their elements (all of `element_type`).
struct TORCHPATCH_API GgufValue {
  GgufType type = GgufType::UINT32;
  GgufType element_type = GgufType::UINT8;  ///< arrays only
  uint64_t integer = 0;
  double real = 0;
  bool boolean = false;
  std::string text;
  std::vector<GgufValue> array;

  bool is_integer() const;
  bool is_signed() const { return type == GgufType::INT8 || type == GgufType::INT16 || type == GgufType::INT32 || type == GgufType::INT64; }
  /// The value of an integer type as int64 (a UINT64 above INT64_MAX has no such value: nullopt).
  std::optional<int64_t> as_int() const;
  /// A number of any integer or float type as double.
  std::optional<double> as_number() const;

  static GgufValue of(uint32_t v);
  static GgufValue of(int32_t v);
  static GgufValue of(uint64_t v);
  static GgufValue of(float v);
  static GgufValue of(bool v);
  static GgufValue of(std::string v);
  static GgufValue strings(std::vector<std::string> v);
  static GgufValue int32s(const std::vector<int32_t>& v);
  static GgufValue float32s(const std::vector<float>& v);
};

/// One tensor's entry.
struct TORCHPATCH_API GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;  ///< GGUF's order: dims[0] varies fastest (a weight [out, in] is {in, out})
  uint64_t begin = 0;         ///< byte offset in the file
  uint64_t end = 0;           ///< one past the last byte
  /// The shape in LibTorch's order (dims reversed).
  std::vector<int64_t> shape() const;
  int64_t numel() const;
};

/// A validated, memory-mapped GGUF file (version 2 or 3). Tensors it returns may view the mapping
/// and keep the file mapped while they live.
class TORCHPATCH_API GgufFile : public std::enable_shared_from_this<GgufFile> {
 public:
  /// Maps and validates `path`. Throws CheckpointError naming the file and the field or tensor at
  /// fault: a bad magic or version, a count, string or array longer than the file, an unknown value
  /// or tensor type, a key or tensor name given twice, more than 4 dimensions, a first dimension
  /// that is not whole blocks, an offset that is not a multiple of the alignment, data past the end
  /// of the file or overlapping another tensor's. `display` names it in messages (see SafetensorsFile).
  static std::shared_ptr<GgufFile> open(const std::filesystem::path& path, const std::filesystem::path& display = {});

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  /// Every metadata key with its value, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// nullptr when absent.
  const GgufValue* find_value(const std::string& key) const;
  /// Entries in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// nullptr when absent.
  const GgufTensorInfo* find(const std::string& name) const;

  /// The tensor's bytes as uint8 [dims reversed, but the last one in bytes: rows of whole blocks],
  /// viewing the mapping (copy on write).
  at::Tensor raw(const std::string& name) const;
  /// The tensor as float32 in LibTorch's shape: F32 viewed, every other floating type dequantized
  /// (dequantize_ggml). An integer type is viewed in its own dtype.
  at::Tensor tensor(const std::string& name) const;
  /// Whether `p` points into this file's mapping.
  bool maps(const void* p) const {
    const auto* byte = static_cast<const uint8_t*>(p);
    return byte >= data_ && byte < data_ + size_;
  }

 private:
  GgufFile() = default;
  const GgufTensorInfo& info(const std::string& name) const;
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

/// The GGUF file `model` names: `model` itself when it is a file ending in .gguf, or the one .gguf
/// file of a directory without `unless` (config.json for a model, tokenizer.json for a tokenizer).
/// nullopt for anything else (a Hugging Face checkpoint); a directory holding several .gguf files
/// and no `unless` is a ConfigError listing them.
TORCHPATCH_API std::optional<std::filesystem::path> gguf_file_of(const std::filesystem::path& model,
                                                                 const char* unless = "config.json");

/// One tensor to write: its name, GGML type and the bytes (uint8 rows of whole blocks, or a float
/// tensor of the type's dtype for F32 / F16 / BF16), and its shape in LibTorch's order.
struct TORCHPATCH_API GgufTensorToWrite {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> shape;
  at::Tensor data;
};

/// Writes a GGUF version 3 file atomically (a temporary file renamed over `path`): `metadata` in the
/// order given, then the tensors aligned to `general.alignment` (32 unless the metadata says
/// otherwise). Refuses, naming the tensor, data whose size does not match its type and shape.
TORCHPATCH_API void save_gguf(const std::filesystem::path& path,
                              const std::vector<std::pair<std::string, GgufValue>>& metadata,
                              const std::vector<GgufTensorToWrite>& tensors);

}  // namespace torchpatch::checkpoint
