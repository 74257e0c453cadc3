// A file written whole or not at all. Bytes go to a temporary file beside the target; commit()
// flushes it to disk, renames it over the target and makes the rename durable. Destroyed without
// commit(), the temporary file is removed and the target is untouched. Every failure is a
// CheckpointError naming the file and the cause.
#pragma once

#include "torchpatch/export.h"

#include <cstddef>
#include <filesystem>
#include <string>

namespace torchpatch::checkpoint {

class TORCHPATCH_API AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  void write(const std::string& text) { write(text.data(), text.size()); }
  /// Durable on return: the data and the rename are on disk.
  void commit();

 private:
  [[noreturn]] void fail(const char* what, int err);
  std::filesystem::path target_;
  std::string temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

/// `text` as the whole content of `target`, atomically and durably.
TORCHPATCH_API void write_file_atomically(const std::filesystem::path& target, const std::string& text);

/// strerror for messages.
TORCHPATCH_API std::string errno_text(int err);

}  // namespace torchpatch::checkpoint
