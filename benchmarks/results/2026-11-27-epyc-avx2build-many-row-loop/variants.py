"""Write the kernel variants timed in this folder's README from verispec/models/kernels/w4a8.cpp (at 8d6ce45).

    python variants.py ../../../verispec/models/kernels/w4a8.cpp OUTDIR
    for v in base noepi asm_steps interleaved split pf_dual16_2 pf_l2only; do
        bash mkharness.sh OUTDIR/$v.cpp /tmp/h_$v.cpp && g++ -O3 -ffp-contract=off -mavx2 -mfma -mf16c /tmp/h_$v.cpp -o /tmp/h_$v && /tmp/h_$v 4
    done
Each replacement is asserted to match once, so a changed kernel fails loudly instead of timing the wrong thing.
`noepi` drops the float epilogue (its output is wrong: a timing probe only).
"""
import sys
from pathlib import Path

src, out = Path(sys.argv[1]).read_text(), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)

STEP4 = """            lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4(x))));
            lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4(x + 4))));"""
EPI = """        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sv, acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(ov, _mm256_set1_ps(xsum[r * G + g]), acc[r][h]);"""
PREFETCH = """      if constexpr (R == 1) _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + t), _MM_HINT_T1);
      else _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetchL1 + t), _MM_HINT_T0);"""
DOT4 = "        if constexpr (BITS != 6) dot = _mm256_madd_epi16(lo16[r], _mm256_set1_epi16(1));  // a lane's two int16 sums"
X4 = "            const int8_t* x = xg + r * K + t * 8;\n" + STEP4


def variant(name: str, *swaps: tuple[str, str]) -> None:
    text = src
    for old, new in swaps:
        assert text.count(old) == 1, (name, old[:60])
        text = text.replace(old, new)
    (out / f"{name}.cpp").write_text(text)


variant("base")
variant("noepi", (EPI, "        acc[r][h] = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(acc[r][h]), dot));"))
variant("asm_steps", (STEP4, r"""            __m256i t1, t2;  // a row's step pinned: no copies of the accumulator
            __asm__("vpbroadcastd %[xa], %[t1]\n\tvpbroadcastd %[xb], %[t2]\n\t"
                    "vpmaddubsw %[t1], %[lo], %[t1]\n\tvpmaddubsw %[t2], %[hi], %[t2]\n\t"
                    "vpaddw %[t1], %[acc], %[acc]\n\tvpaddw %[t2], %[acc], %[acc]"
                    : [acc] "+x"(lo16[r]), [t1] "=&x"(t1), [t2] "=&x"(t2)
                    : [lo] "x"(lo), [hi] "x"(hi), [xa] "m"(*reinterpret_cast<const int32_u*>(x)),
                      [xb] "m"(*reinterpret_cast<const int32_u*>(x + 4)));"""))
variant("interleaved",  # activation rows interleaved per step: one base pointer (timing only; the caller is unchanged)
        (X4, X4.replace("xg + r * K + t * 8", "R == 1 ? xg + t * 8 : xq + ((g * 4 + t) * R + r) * 8")),
        ("_mm256_set1_ps(xsum[r * G + g])", "_mm256_set1_ps(R == 1 ? xsum[g] : xsum[g * R + r])"))
variant("split",  # two int16 accumulators a row (the sums stay exact: each <= 15240)
        (STEP4, STEP4.replace("lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(hi",
                              "hi16[r] = _mm256_add_epi16(hi16[r], _mm256_maddubs_epi16(hi")),
        (DOT4, "        if constexpr (BITS == 4) dot = _mm256_madd_epi16(_mm256_add_epi16(lo16[r], hi16[r]), _mm256_set1_epi16(1));\n"
               "        if constexpr (BITS == 8) dot = _mm256_madd_epi16(lo16[r], _mm256_set1_epi16(1));"))
variant("pf_dual16_2", (PREFETCH, """      _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + t), _MM_HINT_T1);
      if constexpr (R > 1) _mm_prefetch(reinterpret_cast<const char*>(wg + 2048 + t), _MM_HINT_T0);"""))
variant("pf_l2only", (PREFETCH, "      _mm_prefetch(reinterpret_cast<const char*>(wg + kPrefetch + t), _MM_HINT_T1);"))
