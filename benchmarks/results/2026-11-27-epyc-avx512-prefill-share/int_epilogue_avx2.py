"""The AVX2 build's 4-bit block with an integer epilogue (a prototype, timing only: its offsets read xsum as int32,
and its rounding differs from the kernel's): each group's step code multiplied into the widening vpmaddwd, a unit's
8 groups summed in int32, the offsets as vpmaddwd pairs, two float FMAs per unit. Writes a harness beside the
kernel's own blocks:

    python int_epilogue_avx2.py ../../../verispec/models/kernels/w4a8.cpp /tmp/ie.cpp
    g++ -O3 -ffp-contract=off -mavx2 -mfma -mf16c /tmp/ie.cpp -o /tmp/ie && /tmp/ie 4 && /tmp/ie 5   # 5: the prototype
"""
import subprocess
import sys
from pathlib import Path

BLOCK = r'''
// PROTOTYPE: integer epilogue, 4-bit only
template <int R, int BITS>
void block2(const uint8_t* w, const uint8_t* c, const uint16_t* u, const int8_t* xq, const float* xsum,
           const float* sx, const float* bias, int64_t K, float* y, int64_t ldy) {
  const int64_t G = K / 32;
  const int32_t* xsi = reinterpret_cast<const int32_t*>(xsum);
  const __m256i nib = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < G; g0 += kUnitGroups) {
    const int64_t g1 = std::min<int64_t>(G, g0 + kUnitGroups);
    const uint16_t* ug = u + (g0 / kUnitGroups) * 32;
    for (int h = 0; h < 2; ++h) {
      __m256i is[R];
      for (int r = 0; r < R; ++r) is[r] = _mm256_setzero_si256();
      for (int64_t g = g0; g < g1; ++g) {
        constexpr int kGroupBytes = 16 * 32 * BITS / 8;
        const uint8_t* wg = w + g * kGroupBytes;
        for (int t = 0; t < kGroupBytes; t += 64) {
          if constexpr (R == 1) _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + t), _MM_HINT_T1);
          else _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetchL1 + t), _MM_HINT_T0);
        }
        const int8_t* xg = xq + g * 32;
        __m256i lo16[R];
        for (int r = 0; r < R; ++r) lo16[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int t = 0; t < 4; ++t) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + t * 64 + h * 32));
          const __m256i lo = _mm256_and_si256(v, nib);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = xg + r * K + t * 8;
            lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4(x))));
            lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4(x + 4))));
          }
        }
        const __m256i a32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + g * 32 + h * 8)));
        const __m256i ap = _mm256_or_si256(a32, _mm256_slli_epi32(a32, 16));
        for (int r = 0; r < R; ++r) is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(lo16[r], ap));
      }
      // offset: sum over the unit's groups of b * xsum, pairs of groups by vpmaddwd
      __m256i os[R];
      for (int r = 0; r < R; ++r) os[r] = _mm256_setzero_si256();
      for (int64_t g = g0; g < g1; g += 2) {
        const __m256i b0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + g * 32 + 16 + h * 8)));
        const __m256i b1 = g + 1 < g1 ? _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + (g + 1) * 32 + 16 + h * 8))) : _mm256_setzero_si256();
        const __m256i bp = _mm256_blend_epi16(b0, _mm256_slli_epi32(b1, 16), 0xAA);
        for (int r = 0; r < R; ++r) {
          const int32_t x0 = xsi[r * G + g], x1 = g + 1 < g1 ? xsi[r * G + g + 1] : 0;
          os[r] = _mm256_add_epi32(os[r], _mm256_madd_epi16(bp, _mm256_set1_epi32((x0 & 0xFFFF) | (x1 << 16))));
        }
      }
      const __m256 S = bf16x8(ug + h * 8), O = bf16x8(ug + 16 + h * 8);
      for (int r = 0; r < R; ++r) {
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r]), S, acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(os[r]), O, acc[r][h]);
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    const __m256 b = bias ? _mm256_loadu_ps(bias + h * 8) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm256_storeu_ps(y + r * ldy + h * 8, _mm256_fmadd_ps(acc[r][h], _mm256_set1_ps(sx[r]), b));
  }
}
'''

src, out = Path(sys.argv[1]).read_text(), Path(sys.argv[2])
marker = "#else\n#error"
Path(str(out) + ".src.cpp").write_text(src.replace(marker, BLOCK + marker, 1))
here = Path(__file__).parent / "../2026-11-27-epyc-avx2build-many-row-loop/mkharness.sh"
subprocess.run(["bash", str(here), str(out) + ".src.cpp", str(out)], check=True)
h = out.read_text()
h = h.replace("const int bits = argc > 1 ? atoi(argv[1]) : 4;",
              "const int arg = argc > 1 ? atoi(argv[1]) : 4; const int bits = arg == 5 ? 4 : arg;")
h = h.replace("if (bits == 4) { run(block<1,4>, 1);",
              "if (arg == 5) { run(block2<1,4>, 1); run(block2<2,4>, 2); run(block2<4,4>, 4); run(block2<5,4>, 5); "
              "run(block2<6,4>, 6); }\n  else if (bits == 4) { run(block<1,4>, 1);")
out.write_text(h)
