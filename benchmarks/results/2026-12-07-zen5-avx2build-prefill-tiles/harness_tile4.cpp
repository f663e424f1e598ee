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
constexpr int kWideRows = 1;  // no prefill tile: block() holds 8 rows in the 32 registers
template <int BITS>
constexpr decltype(&block<1, 4>) kWide = nullptr;

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

// A prefill's tile: R rows over a block's 16 columns, both 8-column halves of each step at once, so that each broadcast
// of 4 activation bytes serves two products and each nibble split R rows. AVX2 issues about 6 instructions a cycle; the
// 6-row block spends ~4.5 a 32-product vpmaddubsw (a broadcast each, the accumulator copies of its loop), this ~3.5.
// The same integers and float steps in the same order as block(): bit-identical rows. 4-bit codes.
template <int R>
void tile4(const uint8_t* w, const uint8_t* c, const uint16_t* u, const int8_t* xq, const int32_t* xsum2,
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
      const uint8_t* wg = w + g * 256;
      for (int t = 0; t < 256; t += 64) _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetchL1 + t), _MM_HINT_T0);
      const int8_t* xg = xq + g * 32;
      __m256i d[R][2];  // int16 sums (4-bit: <= 30720 a group), or int32 dot products with VNNI
      for (int r = 0; r < R; ++r) d[r][0] = d[r][1] = _mm256_setzero_si256();
#ifdef ASM
      static_assert(R == 4, "the asm step is for 4 rows");
      const int8_t* x0 = xg;
      const int8_t* x3 = xg + 3 * K;
      for (int t = 0; t < 4; ++t) {
#define ROW4(B, B4, D0, D1) \
        "vpbroadcastd " B ", %%ymm13\n\t" "vpbroadcastd " B4 ", %%ymm14\n\t" \
        "vpmaddubsw %%ymm13, %%ymm8, %%ymm15\n\t" "vpaddw %%ymm15, " D0 ", " D0 "\n\t" \
        "vpmaddubsw %%ymm14, %%ymm9, %%ymm15\n\t" "vpaddw %%ymm15, " D0 ", " D0 "\n\t" \
        "vpmaddubsw %%ymm13, %%ymm10, %%ymm13\n\t" "vpaddw %%ymm13, " D1 ", " D1 "\n\t" \
        "vpmaddubsw %%ymm14, %%ymm11, %%ymm14\n\t" "vpaddw %%ymm14, " D1 ", " D1 "\n\t"
        __asm__("vpand (%[w]), %[nib], %%ymm8\n\t"
                "vmovdqu (%[w]), %%ymm9\n\t" "vpsrlw $4, %%ymm9, %%ymm9\n\t" "vpand %%ymm9, %[nib], %%ymm9\n\t"
                "vpand 32(%[w]), %[nib], %%ymm10\n\t"
                "vmovdqu 32(%[w]), %%ymm11\n\t" "vpsrlw $4, %%ymm11, %%ymm11\n\t" "vpand %%ymm11, %[nib], %%ymm11\n\t"
                ROW4("(%[x0])", "4(%[x0])", "%[d00]", "%[d01]")
                ROW4("(%[x0],%[K],1)", "4(%[x0],%[K],1)", "%[d10]", "%[d11]")
                ROW4("(%[x0],%[K],2)", "4(%[x0],%[K],2)", "%[d20]", "%[d21]")
                ROW4("(%[x3])", "4(%[x3])", "%[d30]", "%[d31]")
                : [d00] "+x"(d[0][0]), [d01] "+x"(d[0][1]), [d10] "+x"(d[1][0]), [d11] "+x"(d[1][1]),
                  [d20] "+x"(d[2][0]), [d21] "+x"(d[2][1]), [d30] "+x"(d[3][0]), [d31] "+x"(d[3][1])
                : [w] "r"(wg + t * 64), [x0] "r"(x0 + t * 8), [x3] "r"(x3 + t * 8), [K] "r"(K), [nib] "x"(nib)
                : "xmm8", "xmm9", "xmm10", "xmm11", "xmm13", "xmm14", "xmm15", "memory");
#undef ROW4
      }
#else
#ifdef UNROLL
#pragma GCC unroll 4
#else
#pragma GCC unroll 1
#endif
      for (int t = 0; t < 4; ++t) {
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + t * 64));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + t * 64 + 32));
        const __m256i lo0 = _mm256_and_si256(v0, nib), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), nib);
        const __m256i lo1 = _mm256_and_si256(v1, nib), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), nib);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xg + r * K + t * 8;
          const __m256i b0 = _mm256_set1_epi32(x4(x)), b1 = _mm256_set1_epi32(x4(x + 4));
          if constexpr (kVnni) {
            d[r][0] = dpbusd(dpbusd(d[r][0], lo0, b0), hi0, b1);
            d[r][1] = dpbusd(dpbusd(d[r][1], lo1, b0), hi1, b1);
          } else {
            d[r][0] = _mm256_add_epi16(_mm256_add_epi16(d[r][0], _mm256_maddubs_epi16(lo0, b0)), _mm256_maddubs_epi16(hi0, b1));
            d[r][1] = _mm256_add_epi16(_mm256_add_epi16(d[r][1], _mm256_maddubs_epi16(lo1, b0)), _mm256_maddubs_epi16(hi1, b1));
          }
        }
      }
#endif
      for (int h = 0; h < 2; ++h) {
        const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + g * 32 + h * 8)));
        const __m256i ap = _mm256_or_si256(a, _mm256_slli_epi32(a, 16));
        for (int r = 0; r < R; ++r)
          

#ifdef NOGROUP
          sums[r][h] = _mm256_add_epi32(sums[r][h], d[r][h]);
#else
          sums[r][h] = _mm256_add_epi32(sums[r][h], kVnni ? _mm256_mullo_epi32(d[r][h], a) : _mm256_madd_epi16(d[r][h], ap));
#endif
      }
    }
#ifdef NOUNIT
    for (int h = 0; h < 2; ++h) for (int r = 0; r < R; ++r) acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_cvtepi32_ps(sums[r][h]));
    if (0)
#endif
    for (int h = 0; h < 2; ++h) {
      __m256i off[R];
      for (int r = 0; r < R; ++r) off[r] = _mm256_setzero_si256();
      for (int64_t g = g0; g < g1; g += 2) {
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
#ifndef WIDE_ROWS
#define WIDE_ROWS 4
#endif
constexpr int kWideRows = WIDE_ROWS;
template <int BITS>
constexpr auto kWide = BITS == 4 ? tile4<kWideRows> : nullptr;

#else
#error "build with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c, or with -mavx2 -mfma -mf16c [-mavxvnni]"
#endif

}  // namespace
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
int main(int argc, char** argv) {
  const int64_t K = 1536, NB = getenv("NB") ? atoi(getenv("NB")) : 8;  // 128 columns: 4-bit 98 KB, in L2
  const int bits = argc > 1 ? atoi(argv[1]) : 4;
  std::vector<uint8_t> w(NB * K * bits * 2), c(NB * K); std::vector<uint16_t> u(NB * 8 * 32, 0x3c00);
  std::vector<int8_t> xq(8 * K); std::vector<int32_t> xs(8 * K / 32, 1); std::vector<float> sx(8, 1.f), y(8 * NB * 16);
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
  if (bits == 4) { run(tile4<4>, 4); run(block<6,4>, 6); }
  else { run(block<1,6>, 1); run(block<2,6>, 2); run(block<4,6>, 4); run(block<5,6>, 5); run(block<6,6>, 6); }
  fprintf(stderr, "%f\n", y[3]);
}
