// Structures (or trees) of a batch as units of work over a few threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace zmat {

// f(i) for i in [0, count) on up to `threads` threads (the caller's among
// them). Units are handed out one at a time, so a thread that shares its core
// with another process takes fewer of them instead of holding the others up.
template <typename F>
void parallel_for(int64_t count, int64_t threads, const F& f) {
  if (threads > count) threads = count;
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto run = [&] {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) f(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
}

}  // namespace zmat
