#include "base/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

#include <ATen/ATen.h>

namespace torchpatch::base {

at::Tensor empty_in_huge_pages(at::IntArrayRef sizes, const at::TensorOptions& options) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  const std::size_t bytes = static_cast<std::size_t>(numel) * options.dtype().itemsize();
  if (bytes < kHuge) return at::empty(sizes, options);
  const std::size_t length = bytes + kHuge;  // room to align the start to 2 MiB
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return at::empty(sizes, options);
  auto* start = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(base) + kHuge - 1) / kHuge * kHuge);
  ::madvise(start, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // whole huge pages only
  return at::from_blob(start, sizes, [base, length](void*) { ::munmap(base, length); }, options);
}

}  // namespace torchpatch::base
