#!/bin/bash
# usage: mkharness.sh SRC OUT  -- standalone timing of block<R,BITS> over an L2-resident weight slab
SRC=$1; OUT=$2
end=$(grep -n '^using BlockFn' $SRC | cut -d: -f1)
{ sed -n "1,$((end-1))p" $SRC | grep -v 'torch/csrc\|#include "tensor.h"'
cat <<'EOC'
}  // namespace
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
int main(int argc, char** argv) {
  const int64_t K = 1536, NB = getenv("NB") ? atoi(getenv("NB")) : 8;  // 128 columns: 4-bit 98 KB, in L2
  const int bits = argc > 1 ? atoi(argv[1]) : 4;
  std::vector<uint8_t> w(NB * K * bits * 2), c(NB * K); std::vector<uint16_t> u(NB * 8 * 32, 0x3c00);
  std::vector<int8_t> xq(8 * K); std::vector<float> xs(8 * K / 32, 1.f), sx(8, 1.f), y(8 * NB * 16);
  srand(1); for (auto& v : w) v = rand(); for (auto& v : c) v = rand() & 127; for (auto& v : xq) v = (rand() % 255) - 127;
  auto run = [&](auto fn, int R) {
    double best = 1e9;
    for (int rep = 0; rep < 7; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < 3200 / NB; ++it)
        for (int64_t nb = 0; nb < NB; ++nb)
          fn(w.data() + nb * K * bits * 2, c.data() + nb * K / 32 * 32, u.data() + nb * 32, xq.data(), xs.data(), sx.data(), nullptr, K, y.data() + nb * 16, NB * 16);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, dt);
    }
    double mb = (3200 / NB) * (double)NB * 16 * K * R / 32;  // 256-bit multiply instructions' worth (32 products)
    printf("R=%d bits=%d: %.3f ms, %.2f products/32 per cycle at 3.67 GHz\n", R, bits, best * 1e3, mb / best / 3.67e9);
  };
  if (bits == 4) { run(block<1,4>, 1); run(block<2,4>, 2); run(block<4,4>, 4); run(block<5,4>, 5); run(block<6,4>, 6); }
  else { run(block<1,6>, 1); run(block<2,6>, 2); run(block<4,6>, 4); run(block<5,6>, 5); run(block<6,6>, 6); }
  fprintf(stderr, "%f\n", y[3]);
}
EOC
} > $OUT
