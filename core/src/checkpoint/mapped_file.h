// A whole file mapped for reading, as the checkpoint readers (safetensors, GGUF) hold their files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>

namespace torchpatch::checkpoint {

/// Maps the regular file `io` whole, private and writable: pages are shared with the page cache until
/// written, and a write (a training step on a parameter loaded as a view) copies the page instead of
/// touching the file. CheckpointError naming `path` for a file that cannot be opened, is not a
/// regular file (a FIFO or device is refused without blocking), or is shorter than `min_bytes`
/// (`format` names what it should be, for that message). Release with unmap_file.
std::pair<const uint8_t*, uint64_t> map_file(const std::filesystem::path& io, const std::filesystem::path& path,
                                             uint64_t min_bytes, const char* format);

void unmap_file(const uint8_t* data, uint64_t size);

}  // namespace torchpatch::checkpoint
