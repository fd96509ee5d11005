// Structures (or trees) of a batch as units of work over a few threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

// GNU OpenMP's entry point, where a libgomp is loaded into the global scope
// (torch's own, on Linux builds of torch that use it), else null: weak, so
// the library links and loads without it (Linux only: other linkers refuse
// an undefined weak symbol without extra flags).
using zmat_gomp_parallel = void (*)(void (*fn)(void*), void* data, unsigned threads, unsigned flags);
#if defined(__linux__)
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned threads, unsigned flags)
    __attribute__((weak));
inline zmat_gomp_parallel zmat_gomp() { return GOMP_parallel; }
#else
inline zmat_gomp_parallel zmat_gomp() { return nullptr; }
#endif

namespace zmat {

// f(i) for i in [0, count) on up to `threads` threads (the caller's among
// them). Units are handed out one at a time, so a thread that shares its core
// with another process takes fewer of them instead of holding the others up.
// The threads are torch's OpenMP team where torch's libgomp is loaded: a
// thread of our own would share its core with an OpenMP worker that still
// spins after torch's last parallel op (but the team's end waits for a
// worker whose core another process holds). Else the helpers are detached and
// the caller waits only for the units begun: a helper that starts late (its
// core busy) finds none left and leaves, touching only the shared counters,
// instead of the caller waiting a time slice for it to start.
// `team` false: always the detached helpers (work of a few ms, where a team
// member whose core is busy would hold the caller up longer than the work).
template <typename F>
void parallel_for(int64_t count, int64_t threads, const F& f, bool team = true) {
  if (threads > count) threads = count;
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) f(i);
    return;
  }
  if (const zmat_gomp_parallel gomp = team ? zmat_gomp() : nullptr) {  // torch's own OpenMP threads: idle ones spin a while, ready at once
    struct Work {
      const F* fn;
      int64_t count;
      std::atomic<int64_t> next{0};
    } work{&f, count};
    auto run = [](void* data) {
      Work* w = static_cast<Work*>(data);
      for (int64_t i; (i = w->next.fetch_add(1, std::memory_order_relaxed)) < w->count;) (*w->fn)(i);
    };
    gomp(run, &work, static_cast<unsigned>(threads), 0);  // returns when every thread is done
    return;
  }
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto c = std::make_shared<Counters>();
  const F* fn = &f;  // called only for units begun, while the caller waits
  auto run = [c, fn, count] {
    for (int64_t i; (i = c->next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      (*fn)(i);
      c->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < threads; ++t) std::thread(run).detach();
  run();
  while (c->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

}  // namespace zmat
