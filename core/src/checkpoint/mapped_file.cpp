#include "checkpoint/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <fmt/format.h>

#include "torchpatch/checkpoint/atomic_file.h"
#include "torchpatch/error.h"

namespace torchpatch::checkpoint {

std::pair<const uint8_t*, uint64_t> map_file(const std::filesystem::path& io, const std::filesystem::path& path,
                                             uint64_t min_bytes, const char* format) {
  const auto fail = [&](const std::string& cause) { return CheckpointError(fmt::format("{}: {}", path.string(), cause)); };
  // Non-blocking: opening a FIFO would otherwise wait for a writer.
  const int fd = ::open(io.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw fail(fmt::format("cannot open: {}", errno_text(errno)));
  struct stat st {};
  const int stat_err = ::fstat(fd, &st) != 0 ? errno : 0;
  std::string refusal;
  if (stat_err != 0) refusal = fmt::format("cannot stat: {}", errno_text(stat_err));
  else if (!S_ISREG(st.st_mode)) refusal = S_ISDIR(st.st_mode) ? "a directory, not a regular file" : "not a regular file";
  else if (static_cast<uint64_t>(st.st_size) < min_bytes || st.st_size == 0) {
    refusal = fmt::format("truncated: {} bytes, a {} needs at least {}", st.st_size, format, min_bytes);
  }
  if (!refusal.empty()) {  // also rules out mapping an empty file
    ::close(fd);
    throw fail(refusal);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED) throw fail(fmt::format("cannot map: {}", errno_text(map_err)));
  return {static_cast<const uint8_t*>(map), size};
}

void unmap_file(const uint8_t* data, uint64_t size) {
  if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), size);
}

}  // namespace torchpatch::checkpoint
