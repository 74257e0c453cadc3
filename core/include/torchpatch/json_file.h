// Reading JSON from files nobody vouches for: only regular files are opened (a FIFO, device or
// directory is refused without blocking), the size and the nesting depth are bounded, and trailing
// bytes after the value are an error. Errors are the caller's type (ConfigError, CheckpointError,
// ...) and name the file and the cause.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace torchpatch {

struct TORCHPATCH_API JsonLimits {
  /// Bytes of text accepted.
  std::uint64_t max_bytes = std::uint64_t{64} << 20;
  /// Arrays and objects nested deeper than this are refused (the parsed value is then safe to copy,
  /// dump and destroy without deep recursion).
  int max_depth = 64;
};

/// Throws the caller's error type with a full message ("FILE: cause").
using JsonFailure = std::function<void(const std::string& message)>;

/// Parses `text` as one JSON value within `limits`. Messages read "SOURCE: WHAT is not valid JSON:
/// ..." (`what` empty: "SOURCE: not valid JSON: ...").
TORCHPATCH_API nlohmann::json parse_json(const std::string& text, const std::string& source, const JsonFailure& fail,
                                         const JsonLimits& limits = {}, const std::string& what = {});

/// The text of the regular file `path`: anything else is refused without blocking; a file larger
/// than `max_bytes` is refused before it is read. `source` names it in messages (default: the path).
TORCHPATCH_API std::string read_regular_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                                             const JsonFailure& fail, const std::string& source = {});

/// read_regular_file, then parse_json.
TORCHPATCH_API nlohmann::json read_json_file(const std::filesystem::path& path, const JsonFailure& fail,
                                             const JsonLimits& limits = {}, const std::string& source = {});

/// Whether `path` exists at all (a dangling symlink counts as existing: opening it will say why).
TORCHPATCH_API bool path_exists(const std::filesystem::path& path);

}  // namespace torchpatch
