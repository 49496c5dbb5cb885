// How the kernels split their work across threads: `hlf::parallel_for`, served by a pool of threads the package owns.
//
// A decoding step is about 70 kernel calls of a few to a few hundred microseconds each, with the Python of the loop
// between steps. Through OpenMP (`at::parallel_for`) every call opened a parallel region, and between regions
// OpenMP's threads wait as `OMP_WAIT_POLICY` says: spinning (ACTIVE), or asleep in the kernel (PASSIVE, the setting for
// processes that share their cores), where waking them costs tens of microseconds per call. So two threads were slower
// than one under PASSIVE, and a region per step (a team for the layers' calls) still left the calls between steps
// paying it. The pool's threads instead spin for `kSpinBeforeParking` after each task (a step's next kernel call is
// microseconds away), then park on a condition variable until the next one, whatever the policy; and the caller
// claims chunks like any pool thread, so a chunk whose thread is still waking up (or descheduled on a busy core) is
// run by the caller instead of waited for: two threads are never much slower than one.
//
// Where OpenMP's idle threads spin instead (`OMP_WAIT_POLICY=ACTIVE`: they never sleep, and a pool beside them would
// share their cores), `hlf::parallel_for` is `at::parallel_for`: its regions are cheap there (`parallel_backend`).
//
// Each thread that calls the kernels has its own pool of `at::get_num_threads() - 1` threads (made on its first call
// with more than one thread, remade when that count changes), as each OpenMP master thread has its own team: batches
// translated side by side in Python threads (`translate(..., inter_threads=N)`) do not share one. Inside a pool
// thread, or inside a parallel region, `hlf::parallel_for` runs its range on the calling thread.
//
// The split is `at::parallel_for`'s: at most one chunk per thread, of ceil(range / chunks) items, none smaller than
// `grain` unless the range is; each item is computed by one thread, so no number depends on the thread count or on
// which thread ran a chunk.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>
#include <strings.h>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace hlf {

// While alive, OpenMP regions opened on this thread (oneDNN's inside `at::_int_mm`) run on this thread alone: the
// pool's threads run the rest of the range.
class OneOpenMpThread {
 public:
  OneOpenMpThread() {
#ifdef _OPENMP
    previous_ = omp_get_max_threads();
    if (previous_ != 1) omp_set_num_threads(1);
#endif
  }
  ~OneOpenMpThread() {
#ifdef _OPENMP
    if (previous_ != 1) omp_set_num_threads(previous_);
#endif
  }
  OneOpenMpThread(const OneOpenMpThread&) = delete;
  OneOpenMpThread& operator=(const OneOpenMpThread&) = delete;

 private:
  int previous_ = 1;
};

// Whether this thread is one of a pool's (its `parallel_for`s run on it alone).
inline thread_local bool in_pool_thread = false;

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    threads_.reserve(static_cast<size_t>(workers));
    for (int worker = 0; worker < workers; ++worker) threads_.emplace_back([this] { serve(); });
  }

  ~ThreadPool() {
    stopping_.store(true, std::memory_order_seq_cst);
    { const std::lock_guard<std::mutex> lock(mutex_); }
    wakeup_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }

  // `body(first, last)` for the `chunks` chunks of `chunk` items of `[begin, end)`, on this thread and the pool's;
  // returns when every chunk is done, rethrowing the first error.
  template <class Body>
  void split(int64_t begin, int64_t end, int64_t chunks, int64_t chunk, const Body& body) {
    run_chunk_ = [](const void* context, int64_t first, int64_t last) {
      (*static_cast<const Body*>(context))(first, last);
    };
    body_ = &body;
    begin_ = begin;
    end_ = end;
    chunk_ = chunk;
    chunks_.store(chunks, std::memory_order_relaxed);
    unfinished_.store(chunks, std::memory_order_relaxed);
    task_number_ = task_number_ == kMaxTaskNumber ? 1 : task_number_ + 1;  // 0: no task yet
    // publishes the task (the fields above) to the threads that claim its chunks; seq_cst, with the load of `parked_`
    // below and the parking threads' increment and load: a thread either sees the task or is woken for it
    task_.store(static_cast<uint64_t>(task_number_) << 32, std::memory_order_seq_cst);
    if (parked_.load(std::memory_order_seq_cst) > 0) {
      { const std::lock_guard<std::mutex> lock(mutex_); }
      wakeup_.notify_all();
    }
    run_chunks(task_number_);
    for (int spins = 0; unfinished_.load(std::memory_order_acquire) != 0;) back_off(spins);
    if (failed_.load(std::memory_order_acquire)) {
      failed_.store(false, std::memory_order_relaxed);
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

 private:
  // the task's number in the high 32 bits of `task_`, the index of its next unclaimed chunk in the low ones
  static constexpr uint32_t kMaxTaskNumber = 0xffffffffu;
  // how long a pool thread spins for the next task before parking: longer than the gaps between a decoding step's
  // kernel calls, shorter than a time slice a core shared with other work would miss
  static constexpr std::chrono::microseconds kSpinBeforeParking{200};

  void serve() {
    in_pool_thread = true;
    const OneOpenMpThread one_thread;  // for good: ATen calls inside a chunk stay on this thread
    pthread_setname_np(pthread_self(), "hlf-kernels");
    uint32_t seen = 0;
    for (;;) {
      const uint32_t task = wait_for_task(seen);
      if (stopping_.load(std::memory_order_acquire)) return;
      seen = task;
      run_chunks(task);
    }
  }

  // The number of the first task after `seen` (or `seen` when stopping): spinning for `kSpinBeforeParking`, then
  // parked until woken.
  uint32_t wait_for_task(uint32_t seen) {
    const auto parking_time = std::chrono::steady_clock::now() + kSpinBeforeParking;
    for (uint32_t spins = 1;; ++spins) {
      const auto task = static_cast<uint32_t>(task_.load(std::memory_order_acquire) >> 32);
      if (task != seen || stopping_.load(std::memory_order_relaxed)) return task;
      pause();
      if (spins % 64 == 0 && std::chrono::steady_clock::now() >= parking_time) break;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    parked_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t task;
    while ((task = static_cast<uint32_t>(task_.load(std::memory_order_seq_cst) >> 32)) == seen &&
           !stopping_.load(std::memory_order_seq_cst)) {
      wakeup_.wait(lock);
    }
    parked_.fetch_sub(1, std::memory_order_relaxed);
    return task;
  }

  // Claims and runs chunks of task `task` until none is left (or a later task replaced it: a thread that saw `task`
  // late claims nothing of the next one, whose fields it has not synchronised with).
  void run_chunks(uint32_t task) {
    uint64_t word = task_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(word >> 32) != task) return;
      const auto index = static_cast<int64_t>(word & 0xffffffffu);
      if (index >= chunks_.load(std::memory_order_relaxed)) return;
      if (!task_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        continue;
      }
      run_chunk(index);
      unfinished_.fetch_sub(1, std::memory_order_acq_rel);
      word = task_.load(std::memory_order_acquire);
    }
  }

  void run_chunk(int64_t index) {
    const int64_t first = begin_ + index * chunk_;
    if (first >= end_) return;
    try {
      run_chunk_(body_, first, std::min(end_, first + chunk_));
    } catch (...) {
      bool expected = false;
      if (failed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) error_ = std::current_exception();
    }
  }

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  // the caller waiting for the chunks other threads claimed: spinning (they are running), then giving the core to
  // whatever else wants it (one of them may be descheduled, and on a shared core spinning would delay it)
  static void back_off(int& spins) {
    if (++spins < kSpinsBeforeYielding) {
      pause();
    } else {
      std::this_thread::yield();
    }
  }
  static constexpr int kSpinsBeforeYielding = 4096;

  std::vector<std::thread> threads_;
  uint32_t task_number_ = 0;  // the caller's
  void (*run_chunk_)(const void*, int64_t, int64_t) = nullptr;
  const void* body_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;
  std::atomic<uint64_t> task_{0};
  std::atomic<int64_t> chunks_{0}, unfinished_{0};
  std::atomic<int> parked_{0};
  std::atomic<bool> stopping_{false}, failed_{false};
  std::exception_ptr error_;
  std::mutex mutex_;
  std::condition_variable wakeup_;
};

// The calling thread's pool (none before its first parallel call).
inline std::unique_ptr<ThreadPool>& thread_pool_slot() {
  thread_local std::unique_ptr<ThreadPool> pool;
  return pool;
}

// The calling thread's pool of `threads - 1` threads.
inline ThreadPool& thread_pool(int threads) {
  static std::once_flag fork_handler;
  // a forked child has none of the pool's threads (only the forking one): it leaks the pool it inherited (joining
  // threads that do not exist would hang) and makes its own on its first call
  std::call_once(fork_handler, [] {
    pthread_atfork(nullptr, nullptr, [] { (void)thread_pool_slot().release(); });
  });
  auto& pool = thread_pool_slot();
  if (!pool || pool->workers() != threads - 1) {
    pool.reset();
    pool = std::make_unique<ThreadPool>(threads - 1);
  }
  return *pool;
}

// How many threads this thread's `parallel_for`s use on the pool: `set_kernel_threads`'s count where set (0: torch's,
// `at::get_num_threads()`). The fast loop sets torch's count here and runs torch's own operators on one thread
// meanwhile (`cpu_kernels.torch_operators_on_one_thread`), so that OpenMP's threads, which spin for a while after each
// region under the default wait policy, do not share the cores with the pool's.
inline thread_local int kernel_threads_setting = 0;

inline int kernel_threads() { return kernel_threads_setting > 0 ? kernel_threads_setting : at::get_num_threads(); }

// While alive, the kernels called on this thread run on it alone, on either backend (`parallel_for` below), as do the
// OpenMP regions it opens
class OneKernelThread {
 public:
  OneKernelThread() : previous_(kernel_threads_setting) { kernel_threads_setting = 1; }
  ~OneKernelThread() { kernel_threads_setting = previous_; }
  OneKernelThread(const OneKernelThread&) = delete;
  OneKernelThread& operator=(const OneKernelThread&) = delete;

 private:
  const OneOpenMpThread one_openmp_thread_;  // at::parallel_for's threads: the OpenMP backend's
  const int previous_;
};

// The threads `parallel_for` runs on besides the caller's: the calling thread's pool, or OpenMP's (`at::parallel_for`).
enum class ParallelBackend : int { pool = 0, openmp = 1 };

// OpenMP's where its idle threads spin (`OMP_WAIT_POLICY=ACTIVE`, as OpenMP reads it at start: any case), else the pool
inline ParallelBackend default_parallel_backend() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy != nullptr && strcasecmp(policy, "active") == 0 ? ParallelBackend::openmp : ParallelBackend::pool;
}

// The backend in use: the default until `set_parallel_backend` (the tests run the kernels on each).
inline std::atomic<ParallelBackend>& parallel_backend() {
  static std::atomic<ParallelBackend> backend{default_parallel_backend()};
  return backend;
}

// `body(first, last)` over `[begin, end)` in chunks of at least `grain` items: across the calling thread and its pool
// (`kernel_threads()` threads in all), or OpenMP's threads (`at::get_num_threads()`, `parallel_backend`); on the
// calling thread alone inside a pool thread or a parallel region.
template <class Body>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  if (parallel_backend().load(std::memory_order_relaxed) == ParallelBackend::openmp) {
    at::parallel_for(begin, end, grain, body);
    return;
  }
  const int64_t range = end - begin;
  if (range <= 0) return;
  const int threads = in_pool_thread || at::in_parallel_region() ? 1 : kernel_threads();
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(threads, (range + grain - 1) / grain);
  if (chunks <= 1) {
    body(begin, end);
    return;
  }
  thread_pool(threads).split(begin, end, chunks, (range + chunks - 1) / chunks, body);
}

}  // namespace hlf
