// How the kernels split their work across threads: `hlf::parallel_for`, and `hlf::run_as_team` for a whole decoding
// step's worth of kernel calls.
//
// Every kernel call used to open a parallel region of its own (`at::parallel_for`, OpenMP): a decoder of 6 layers makes
// about 66 of them per decoding step, each a few microseconds of work at one row per sentence. Between regions
// OpenMP's threads wait as `OMP_WAIT_POLICY` says: spinning (ACTIVE) or asleep in the kernel (PASSIVE, the setting
// for processes that share their cores), and waking a sleeping thread costs tens of microseconds, so at two threads
// under PASSIVE the int8 decoding loop ran 1.7x slower than at one. `run_as_team` opens one region for all the kernel
// calls of `fn` (the step's layers, `DecoderLayerSteps`): its first thread runs `fn`, the others wait for work
// spinning, then yielding their core (never asleep for the team's lifetime, which is one call's), and every
// `hlf::parallel_for` inside `fn` splits its range across them. So the wait policy applies once per step instead of
// once per kernel call. Outside a team `hlf::parallel_for` is `at::parallel_for`.
//
// The split is `at::parallel_for`'s: at most one chunk per thread, of ceil(range / chunks) items, none smaller than
// `grain` unless the range is; each item is computed by one thread, so no number depends on the thread count.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace hlf {

class Team {
 public:
  // Called by the team's first thread: `body(first, last)` over `[begin, end)` in chunks, the first chunk on this
  // thread, the others on the team's other threads; returns when every chunk is done (rethrowing the first error).
  template <class Body>
  void split(int64_t begin, int64_t end, int64_t grain, const Body& body) {
    const int64_t range = end - begin;
    if (range <= 0) return;
    const int64_t chunks =
        std::min<int64_t>(threads_, (range + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
    if (chunks <= 1) {
      body(begin, end);
      return;
    }
    const int64_t chunk = (range + chunks - 1) / chunks;
    run_chunk_ = [](const void* context, int64_t first, int64_t last) {
      (*static_cast<const Body*>(context))(first, last);
    };
    body_ = &body;
    begin_ = begin;
    end_ = end;
    chunk_ = chunk;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    epoch_.fetch_add(1, std::memory_order_release);  // publishes the task to the waiting threads
    run_chunk(0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0;) back_off(spins);
    if (failed_.load(std::memory_order_acquire)) {
      failed_.store(false, std::memory_order_relaxed);
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

  // Called by each of the team's other threads (`thread` >= 1): runs its chunk of every task until dismissed, in the
  // first thread's thread-local state (`state`: inference mode, dispatch keys, ...), as its ATen calls need
  void serve(int thread, const at::ThreadLocalState& state) {
    const at::ThreadLocalStateGuard state_guard(state);
    uint64_t seen = 0;
    for (;;) {
      uint64_t epoch;
      for (int spins = 0; (epoch = epoch_.load(std::memory_order_acquire)) == seen;) back_off(spins);
      seen = epoch;
      if (dismissed_.load(std::memory_order_acquire)) return;
      run_chunk(thread);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  void set_threads(int threads) { threads_ = threads; }
  void dismiss() {
    dismissed_.store(true, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_release);
  }

 private:
  void run_chunk(int thread) {
    const int64_t first = begin_ + thread * chunk_;
    if (first >= end_) return;
    try {
      run_chunk_(body_, first, std::min(end_, first + chunk_));
    } catch (...) {
      bool expected = false;
      if (failed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) error_ = std::current_exception();
    }
  }

  // spinning while work is about to come (the next kernel call of the step is microseconds away), then giving the
  // core to whatever else wants it: on shared cores a spinning thread would take a time slice from the one it waits for
  static void back_off(int& spins) {
    if (++spins < kSpinsBeforeYielding) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
  static constexpr int kSpinsBeforeYielding = 4096;  // ~40 us of `pause` on current x86 cores

  int threads_ = 1;
  void (*run_chunk_)(const void*, int64_t, int64_t) = nullptr;
  const void* body_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> dismissed_{false}, failed_{false};
  std::exception_ptr error_;
};

// The team whose first thread this is, while it runs `run_as_team`'s `fn` (null elsewhere).
inline thread_local Team* active_team = nullptr;

inline bool in_team() { return active_team != nullptr; }

// `body(first, last)` over `[begin, end)`: across the active team's threads, else through `at::parallel_for`.
template <class Body>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  if (active_team != nullptr) {
    active_team->split(begin, end, grain, body);
  } else {
    at::parallel_for(begin, end, grain, body);
  }
}

// Runs `fn` on this thread with torch's other threads (`at::get_num_threads()`) as its team for the
// `hlf::parallel_for`s inside it; on one thread, inside another parallel region or team, or without OpenMP: `fn()`.
template <class Fn>
void run_as_team(const Fn& fn) {
#ifdef _OPENMP
  const int threads = at::get_num_threads();
  if (threads > 1 && active_team == nullptr && !at::in_parallel_region()) {
    Team team;
    const at::ThreadLocalState state;  // this thread's
    std::exception_ptr error;
#pragma omp parallel num_threads(threads)
    {
      const int thread = omp_get_thread_num();
      if (thread == 0) {
        team.set_threads(omp_get_num_threads());  // OpenMP may give fewer than asked for
        active_team = &team;
        try {
          fn();
        } catch (...) {
          error = std::current_exception();
        }
        active_team = nullptr;
        team.dismiss();
      } else {
        team.serve(thread, state);
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
#endif
  fn();
}

}  // namespace hlf
