// Names from files and plugins go to terminals: escaped so that they cannot move the cursor, clear the
// screen or forge lines of output.
#pragma once

#include "torchpatch/export.h"

#include <string>
#include <string_view>

namespace torchpatch {

/// `text` with control characters (C0, DEL, C1) and bytes that are not UTF-8 written as `\xNN`
/// (`\n`, `\t`, `\r` as such); printable text, UTF-8 and backslashes included, is kept as it is (so
/// regular expressions read as written).
TORCHPATCH_API std::string printable(std::string_view text);

/// printable(), cut to its first `max_bytes` bytes of `text` and "... (N more bytes)": for text a file
/// chose, which may be any length.
TORCHPATCH_API std::string printable(std::string_view text, std::size_t max_bytes);

/// A message for a terminal: each line printable() and cut to `max_line` bytes, the newlines kept.
TORCHPATCH_API std::string printable_lines(std::string_view text, std::size_t max_line = 4096);

}  // namespace torchpatch
