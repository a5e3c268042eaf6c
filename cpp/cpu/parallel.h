// fa2::cpu::parallel_for: at::parallel_for that also runs in parallel when this file is compiled without -fopenmp.
//
// With torch's OpenMP backend, at::parallel_for is a header template whose parallel branch exists only under
// _OPENMP; the extension build does not pass -fopenmp (torch's CMake config does not ask for it), so it silently
// runs serially — and worse, every BLAS call inside then thinks it is outside a parallel region and splits each
// small tile product over all threads (measured: 5-10x slower than serial on 2 cores). Here we open the same
// OpenMP team that `#pragma omp parallel` would, through libgomp's entry point GOMP_parallel, which torch's own
// libgomp provides (it is loaded with libtorch_cpu). Same static chunking and guards as ATen/ParallelOpenMP.h.
// If the build gains -fopenmp, or torch uses its native thread pool, this is plain at::parallel_for.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#if AT_PARALLEL_OPENMP && !defined(_OPENMP) && defined(__GNUC__)
#define FA2_CPU_CALL_GOMP 1
extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) __attribute__((weak));
int omp_get_num_threads() __attribute__((weak));
int omp_get_thread_num() __attribute__((weak));
}
#else
#define FA2_CPU_CALL_GOMP 0
#endif

namespace fa2::cpu {

#if FA2_CPU_CALL_GOMP
namespace parallel_detail {

template <typename F>
struct Team {
  int64_t begin, end, grain_size;
  const F* body;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
};

// Body of the OpenMP team: thread tid runs the tid-th contiguous chunk, exactly like at::internal::invoke_parallel.
template <typename F>
void run_chunk(void* data) {
  auto& team = *static_cast<Team<F>*>(data);
  int64_t num_threads = omp_get_num_threads();
  if (team.grain_size > 0) {
    num_threads = std::min<int64_t>(num_threads, at::divup(team.end - team.begin, team.grain_size));
  }
  const int64_t tid = omp_get_thread_num();
  const int64_t chunk_size = at::divup(team.end - team.begin, num_threads);
  const int64_t chunk_begin = team.begin + tid * chunk_size;
  if (chunk_begin >= team.end) return;
  try {
    at::internal::ThreadIdGuard tid_guard(tid);
    c10::ParallelGuard guard(true);
    (*team.body)(chunk_begin, std::min(team.end, chunk_begin + chunk_size));
  } catch (...) {
    if (!team.failed.test_and_set()) team.error = std::current_exception();
  }
}

}  // namespace parallel_detail
#endif

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain_size, const F& body) {
#if FA2_CPU_CALL_GOMP
  const bool have_gomp = GOMP_parallel != nullptr && omp_get_num_threads != nullptr && omp_get_thread_num != nullptr;
  const int64_t num_iterations = end - begin;
  if (have_gomp && num_iterations > grain_size && num_iterations > 1 && !at::in_parallel_region() &&
      at::get_num_threads() > 1) {
    parallel_detail::Team<F> team{begin, end, grain_size, &body};
    GOMP_parallel(&parallel_detail::run_chunk<F>, &team, /*num_threads=*/0, /*flags=*/0);
    if (team.error) std::rethrow_exception(team.error);
    return;
  }
#endif
  at::parallel_for(begin, end, grain_size, body);
}

}  // namespace fa2::cpu
