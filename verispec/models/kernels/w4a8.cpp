// 4-bit weights x 8-bit activations: the matmul that a 1-token decoding step and a few-token verification spend
// their time in on a CPU. That matmul is bound by reading weights, so weights are 4 bits (groups of 32 along the
// input, w = s * q + o, q in 0..15, s and o as 8-bit codes: see below), and activations are quantized per row
// to int8 so that integer u8 x s8 dot products do the multiply-adds.
//
// Layout: 16 output columns share a 64-byte block, one 4-byte lane each, and each lane's 4 bytes are 4
// consecutive inputs. With 4 bits a block of 16 columns x 8 inputs is 64 bytes: byte 4 * lane + j holds input
// j in its low nibble and input 4 + j in its high one. With 6 bits (for weights that a 4-bit grid would
// coarsen: GGUF's Q6_K tensors, q in 0..63) a group of 32 inputs is 384 bytes: the codes' low nibbles as four
// 4-bit blocks, then two blocks of their top 2 bits, byte 4 * lane + j of block p holding, from bit 0 up, those
// of inputs 16p + j, 16p + 4 + j, 16p + 8 + j, 16p + 12 + j. With 3 bits (a draft's MLP, q in 0..7) a group is 192
// bytes: the codes' low 2 bits as two blocks of that 2-bit layout, then one block of their top bits, bit b of byte
// 4 * lane + j holding input 4b + j's. With 8 bits (q in 0..255) a block is 16 columns x 4 inputs.
//
// A group's step s and offset o (w = s * q + o) are 8-bit codes on a unit that 8 groups (256 inputs, a GGUF
// K-quant's super-block) share per column: s = S * a (a in 0..255), o = O * b (b in -127..127), S and O bf16
// (fp16's subnormals would hold a small unit to a few bits). codes [N / 16, K / 32, 32] uint8 hold a group's 16
// a's then its 16 b's; units [N / 16, ceil(K / 256), 32] bf16 the 16 S's then the 16 O's. 0.625 bits a weight,
// where an fp16 step and offset per group read 1.0: 4-bit weights read 4.625 bits (GGUF's Q4_K 4.5), 6-bit ones
// 6.625 (Q6_K 6.5625). S * a is exact in float32 (8 x 8 bits), so both builds decode the same step.
//
// One source, three builds (kernels/__init__.py picks one from the CPU's flags):
// - AVX-512 VNNI (-mavx512vnni): a 512-bit vector is a block; vpdpbusd does 4 u8 x s8 products per lane.
// - AVX2 + FMA + F16C (no AVX-512 anywhere in that build): a block is two 256-bit halves of 8 columns;
//   vpmaddubsw sums u8 x s8 pairs into int16, which saturates. A 4-bit code's pair is at most 2 * 15 * 128 =
//   3840, and a group adds 8 of them per int16, 30720 < 32767. A 6-bit code's is at most 2 * 63 * 128 = 16128:
//   two are added in int16, then widened to int32 (vpmaddwd). 8-bit codes are split into their low nibble and
//   the rest, dot = 16 * dot(high) + dot(low), each exact as 4-bit codes are.
// - AVX-VNNI (-mavxvnni: Intel's client cores since Alder Lake): the AVX2 build's 256-bit halves,
//   with the 256-bit vpdpbusd in place of vpmaddubsw + vpaddw (+ vpmaddwd): one instruction a 32 products
//   where the AVX2 build needs two, and no int16 to saturate. The AVX2 build's few-row matmuls are bound by that
//   operation count (benchmarks/results/2026-11-27-epyc-avx2build-many-row-loop). On a CPU with AVX-512 VNNI
//   but not AVX-VNNI (AMD Zen 4), the same source compiles with -mavx512vl -DVERISPEC_YMM into the EVEX form of
//   the same instruction, so the build is tested and timed there.
// All compute the same integers (a unit's dot products times their step codes, summed, and its offsets' sum), and
// then the same float32 epilogue in the same order (two FMAs a unit, one at the end), lane by lane: their outputs
// are bit-identical.
//
// Every row is computed by the same instruction sequence whatever the other rows are, so a token's output
// does not depend on how many tokens share the forward (exact greedy speculation needs that).
#include <torch/csrc/utils/pybind.h>

#include "ops.h"
#include "tensor.h"
#include <immintrin.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

typedef int32_t int32_u __attribute__((may_alias, aligned(1)));  // an unaligned 4-byte load that may alias int8s
constexpr int kUnitGroups = 8;  // groups of 32 inputs that share a unit
// Bytes ahead of the weights being read, prefetched into L2: without it ~80% of the bandwidth was reached; into L1
// (as until 2026-11-25, 8 KB ahead) a one-token forward of the 1.5B target took 8% longer on an Intel Xeon (AVX-512
// build), where L2 holds more misses in flight. The AVX2 build's many-row blocks are bound by their int16
// arithmetic; they prefetch into L1, kPrefetchL1 ahead: 16 KB ahead there (half of L1) overlapped the reads with
// the arithmetic worse, and 2-5 rows over cold weights took 5-21% longer on an AMD EPYC (Zen 4) than 2-6 KB ahead
// (benchmarks/results/2026-11-27-epyc-avx2build-prefetch). The AVX-512 build's were 0-19% slower so: it keeps L2.
constexpr int kPrefetch = 16384;
constexpr int kPrefetchL1 = 4096;

inline int32_t x4(const int8_t* x) { return *reinterpret_cast<const int32_u*>(x); }

// Group g's sum of activation codes (|sum| <= 32 * 127) into its pair's int32: group 2j in the low int16, 2j + 1 in
// the high one (0 where the row has no group 2j + 1), the operand of the offsets' int16 pair products. Groups are
// put in order: 2j sets the word, 2j + 1 adds its half.
inline void put_sum(int32_t* xsum2, int64_t g, int32_t sum) {
  const uint32_t half = static_cast<uint16_t>(sum);
  xsum2[g / 2] = static_cast<int32_t>(g % 2 ? static_cast<uint32_t>(xsum2[g / 2]) | half << 16 : half);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(VERISPEC_YMM)
constexpr const char* kIsa = "avx512";
constexpr int kRows = 8;  // rows per pass over a weight block: 8 x (int + float) accumulators fit the 32 registers

inline __m512 bf16x16(const uint16_t* p) {  // 16 bf16 values as float32: their bits, 16 places up
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// A 3-bit group's top bits (bit B of byte j: input 4 B + j) with bit B moved to bit 2 (masked by the caller).
inline __m512i top3(__m512i top, int b) {
  return b < 2 ? _mm512_sll_epi16(top, _mm_cvtsi32_si128(2 - b)) : _mm512_srl_epi16(top, _mm_cvtsi32_si128(b - 2));
}

// A row's per-row symmetric int8 codes q = nearbyint(x / scale), scale = max |x| / 127 (1 for a zero row), and
// each group of 32's sum of codes (put_sum); returns the scale. Exact integer work and one float multiply a lane,
// so the AVX2 build's loop gives the same bytes. K % 32 == 0.
inline float quantize_row(const float* x, int64_t K, int8_t* q, int32_t* xsum2) {
  __m512 mx = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) mx = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), mx);  // NaN: skipped
  const float amax = _mm512_reduce_max_ps(mx);
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const __m512 inv = _mm512_set1_ps(1.f / scale);
  for (int64_t g = 0; g < K / 32; ++g) {  // cvtps rounds to nearest even, as nearbyint does
    const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + g * 32), inv));
    const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + g * 32 + 16), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * 32), _mm512_cvtepi32_epi8(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * 32 + 16), _mm512_cvtepi32_epi8(b));
    put_sum(xsum2, g, _mm512_reduce_add_epi32(_mm512_add_epi32(a, b)));
  }
  return scale;
}

// The epilogue in integers, a unit (8 groups) at a time: each group's exact dot product times its step code a, summed
// over the unit in int32 (|sum| <= 8 * 255 * 32 * 255 * 127 < 2^31 with 8-bit codes), and the unit's offsets as
// sum b * (the group's sum of activation codes) by int16 pairs; then two float FMAs a unit: acc += float(sum) * S,
// acc += float(offsets) * O. Every build computes the same integers and float steps, so their outputs stay
// bit-identical. Why: a group's two FMAs took a vpdpbusd slot each, its vpmulld takes one; a 7-token forward 4% and a
// prefill 6% shorter than with the float epilogue of each group (benchmarks/results/2026-11-28-epyc-integer-epilogue).
template <int R, int BITS>
void block(const uint8_t* w, const uint8_t* c, const uint16_t* u, const int8_t* xq, const int32_t* xsum2,
           const float* sx, const float* bias, int64_t K, float* y, int64_t ldy) {
  const int64_t G = K / 32, G2 = (G + 1) / 2;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += kUnitGroups) {
    const int64_t g1 = std::min<int64_t>(G, g0 + kUnitGroups);
    __m512i sum[R], off[R];
    for (int r = 0; r < R; ++r) sum[r] = off[r] = _mm512_setzero_si512();
    for (int64_t g = g0; g < g1; ++g) {
      __m512i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
      constexpr int kGroupBytes = 16 * 32 * BITS / 8;
      const uint8_t* wg = w + g * kGroupBytes;
      for (int t = 0; t < kGroupBytes; t += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + t), _MM_HINT_T1);
      for (int t = 0; t < (BITS == 6 || BITS == 3 ? 4 : kGroupBytes / 64); ++t) {  // 6, 3 bits: 4 steps of 8 inputs
        const __m512i v = _mm512_loadu_si512(wg + (BITS == 3 ? t / 2 : t) * 64);
        if constexpr (BITS == 3) {  // 2-bit fields 2 (t % 2) and the next, the top bits' bits 2 t and 2 t + 1 at bit 2
          const __m512i low = _mm512_set1_epi8(0x03), m = _mm512_set1_epi8(0x04);
          const __m512i top = _mm512_loadu_si512(wg + 128);
          const __m512i f = t % 2 ? _mm512_srli_epi16(v, 4) : v;
          const __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(f, low), top3(top, 2 * t), m, 0xF8);
          const __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(f, 2), low),
                                                       top3(top, 2 * t + 1), m, 0xF8);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = xq + r * K + g * 32 + t * 8;
            dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(x4(x)));
            dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(x4(x + 4)));
          }
        } else if constexpr (BITS == 4 || BITS == 6) {
          __m512i lo = _mm512_and_si512(v, nib);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
          if constexpr (BITS == 6) {  // or in the top 2 bits, moved to bits 4-5: lo's are field 2 (t % 2), hi's the next
            const __m512i top = _mm512_loadu_si512(wg + 256 + (t / 2) * 64), m = _mm512_set1_epi8(0x30);
            const __m512i tl = t % 2 ? top : _mm512_slli_epi16(top, 4);
            const __m512i th = t % 2 ? _mm512_srli_epi16(top, 2) : _mm512_slli_epi16(top, 2);
            lo = _mm512_ternarylogic_epi32(lo, tl, m, 0xF8);  // lo | (tl & m)
            hi = _mm512_ternarylogic_epi32(hi, th, m, 0xF8);
          }
          for (int r = 0; r < R; ++r) {  // 4 activation bytes broadcast to every lane, folded into the dot product
            const int8_t* x = xq + r * K + g * 32 + t * 8;
            dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(x4(x)));
            dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(x4(x + 4)));
          }
        } else {
          for (int r = 0; r < R; ++r)
            dot[r] = _mm512_dpbusd_epi32(dot[r], v, _mm512_set1_epi32(x4(xq + r * K + g * 32 + t * 4)));
        }
      }
      const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + g * 32)));
      for (int r = 0; r < R; ++r) sum[r] = _mm512_add_epi32(sum[r], _mm512_mullo_epi32(dot[r], a));
    }
    for (int64_t g = g0; g < g1; g += 2) {  // b of groups g and g + 1 as int16 pairs, times the rows' code sums
      const auto b = [&](int64_t i) {
        return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i * 32 + 16)));
      };
      const __m512i bp = _mm512_mask_blend_epi16(0xAAAAAAAA, b(g), g + 1 < g1 ? _mm512_slli_epi32(b(g + 1), 16)
                                                                             : _mm512_setzero_si512());
      for (int r = 0; r < R; ++r) off[r] = _mm512_dpwssd_epi32(off[r], bp, _mm512_set1_epi32(xsum2[r * G2 + g / 2]));
    }
    const uint16_t* ug = u + (g0 / kUnitGroups) * 32;
    const __m512 S = bf16x16(ug), O = bf16x16(ug + 16);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), S, acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(off[r]), O, acc[r]);
    }
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * ldy, _mm512_fmadd_ps(acc[r], _mm512_set1_ps(sx[r]), b));
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#if defined(__AVXVNNI__) || (defined(VERISPEC_YMM) && defined(__AVX512VNNI__) && defined(__AVX512VL__))
constexpr const char* kIsa = "avxvnni";
constexpr bool kVnni = true;
inline __m256i dpbusd(__m256i acc, __m256i u8s, __m256i s8s) {  // acc + each lane's 4 u8 x s8 products, in int32
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u8s, s8s);
#else
  return _mm256_dpbusd_epi32(acc, u8s, s8s);  // the EVEX form (AVX512VL + AVX512VNNI)
#endif
}
inline __m256i dpwssd(__m256i acc, __m256i a, __m256i b) {  // acc + each lane's 2 s16 x s16 products, in int32
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_dpwssd_epi32(acc, a, b);
#endif
}
#else
constexpr const char* kIsa = "avx2";
constexpr bool kVnni = false;
inline __m256i dpbusd(__m256i, __m256i, __m256i);  // not in this build (kVnni false: never called)
inline __m256i dpwssd(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
#endif
// rows per pass: AVX2, 6 x 2 int16 sums + 4 = the 16 registers (8-bit codes); AVX-VNNI, one int32 sum a row, 8
// (8 rows 0.81-0.87x the time of 6 + 2 on an AMD Zen 4, fewer rows the same; two sums a row, to halve the chains
// of dependent vpdpbusd, were 1.06-1.44x slower)
constexpr int kRows = kVnni ? 8 : 6;

// A 3-bit group's top bits (bit b of byte j: input 4 b + j) with bit b moved to bit 2 (masked by the caller).
inline __m256i top3(__m256i top, int b) {
  return b < 2 ? _mm256_sll_epi16(top, _mm_cvtsi32_si128(2 - b)) : _mm256_srl_epi16(top, _mm_cvtsi32_si128(b - 2));
}

inline __m256 bf16x8(const uint16_t* p) {  // 8 bf16 values as float32: their bits, 16 places up
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// quantize_row of the AVX-512 build, 8 lanes at a time: the same codes, sums and scale.
inline float quantize_row(const float* x, int64_t K, int8_t* q, int32_t* xsum2) {
  const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 mx = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs), mx);
  alignas(32) float m8[8];
  _mm256_store_ps(m8, mx);
  float amax = m8[0];
  for (int i = 1; i < 8; ++i) amax = std::max(amax, m8[i]);
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const __m256 inv = _mm256_set1_ps(1.f / scale);
  alignas(32) int32_t c[32];
  for (int64_t g = 0; g < K / 32; ++g) {
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + g * 32 + i * 8), inv));
      _mm256_store_si256(reinterpret_cast<__m256i*>(c + i * 8), v);
      sum = _mm256_add_epi32(sum, v);
    }
    for (int i = 0; i < 32; ++i) q[g * 32 + i] = static_cast<int8_t>(c[i]);  // truncated, as vpmovdb does
    alignas(32) int32_t s8[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s8), sum);
    int32_t total = 0;
    for (int i = 0; i < 8; ++i) total += s8[i];
    put_sum(xsum2, g, total);
  }
  return scale;
}

// unrolled, a 6-bit group's 4 steps run faster on one or two rows (measured), and a 4-bit group's on one row (0.84-0.90x
// the time from an Intel Xeon's L3, AVX2 and AVX-VNNI builds: benchmarks/results/2026-12-04-xeon-unroll-one-row); more
// rows' sums then leave the registers (4-bit, two rows unrolled: 1.12x the time)
template <int R, int BITS>
constexpr bool kUnroll = (BITS == 6 && R <= 2) || (BITS == 4 && R == 1);

// The same integer epilogue as the AVX-512 build's: a group's step code a goes into the widening vpmaddwd as an int16
// pair (a, a) (vpmulld where VNNI sums in int32), the unit's offsets by int16 pairs. With the AVX2 build a 5-token
// forward 7% and a prefill 8% shorter than with a float epilogue per group: fewer of the operations that bound its
// many-row blocks.
template <int R, int BITS>
void block(const uint8_t* w, const uint8_t* c, const uint16_t* u, const int8_t* xq, const int32_t* xsum2,
           const float* sx, const float* bias, int64_t K, float* y, int64_t ldy) {
  const int64_t G = K / 32, G2 = (G + 1) / 2;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += kUnitGroups) {
    const int64_t g1 = std::min<int64_t>(G, g0 + kUnitGroups);
    __m256i sums[R][2];
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    for (int64_t g = g0; g < g1; ++g) {
      constexpr int kGroupBytes = 16 * 32 * BITS / 8;
      const uint8_t* wg = w + g * kGroupBytes;
      for (int t = 0; t < kGroupBytes; t += 64) {  // L2 for one row (bound by memory), L1 for more (by arithmetic)
        if constexpr (R == 1) _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + t), _MM_HINT_T1);
        else _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetchL1 + t), _MM_HINT_T0);
      }
      const int8_t* xg = xq + g * 32;
      for (int h = 0; h < 2; ++h) {  // a half is 8 columns; the second half's bytes are in L1 by then
        const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + g * 32 + h * 8)));
        const __m256i ap = _mm256_or_si256(a, _mm256_slli_epi32(a, 16));  // (a, a) as int16
        // int16 sums of u8 x s8 pairs; with 8 bits, lo holds the low nibbles' and hi the high nibbles'; with 6, d32
        // holds int32 sums, a already in (a 6-bit code's pair sum, <= 2 * 63 * 128 = 16128, leaves room for one more
        // in int16); with VNNI, d32 holds the dot product
        __m256i lo16[R], hi16[R], d32[R];
        for (int r = 0; r < R; ++r) lo16[r] = hi16[r] = d32[r] = _mm256_setzero_si256();
        const auto step = [&](const int t) __attribute__((always_inline)) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + (BITS == 3 ? t / 2 : t) * 64 + h * 32));
          __m256i lo, hi;
          if constexpr (BITS == 3) {  // 2-bit fields 2 (t % 2) and the next, the top bits' 2 t and 2 t + 1 at bit 2
            const __m256i low = _mm256_set1_epi8(0x03), m = _mm256_set1_epi8(0x04);
            const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 128 + h * 32));
            const __m256i f = t % 2 ? _mm256_srli_epi16(v, 4) : v;
            lo = _mm256_or_si256(_mm256_and_si256(f, low), _mm256_and_si256(top3(top, 2 * t), m));
            hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(f, 2), low), _mm256_and_si256(top3(top, 2 * t + 1), m));
          } else {
            lo = _mm256_and_si256(v, nib);
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
          }
          if constexpr (BITS == 6) {  // or in the top 2 bits, moved to bits 4-5: lo's are field 2 (t % 2), hi's the next
            const __m256i top = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 256 + (t / 2) * 64 + h * 32));
            const __m256i m = _mm256_set1_epi8(0x30);
            const __m256i tl = t % 2 ? top : _mm256_slli_epi16(top, 4);
            const __m256i th = t % 2 ? _mm256_srli_epi16(top, 2) : _mm256_slli_epi16(top, 2);
            lo = _mm256_or_si256(lo, _mm256_and_si256(tl, m));
            hi = _mm256_or_si256(hi, _mm256_and_si256(th, m));
          }
          for (int r = 0; r < R; ++r) {
            if constexpr (kVnni && BITS == 8) {  // whole bytes: 4 products a lane in int32, no nibbles
              d32[r] = dpbusd(d32[r], v, _mm256_set1_epi32(x4(xg + r * K + t * 4)));
            } else if constexpr (kVnni) {  // 3, 4 or 6 bits: low nibbles (or fields) weigh inputs j, high ones 4 + j
              const int8_t* x = xg + r * K + t * 8;
              d32[r] = dpbusd(dpbusd(d32[r], lo, _mm256_set1_epi32(x4(x))), hi, _mm256_set1_epi32(x4(x + 4)));
            } else if constexpr (BITS == 6) {  // two pair sums in int16 (<= 32256), then into int32 times a
              const int8_t* x = xg + r * K + t * 8;
              const __m256i pair = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4(x))),
                                                    _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4(x + 4))));
              d32[r] = _mm256_add_epi32(d32[r], _mm256_madd_epi16(pair, ap));
            } else if constexpr (BITS == 4 || BITS == 3) {  // low codes: inputs j, high ones: 4 + j; one int16 sum for both
              const int8_t* x = xg + r * K + t * 8;
              lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4(x))));
              lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4(x + 4))));
            } else {  // both nibbles of a byte weigh the same input
              const __m256i xa = _mm256_set1_epi32(x4(xg + r * K + t * 4));
              lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, xa));
              hi16[r] = _mm256_add_epi16(hi16[r], _mm256_maddubs_epi16(hi, xa));
            }
          }
        };
        constexpr int kSteps = BITS == 6 || BITS == 3 ? 4 : kGroupBytes / 64;
        if constexpr (kUnroll<R, BITS>) {
#pragma GCC unroll 4
          for (int t = 0; t < kSteps; ++t) step(t);
        } else {
#pragma GCC unroll 1
          for (int t = 0; t < kSteps; ++t) step(t);
        }
        for (int r = 0; r < R; ++r) {  // the group's dot product times a, into the unit's sum
          __m256i& sr = sums[r][h];
          if constexpr (kVnni) sr = _mm256_add_epi32(sr, _mm256_mullo_epi32(d32[r], a));
          else if constexpr (BITS == 6) sr = _mm256_add_epi32(sr, d32[r]);
          else sr = _mm256_add_epi32(sr, _mm256_madd_epi16(lo16[r], ap));
          if constexpr (!kVnni && BITS == 8)  // the high nibbles weigh 16 times: (16 a, 16 a), 16 a <= 4080
            sr = _mm256_add_epi32(sr, _mm256_madd_epi16(hi16[r], _mm256_slli_epi16(ap, 4)));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      __m256i off[R];
      for (int r = 0; r < R; ++r) off[r] = _mm256_setzero_si256();
      for (int64_t g = g0; g < g1; g += 2) {  // b of groups g and g + 1 as int16 pairs, times the rows' code sums
        const auto b = [&](int64_t i) {
          return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i * 32 + 16 + h * 8)));
        };
        const __m256i bp = _mm256_blend_epi16(b(g), g + 1 < g1 ? _mm256_slli_epi32(b(g + 1), 16)
                                                               : _mm256_setzero_si256(), 0xAA);
        for (int r = 0; r < R; ++r) off[r] = dpwssd(off[r], bp, _mm256_set1_epi32(xsum2[r * G2 + g / 2]));
      }
      const uint16_t* ug = u + (g0 / kUnitGroups) * 32 + h * 8;
      const __m256 S = bf16x8(ug), O = bf16x8(ug + 16);
      for (int r = 0; r < R; ++r) {
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][h]), S, acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(off[r]), O, acc[r][h]);
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    const __m256 b = bias ? _mm256_loadu_ps(bias + h * 8) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm256_storeu_ps(y + r * ldy + h * 8, _mm256_fmadd_ps(acc[r][h], _mm256_set1_ps(sx[r]), b));
  }
}

#else
#error "build with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c, or with -mavx2 -mfma -mf16c [-mavxvnni]"
#endif

using BlockFn = void (*)(const uint8_t*, const uint8_t*, const uint16_t*, const int8_t*, const int32_t*,
                         const float*, const float*, int64_t, float*, int64_t);

template <int BITS, int... R>
constexpr std::array<BlockFn, sizeof...(R) + 1> blocks(std::integer_sequence<int, R...>) {
  return {nullptr, block<R + 1, BITS>...};
}
template <int BITS>
constexpr auto kBlocks = blocks<BITS>(std::make_integer_sequence<int, kRows>{});

}  // namespace

// x [M, K] float32; w [N / 16, K / 8, 64] uint8 with 4 bits, [N / 16, 3 K / 16, 64] with 6, [N / 16, K / 4, 64]
// with 8, [N / 16, 3 K / 32, 64] with 3; codes [N / 16, K / 32, 32] uint8, units [N / 16, ceil(K / 256), 32] bfloat16 (see the top); bias [N]
// float32 or empty. Returns x W^T + bias as [M, N] float32.
torch::Tensor w4a8_mm(torch::Tensor x, torch::Tensor w, torch::Tensor codes, torch::Tensor units, torch::Tensor bias);

// w4a8_mm with each row of x sent as two int8 rows, its per-row codes and the residual they leave (x - q * scale,
// quantized per row in turn), the two outputs summed: ~15-bit activations for inputs whose outlier dimensions per-row
// int8 alone cannot hold (the target's features beside small ones), at about one row's cost where the weights' reads
// bound the matmul. The residual is taken from quantize_row's own codes, the ones w4a8_mm then computes with.
torch::Tensor w4a8_mm_split(torch::Tensor x, torch::Tensor w, torch::Tensor codes, torch::Tensor units,
                            torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 32 == 0, "K must be a multiple of 32");
  auto both = torch::empty({2 * M, K}, torch::kFloat32);
  const float* xp = x.data_ptr<float>();
  float* bp = both.data_ptr<float>();
  std::vector<int8_t> q(K);
  std::vector<int32_t> xsum2((K / 32 + 1) / 2);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = xp + m * K;
    const float scale = quantize_row(row, K, q.data(), xsum2.data());
    std::copy(row, row + K, bp + m * K);
    float* res = bp + (M + m) * K;
    for (int64_t k = 0; k < K; ++k) res[k] = row[k] - static_cast<float>(q[k]) * scale;
  }
  auto y = w4a8_mm(both, w, codes, units, torch::empty({0}, torch::kFloat32));  // the bias once, below
  const int64_t N = y.size(1);
  auto out = torch::empty({M, N}, torch::kFloat32);
  const float* yp = y.data_ptr<float>();
  const float* bias_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) op[m * N + n] = yp[m * N + n] + yp[(M + m) * N + n] + (bias_p ? bias_p[n] : 0.f);
  return out;
}

Linear linear_of(const torch::Tensor& w, const torch::Tensor& codes, const torch::Tensor& units,
                 const torch::Tensor& bias, int64_t K) {
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == torch::kUInt8 && w.is_contiguous() && w.size(2) == 64, "w: packed uint8");
  const int64_t NB = w.size(0), N = NB * 16, G = K / 32;
  TORCH_CHECK(K % 32 == 0 && (w.size(1) == K / 8 || w.size(1) == 3 * K / 16 || w.size(1) == K / 4 ||
                               w.size(1) == 3 * K / 32),
              "K must be a multiple of 32 and match the packed weights");
  const int bits = w.size(1) == K / 8 ? 4 : w.size(1) == K / 4 ? 8 : w.size(1) == 3 * K / 32 ? 3 : 6;
  const int64_t U = (G + kUnitGroups - 1) / kUnitGroups;
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8 && codes.is_contiguous() && codes.numel() == N * G * 2,
              "codes: uint8 [N / 16, K / 32, 32]");
  TORCH_CHECK(units.scalar_type() == at::kBFloat16 && units.is_contiguous() && units.numel() == N * U * 2,
              "units: bfloat16 [N / 16, ceil(K / 256), 32]");
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == torch::kFloat32 && bias.numel() == N && bias.is_contiguous()),
              "bias: [N] float32");
  Linear L;
  L.w = w.data_ptr<uint8_t>();
  L.codes = codes.data_ptr<uint8_t>();
  L.units = reinterpret_cast<const uint16_t*>(units.data_ptr<at::BFloat16>());
  L.bias = bias.numel() ? bias.data_ptr<float>() : nullptr;
  L.N = N;
  L.K = K;
  L.bits = bits;
  return L;
}

void mm_into(const float* xp, int64_t M, const Linear& L, float* yp, MmScratch& scratch) {
  const int64_t K = L.K, N = L.N, NB = N / 16, G = K / 32, G2 = (G + 1) / 2, bits = L.bits;
  const int64_t U = (G + kUnitGroups - 1) / kUnitGroups;
  const auto& run = bits == 4 ? kBlocks<4> : bits == 6 ? kBlocks<6> : bits == 3 ? kBlocks<3> : kBlocks<8>;
  if (static_cast<int64_t>(scratch.xq.size()) < M * K) scratch.xq.resize(M * K);
  if (static_cast<int64_t>(scratch.xsum.size()) < M * G2) scratch.xsum.resize(M * G2);
  if (static_cast<int64_t>(scratch.sx.size()) < M) scratch.sx.resize(M);
  int8_t* qp = scratch.xq.data();
  int32_t* xs = scratch.xsum.data();
  float* sp = scratch.sx.data();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)  // per-row symmetric int8: a row's quantization ignores the other rows
      sp[m] = quantize_row(xp + m * K, K, qp + m * K, xs + m * G2);
  });
  const uint8_t* wp = L.w;
  const uint8_t* cp = L.codes;
  const uint16_t* up = L.units;
  const float* bp = L.bias;
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t m = 0; m < M; m += kRows) {
        const int r = static_cast<int>(std::min<int64_t>(kRows, M - m));
        run[r](wp + nb * K * bits * 2, cp + nb * G * 32, up + nb * U * 32, qp + m * K, xs + m * G2, sp + m,
                   bp ? bp + nb * 16 : nullptr, K, yp + m * N + nb * 16, N);
      }
    }
  });
}

torch::Tensor w4a8_mm(torch::Tensor x, torch::Tensor w, torch::Tensor codes, torch::Tensor units, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const Linear L = linear_of(w, codes, units, bias, x.size(1));
  auto y = torch::empty({x.size(0), L.N}, torch::kFloat32);
  MmScratch scratch;
  mm_into(x.data_ptr<float>(), x.size(0), L, y.data_ptr<float>(), scratch);
  return y;
}

// attention.cpp, layer.cpp
torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor mask, double scale);
torch::Tensor layer_pre(torch::Tensor x, torch::Tensor norm, double eps, torch::Tensor w, torch::Tensor s,
                        torch::Tensor o, torch::Tensor bias, torch::Tensor cos, torch::Tensor sin, int64_t heads,
                        int64_t kv_heads, int64_t T);
torch::Tensor layer_post(torch::Tensor x, torch::Tensor attn, torch::Tensor wo, torch::Tensor so, torch::Tensor oo,
                         torch::Tensor norm, double eps, torch::Tensor w13, torch::Tensor s13, torch::Tensor o13,
                         torch::Tensor w2, torch::Tensor s2, torch::Tensor o2);
torch::Tensor layer(torch::Tensor x, torch::Tensor norm1, double eps1, torch::Tensor wqkv, torch::Tensor sqkv,
                    torch::Tensor oqkv, torch::Tensor bqkv, torch::Tensor cos, torch::Tensor sin, int64_t heads,
                    int64_t kv_heads, torch::Tensor kc, torch::Tensor vc, torch::Tensor rows, torch::Tensor slots,
                    int64_t read, torch::Tensor mask, torch::Tensor wo, torch::Tensor so, torch::Tensor oo,
                    torch::Tensor norm2, double eps2, torch::Tensor w13, torch::Tensor s13, torch::Tensor o13,
                    torch::Tensor w2, torch::Tensor s2, torch::Tensor o2);

// sample.cpp
torch::Tensor softmax_t(torch::Tensor x, double temperature);
torch::Tensor sample_rows(torch::Tensor w, torch::Tensor u, int64_t block);
torch::Tensor verify_row(torch::Tensor logits, double temperature, torch::Tensor draft, torch::Tensor q,
                         torch::Tensor u, torch::Tensor u_last, int64_t block);

// A model's decoder layers (layer.cpp's StackState). Module-local: the builds (avx512, avxvnni, avx2) load into one
// process and each binds its own.
struct LayerStack {
  std::shared_ptr<StackState> state;
  torch::Tensor run(int64_t n, torch::Tensor x, torch::Tensor cos, torch::Tensor sin, torch::Tensor k,
                    torch::Tensor v, torch::Tensor rows, torch::Tensor slots, int64_t read, torch::Tensor mask,
                    int64_t start) const {
    return stack_run(*state, n, x, cos, sin, k, v, rows, slots, read, mask, start);
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<LayerStack>(m, "LayerStack", pybind11::module_local(), "a model's w4a8 decoder layers, run whole in one call")
      .def(pybind11::init([](std::vector<torch::Tensor> ops, std::vector<double> eps, int64_t heads,
                             int64_t kv_heads) { return LayerStack{stack_state(std::move(ops), eps, heads, kv_heads)}; }))
      .def("run", &LayerStack::run, "layers start .. n-1 over x (layer()'s arguments, the cache whole)",
           pybind11::arg("n"), pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("k"),
           pybind11::arg("v"), pybind11::arg("rows"), pybind11::arg("slots"), pybind11::arg("read"),
           pybind11::arg("mask"), pybind11::arg("start") = 0);
  m.def("w4a8_mm", &w4a8_mm, "4-bit weight x int8 activation matmul");
  m.def("w4a8_mm_split", &w4a8_mm_split, "w4a8_mm with each row as two int8 rows: its codes and their residual");
  m.def("attention", &attention, "attention of each query on its own over a float32 KV cache");
  m.def("layer_pre", &layer_pre, "a decoder layer's norm, q/k/v projection and rope (w4a8 weights)");
  m.def("layer_post", &layer_post, "a decoder layer's output projection, MLP and residuals (w4a8 weights)");
  m.def("layer", &layer, "a whole decoder layer: layer_pre, the cache write, attention, layer_post (w4a8 weights)");
  m.def("softmax_t", &softmax_t, "softmax((x - max) / temperature) of each row (sampling.logits_to_probs)");
  m.def("sample_rows", &sample_rows, "an inverse-CDF draw from each row of weights (sampling.sample)");
  m.def("verify_row", &verify_row, "a sampled chain's verification from the target's logits (verify.verify_chain)");
  m.def("isa", [] { return std::string(kIsa); }, "the instruction set this build uses: avx512, avxvnni or avx2");
}
