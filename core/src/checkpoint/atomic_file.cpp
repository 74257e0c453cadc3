#include "torchpatch/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "torchpatch/error.h"

namespace torchpatch::checkpoint {

std::string errno_text(int err) { return std::strerror(err); }

AtomicFile::AtomicFile(std::filesystem::path target)
    : target_(std::move(target)), temporary_(fmt::format("{}.tmp.{}", target_.string(), ::getpid())) {
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    throw CheckpointError(fmt::format("{}: cannot create '{}': {}", target_.string(), temporary_, errno_text(errno)));
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(temporary_.c_str());
}

void AtomicFile::fail(const char* what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.c_str());
  committed_ = true;  // nothing left to clean up
  throw CheckpointError(fmt::format("{}: cannot {} '{}': {}", target_.string(), what, temporary_, errno_text(err)));
}

void AtomicFile::write(const void* data, std::size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<std::size_t>(size, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("flush", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary_.c_str());
    committed_ = true;
    throw CheckpointError(fmt::format("{}: cannot rename '{}' over it: {}", target_.string(), temporary_, errno_text(err)));
  }
  committed_ = true;
  // Make the rename itself durable.
  std::filesystem::path dir = target_.parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    const int err = errno;
    if (dir_fd >= 0) ::close(dir_fd);
    throw CheckpointError(fmt::format("{}: written, but the directory {} could not be synced: {}", target_.string(),
                                      dir.string(), errno_text(err)));
  }
  ::close(dir_fd);
}

void write_file_atomically(const std::filesystem::path& target, const std::string& text) {
  AtomicFile file(target);
  file.write(text);
  file.commit();
}

}  // namespace torchpatch::checkpoint
