// 16-float vectors for verispec's kernels: one AVX-512 register (a GCC vector), or two AVX2 ones (a pair of GCC
// 8-float vectors: GCC lowers a 64-byte vector to AVX2 through the stack, which made attention 4-5x slower).
// Element-wise IEEE operations in a fixed order, compiled without contraction (-ffp-contract=off): the AVX-512
// and AVX2 builds give the same bits, and so do a vector body and its zero-padded tail.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

// 512-bit vectors in the AVX-512 build only: the AVX-VNNI build, where it is compiled for a CPU with AVX-512 VNNI
// (-mavx512vl, -DVERISPEC_YMM: to test and time it there), keeps to the 256-bit code of the CPUs it is for
#if defined(__AVX512F__) && !defined(VERISPEC_YMM)
#define VERISPEC_ZMM 1
#endif

#if defined(VERISPEC_ZMM)
typedef float f16v __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
#else
typedef float f8v __attribute__((vector_size(32)));
struct f16v {  // lanes 0-7, then 8-15; every operation applies lane by lane, as on the 64-byte vector
  f8v lo, hi;
};
#define VEC_OP(op)                                                                                               \
  inline f16v operator op(f16v a, f16v b) { return {a.lo op b.lo, a.hi op b.hi}; }                               \
  inline f16v operator op(f16v a, float b) { return {a.lo op b, a.hi op b}; }                                    \
  inline f16v operator op(float a, f16v b) { return {a op b.lo, a op b.hi}; }                                    \
  inline f16v& operator op##=(f16v& a, f16v b) { return a = a op b; }
VEC_OP(+)
VEC_OP(-)
VEC_OP(*)
VEC_OP(/)
#undef VEC_OP
inline f16v operator-(f16v a) { return {-a.lo, -a.hi}; }
#endif
constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline f16v splat(float x) { return f16v{} + x; }
#if defined(VERISPEC_ZMM)
inline f16v vmax(f16v a, f16v b) { return a > b ? a : b; }  // lane by lane; b where a is NaN
inline f16v vmin(f16v a, f16v b) { return a < b ? a : b; }
#else
inline f16v vmax(f16v a, f16v b) { return {a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi}; }
inline f16v vmin(f16v a, f16v b) { return {a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi}; }
#endif
#if defined(VERISPEC_ZMM)
inline f16v load(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, f16v v) { std::memcpy(p, &v, sizeof v); }
#else
typedef float f8u __attribute__((vector_size(32), aligned(4), may_alias));  // an unaligned 8-float access
inline f16v load(const float* p) { return {*reinterpret_cast<const f8u*>(p), *reinterpret_cast<const f8u*>(p + 8)}; }
inline void store(float* p, f16v v) {  // two 32-byte stores (a memcpy of the pair went through 16-byte pieces)
  *reinterpret_cast<f8u*>(p) = v.lo;
  *reinterpret_cast<f8u*>(p + 8) = v.hi;
}
#endif
inline f16v load(const float* p, int n) {  // the first n floats, the rest zeros (a call to memcpy: slow)
  if (n == kLanes) return load(p);
  f16v v = {};
  std::memcpy(&v, p, sizeof(float) * n);
  return v;
}
inline void store(float* p, f16v v, int n) {  // the first n floats
  if (n == kLanes) return store(p, v);
  std::memcpy(p, &v, sizeof(float) * n);
}

// e^x of each lane, about 1 ulp (Cephes' expf polynomial); x may be -inf. Exactly 0 below -87, where e^x would
// be subnormal (a probability that small changes no sum it is added to); above 88, e^88. F: a GCC float vector,
// I: the int32 vector of as many lanes.
template <typename F, typename I>
inline F exp_lanes(F x) {
  F xc = x < -87.0f ? F{} - 87.0f : x;
  xc = xc > 88.0f ? F{} + 88.0f : xc;
  const F t = xc * 1.44269504088896341f + 0.5f;
  F fn = __builtin_convertvector(__builtin_convertvector(t, I), F);  // truncated toward zero
  fn += __builtin_convertvector(fn > t, F);  // -1 where truncation rounded up: floor(t)
  F r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const F scale = reinterpret_cast<F>((__builtin_convertvector(fn, I) + 127) << 23);
  return x < -87.0f ? F{} : p * scale;
}

#if defined(VERISPEC_ZMM)
// The lanes' sum in a fixed order: halves, quarters, eighths, pairs.
inline float hsum(f16v a) {
  a += __builtin_shuffle(a, i16v{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  a += __builtin_shuffle(a, i16v{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  a += __builtin_shuffle(a, i16v{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  a += __builtin_shuffle(a, i16v{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return a[0];
}
inline f16v exp16(f16v x) { return exp_lanes<f16v, i16v>(x); }
#else
typedef int32_t i8v __attribute__((vector_size(32)));
// The same sums as the AVX-512 build's: lane i + lane i + 8, then quarters, eighths, pairs of those 8.
inline float hsum(f16v a) {
  f8v s = a.lo + a.hi;
  s += __builtin_shuffle(s, i8v{4, 5, 6, 7, 0, 1, 2, 3});
  s += __builtin_shuffle(s, i8v{2, 3, 0, 1, 6, 7, 4, 5});
  s += __builtin_shuffle(s, i8v{1, 0, 3, 2, 5, 4, 7, 6});
  return s[0];
}
inline f16v exp16(f16v x) { return {exp_lanes<f8v, i8v>(x.lo), exp_lanes<f8v, i8v>(x.hi)}; }
#endif
