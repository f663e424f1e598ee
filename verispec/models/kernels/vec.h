// 16-float vectors for verispec's kernels (GCC vector extensions: one AVX-512 register, or two AVX2 ones).
// Element-wise IEEE operations in a fixed order, compiled without contraction (-ffp-contract=off): the AVX-512
// and AVX2 builds give the same bits, and so do a vector body and its zero-padded tail.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline f16v splat(float x) { return f16v{} + x; }
inline f16v load(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline f16v load(const float* p, int n) {  // the first n floats, the rest zeros (a call to memcpy: slow)
  if (n == kLanes) return load(p);
  f16v v = {};
  std::memcpy(&v, p, sizeof(float) * n);
  return v;
}
inline void store(float* p, f16v v, int n = kLanes) { std::memcpy(p, &v, sizeof(float) * n); }

// The lanes' sum in a fixed order: halves, quarters, eighths, pairs.
inline float hsum(f16v a) {
  a += __builtin_shuffle(a, i16v{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  a += __builtin_shuffle(a, i16v{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  a += __builtin_shuffle(a, i16v{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  a += __builtin_shuffle(a, i16v{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return a[0];
}

// e^x, about 1 ulp (Cephes' expf polynomial); x may be -inf. Exactly 0 below -87, where e^x would be subnormal
// (a probability that small changes no sum it is added to); above 88, e^88.
inline f16v exp16(f16v x) {
  f16v xc = x < -87.0f ? splat(-87.0f) : x;
  xc = xc > 88.0f ? splat(88.0f) : xc;
  const f16v t = xc * 1.44269504088896341f + 0.5f;
  f16v fn = __builtin_convertvector(__builtin_convertvector(t, i16v), f16v);  // truncated toward zero
  fn += __builtin_convertvector(fn > t, f16v);  // -1 where truncation rounded up: floor(t)
  f16v r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  f16v p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const f16v scale = reinterpret_cast<f16v>((__builtin_convertvector(fn, i16v) + 127) << 23);
  return x < -87.0f ? splat(0.0f) : p * scale;
}
