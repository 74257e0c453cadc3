// Internal: fresh tensors for large data written once (conversion outputs, packed weights), backed
// by transparent huge pages where the kernel offers them: one page fault per 2 MiB instead of per
// 4 KiB, which is most of the cost of writing such a tensor on machines where faults are slow.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchpatch::base {

/// at::empty(sizes, options), from 2 MiB on mapped so that its whole 2 MiB pages may be huge pages
/// (the last, partial one stays in small pages: no memory past the tensor is faulted in). Falls back
/// to at::empty when the mapping fails.
at::Tensor empty_in_huge_pages(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace torchpatch::base
