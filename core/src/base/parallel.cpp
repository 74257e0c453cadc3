#include "base/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <pthread.h>

namespace torchpatch::base {

namespace {

// How long an idle worker spins before it sleeps: longer than the gaps between a decode step's
// products (a few to tens of µs), short against a BLAS call that wants the core.
constexpr auto kSpinFor = std::chrono::microseconds(200);

thread_local bool inside_team = false;

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class Team {
 public:
  /// False when another thread holds the team: the caller runs the loop itself.
  bool try_run(int parts, int64_t begin, int64_t end, RangeFn fn, const void* body) {
    std::unique_lock<std::mutex> owner(run_mutex_, std::try_to_lock);
    if (!owner) return false;
    try {
      grow(parts - 1);
    } catch (...) {  // no thread to be had: work with those there are
    }
    parts = std::min(parts, static_cast<int>(workers_.size()) + 1);
    if (parts < 2) return false;
    job_ = Job{fn, body, begin, end - begin, parts};
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      wake_.notify_all();
    }
    inside_team = true;  // a loop inside part 0 runs inline
    run_part(0);
    inside_team = false;
    while (pending_.load(std::memory_order_acquire) > 0) relax();
    if (auto error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
    return true;
  }

 private:
  struct Job {
    RangeFn fn = nullptr;
    const void* body = nullptr;
    int64_t begin = 0, size = 0;
    int parts = 0;
  };

  void grow(int workers) {
    while (static_cast<int>(workers_.size()) < workers) {
      const int part = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = generation_.load();  // read here: the thread may start after the next job
      workers_.emplace_back([this, part, seen] { work(part, seen); });
    }
  }

  void run_part(int part) {
    if (part >= job_.parts) return;
    // Parts of equal size to within one: [size * p / parts, size * (p + 1) / parts).
    const int64_t from = job_.begin + job_.size * part / job_.parts;
    const int64_t to = job_.begin + job_.size * (part + 1) / job_.parts;
    if (from >= to) return;
    try {
      job_.fn(job_.body, from, to);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void work(int part, uint64_t seen) {
    inside_team = true;
    for (;;) {
      wait_for_job(seen);
      seen = generation_.load(std::memory_order_acquire);
      run_part(part);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  // Spins until the generation moves past `seen`, sleeping when that takes longer than kSpinFor.
  void wait_for_job(uint64_t seen) {
    auto spin_start = std::chrono::steady_clock::now();
    for (uint32_t spins = 1;; ++spins) {
      if (generation_.load(std::memory_order_acquire) != seen) return;
      relax();
      if (spins % 256 != 0 || std::chrono::steady_clock::now() - spin_start < kSpinFor) continue;
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
      sleeping_.fetch_sub(1, std::memory_order_relaxed);
      spin_start = std::chrono::steady_clock::now();
    }
  }

  std::mutex run_mutex_;  // one loop at a time
  Job job_;
  std::exception_ptr error_;
  std::mutex error_mutex_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleeping_{0};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
};

// A forked child has none of the workers: it runs every loop itself.
std::atomic<bool> forked{false};

// Never destroyed: the workers run until the process ends, and a forked child must not join them.
Team& team() {
  static Team* const instance = [] {
    ::pthread_atfork(nullptr, nullptr, [] { forked.store(true); });
    return new Team;
  }();
  return *instance;
}

}  // namespace

void parallel_for(int64_t begin, int64_t end, int64_t grain, RangeFn fn, const void* body) {
  if (begin >= end) return;
  const int64_t step = std::max<int64_t>(grain, 1);
  const int parts = static_cast<int>(std::min<int64_t>((end - begin + step - 1) / step, at::get_num_threads()));
  const bool alone = parts < 2 || inside_team || forked.load(std::memory_order_relaxed) || at::in_parallel_region();
  if (alone || !team().try_run(parts, begin, end, fn, body)) fn(body, begin, end);
}

}  // namespace torchpatch::base
