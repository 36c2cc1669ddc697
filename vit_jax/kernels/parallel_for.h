// ParallelFor: work spread over the calling thread and XLA's intra-op pool.
#ifndef VIT_JAX_KERNELS_PARALLEL_FOR_H_
#define VIT_JAX_KERNELS_PARALLEL_FOR_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "blas.h"
#include "xla/ffi/api/ffi.h"

namespace vit_jax {

// Runs work(i) for i in [0, count) on the calling thread and on up to
// pool.num_threads() tasks of XLA's pool. The caller waits only for work that
// was started, never for a task to be scheduled, so a busy pool cannot
// deadlock it: tasks that start late find nothing left and return.
template <typename Work>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t count, const Work& work) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto state = std::make_shared<State>();
  auto drain = [count](State& s, const Work& w) {
    // One BLAS thread per worker: the parallelism is over the items.
    const int previous = set_threads_local ? set_threads_local(1) : 0;
    for (int64_t i; (i = s.next.fetch_add(1)) < count;) {
      w(i);
      if (s.done.fetch_add(1) + 1 == count) {
        std::lock_guard<std::mutex> lock(s.mutex);
        s.finished.notify_all();
      }
    }
    if (set_threads_local) set_threads_local(previous);
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), count - 1);
  for (int64_t t = 0; t < helpers; ++t) {
    // `work` lives until this call returns, which is after its last item ran.
    pool.Schedule([state, drain, &work] { drain(*state, work); });
  }
  drain(*state, work);
  std::unique_lock<std::mutex> lock(state->mutex);
  state->finished.wait(lock, [&] { return state->done.load() == count; });
}

}  // namespace vit_jax

#endif  // VIT_JAX_KERNELS_PARALLEL_FOR_H_
