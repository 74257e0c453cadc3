// What the machine has, for the checks made before a large allocation.
#pragma once

#include <unistd.h>

namespace torchpatch {

/// Bytes of physical memory (0 where the system does not say).
inline double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<double>(pages) * static_cast<double>(page_size) : 0;
}

}  // namespace torchpatch
