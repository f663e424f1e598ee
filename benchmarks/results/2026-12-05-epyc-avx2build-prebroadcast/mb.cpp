// microbench: AVX2 block<R,4> loop, copied from w4a8.cpp (AVX2 build)
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <vector>
#include <algorithm>
typedef int32_t int32_u __attribute__((may_alias, aligned(1)));
inline int32_t x4(const int8_t* x) { return *reinterpret_cast<const int32_u*>(x); }
constexpr int kUnitGroups = 8;
#ifndef PF
#define PF 4096
#endif
inline __m256 bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
#include "variant.h"

int main(int argc, char** argv) {
  const int R = ROWS;
  const int64_t K = atoi(argv[1]);   // inputs
  const int64_t NB = atoi(argv[2]);  // 16-col blocks
  const int reps = atoi(argv[3]);
  const int64_t G = K / 32, U = (G + 7) / 8, G2 = (G + 1) / 2;
  std::vector<uint8_t> w(NB * K * 8, 0), c(NB * G * 32);
  std::vector<uint16_t> u(NB * U * 32, 0x3f80);
  std::vector<int8_t> xq(R * K);
  std::vector<int32_t> xs(R * G2, 1);
  std::vector<float> sx(R, 1.f), y(R * NB * 16);
  for (auto& b : w) b = rand();
  for (auto& b : c) b = rand() & 0x7f;
  for (auto& b : xq) b = (rand() % 255) - 127;
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t nb = 0; nb < NB; ++nb)
      block<ROWS>(w.data() + nb * K * 8, c.data() + nb * G * 32, u.data() + nb * U * 32, xq.data(), xs.data(), sx.data(), nullptr, K, y.data() + nb * 16, NB * 16);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, dt);
  }
  double maddubs = double(NB) * G * 2 * 4 * 2 * R;  // groups * halves * steps * 2 per row
  printf("R=%d K=%ld NB=%ld bytes=%.1fMB best %.3f ms  maddubs/ns %.3f  (GB/s %.1f)  chk %f\n", R, K, NB, NB*K*8/1e6, best*1e3, maddubs/best/1e9, NB*K*8/best/1e9, y[3]);
}
