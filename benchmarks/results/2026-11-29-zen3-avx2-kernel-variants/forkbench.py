import torch
from torch.utils import cpp_extension
src = r'''
#include <ATen/Parallel.h>
#include <chrono>
#include <torch/extension.h>
double fork_us(int64_t n, int64_t range) {
  volatile int64_t sink = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i)
    at::parallel_for(0, range, 1, [&](int64_t a, int64_t b) { sink += b - a; });
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
}
'''
m = cpp_extension.load_inline("forkbench", cpp_sources=src, functions=["fork_us"], extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"])
for th in (1, 2):
    torch.set_num_threads(th)
    m.fork_us(1000, 2)
    print(th, "threads:", [round(m.fork_us(20000, 2), 2) for _ in range(5)], "us per parallel_for over 2 items")
