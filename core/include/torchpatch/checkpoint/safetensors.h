// Safetensors files: read through a memory map with every header field validated, and written
// atomically. Format: u64 little-endian header length, a JSON header, then the tensor bytes.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torchpatch::checkpoint {

/// Element types of the safetensors format that torchpatch reads and writes.
enum class Dtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

/// "F32", "BF16", ... as written in headers.
TORCHPATCH_API const char* dtype_name(Dtype dtype);
/// Bytes per element.
int64_t dtype_size(Dtype dtype);
/// The LibTorch scalar type of a dtype, and back (throws CheckpointError for unsupported types).
c10::ScalarType to_scalar_type(Dtype dtype);
TORCHPATCH_API Dtype from_scalar_type(c10::ScalarType type);

/// One tensor's header entry.
struct TORCHPATCH_API TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  ///< byte offset in the file (header already added)
  uint64_t end = 0;    ///< one past the last byte
};

/// Where a checkpoint's tensors come from: a safetensors file, or a file of another format read as
/// one (a GGUF model's tensors under their Hugging Face names).
class TORCHPATCH_API TensorSource {
 public:
  virtual ~TensorSource() = default;
  /// The file, for messages.
  virtual const std::filesystem::path& path() const = 0;
  /// Every tensor's entry; `begin` and `end` span its bytes in the file (their difference counts
  /// toward the progress a load reports).
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  /// nullptr when absent.
  virtual const TensorInfo* find(const std::string& name) const = 0;
  /// The named tensor, in the dtype and shape of its entry. Throws CheckpointError naming file and
  /// tensor when absent.
  virtual at::Tensor tensor(const std::string& name) const = 0;
  /// Whether `p` points into the file's memory mapping (a view tensor() returned).
  virtual bool maps(const void* p) const = 0;
};

/// A validated, memory-mapped safetensors file. Tensors returned by `tensor()` may view the mapping;
/// they keep the file mapped for as long as they live.
class TORCHPATCH_API SafetensorsFile : public TensorSource, public std::enable_shared_from_this<SafetensorsFile> {
 public:
  /// Maps and validates `path`. Throws CheckpointError naming the file (and the tensor, where one is
  /// at fault) for: a file shorter than 8 bytes, a header length past the end of the file, a header
  /// that is not a JSON object, an unknown dtype, a missing or malformed field, offsets out of range,
  /// overlapping or not covering the data, and `end - begin != numel * itemsize`.
  /// Only a regular file is opened (a FIFO or device is refused without blocking). `display`, when
  /// given, is the name used in messages and by path() (`path` may be a /proc/self/fd path).
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path,
                                               const std::filesystem::path& display = {});

  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const override { return path_; }
  /// Entries in ascending offset order.
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  /// nullptr when absent.
  const TensorInfo* find(const std::string& name) const override;
  /// The `__metadata__` string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The named tensor, on CPU, in its stored dtype. A zero-copy view of the mapping when the data is
  /// suitably aligned, else a copy. Throws CheckpointError naming file and tensor when absent.
  /// Views are copy-on-write (writing to them never changes the file), but the file must not be
  /// rewritten in place or truncated while they live: replace it by rename, as save_safetensors does.
  at::Tensor tensor(const std::string& name) const override;
  /// Whether `p` points into this file's mapping (a view tensor() returned).
  bool maps(const void* p) const override {
    const auto* byte = static_cast<const uint8_t*>(p);
    return byte >= data_ && byte < data_ + size_;
  }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;  // whole file mapping
  uint64_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (in the given order) to `path` atomically: a temporary file in the same
/// directory, flushed, then renamed over `path`. The header is padded to a multiple of 8 bytes.
/// Non-contiguous tensors are made contiguous; tensors must be on CPU. `wrote` hears each tensor's
/// bytes as they are written (progress).
TORCHPATCH_API void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const std::function<void(int64_t bytes)>& wrote = {});

}  // namespace torchpatch::checkpoint
