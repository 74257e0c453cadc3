// Internal: parallel loops for the decode kernels, on a team of spinning worker threads.
//
// at::parallel_for costs 3-5 µs to start and join a region on this kind of machine (OpenMP wakes
// sleeping threads through the kernel), which is what a whole single-token product of 300 KB takes.
// The team's workers spin on a counter for a while after each region instead, so a region starts
// with one write they see, and small products can be split too. They go to sleep
// after kSpinFor without work, so they do not hold a core that OpenMP (the BLAS) wants.
#pragma once

#include <cstdint>

namespace torchpatch::base {

using RangeFn = void (*)(const void* body, int64_t begin, int64_t end);

/// Runs body(begin, end) over [begin, end) in contiguous parts of equal size (to within one), the
/// first on the calling thread: at most at::get_num_threads() parts and at most ceil(n / grain), so a
/// part is over half a grain. Runs inline when that is one part, when called from inside a parallel
/// region (the team's or OpenMP's) and while another host thread has the team. Rethrows the first
/// exception a part threw, after every part has ended.
void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* body);

template <class Body>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  if (end - begin <= grain) {
    if (begin < end) body(begin, end);
    return;
  }
  parallel_for(
      begin, end, grain, [](const void* b, int64_t from, int64_t to) { (*static_cast<const Body*>(b))(from, to); },
      &body);
}

}  // namespace torchpatch::base
