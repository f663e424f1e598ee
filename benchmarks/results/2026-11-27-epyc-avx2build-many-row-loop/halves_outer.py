"""Write the `halves_outer` variant of w4a8.cpp's AVX2 block (2026-11-27, second session): the two 8-column halves
as the outer loop over all of K, so each row keeps one float accumulator instead of two.

    python halves_outer.py ../../../verispec/models/kernels/w4a8.cpp /tmp/hout.cpp
    bash mkharness.sh /tmp/hout.cpp /tmp/hout_h.cpp && g++ -O3 -ffp-contract=off -mavx2 -mfma -mf16c /tmp/hout_h.cpp -o /tmp/hout_h && /tmp/hout_h 4
"""
import sys
from pathlib import Path

src = Path(sys.argv[1]).read_text()
a, b = src.index("  __m256 acc[R][2];"), src.index("#else\n#error")
new = src[a:b]
for old, rep in [
    ("  __m256 acc[R][2];\n  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();\n  for (int64_t g = 0; g < G; ++g) {",
     "  for (int h = 0; h < 2; ++h) {\n  __m256 acc[R];\n  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();\n  for (int64_t g = 0; g < G; ++g) {"),
    ("    for (int t = 0; t < kGroupBytes; t += 64) {", "    if (h == 0) for (int t = 0; t < kGroupBytes; t += 64) {"),
    ("    for (int h = 0; h < 2; ++h) {  // a half is 8 columns; the second half's bytes are in L1 by then\n", "    {\n"),
    ("acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sv, acc[r][h]);", "acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sv, acc[r]);"),
    ("acc[r][h] = _mm256_fmadd_ps(ov, _mm256_set1_ps(xsum[r * G + g]), acc[r][h]);", "acc[r] = _mm256_fmadd_ps(ov, _mm256_set1_ps(xsum[r * G + g]), acc[r]);"),
    ("  for (int h = 0; h < 2; ++h) {\n    const __m256 b = bias ? _mm256_loadu_ps(bias + h * 8) : _mm256_setzero_ps();\n"
     "    for (int r = 0; r < R; ++r)\n      _mm256_storeu_ps(y + r * ldy + h * 8, _mm256_fmadd_ps(acc[r][h], _mm256_set1_ps(sx[r]), b));\n  }\n}",
     "  const __m256 b = bias ? _mm256_loadu_ps(bias + h * 8) : _mm256_setzero_ps();\n  for (int r = 0; r < R; ++r)\n"
     "    _mm256_storeu_ps(y + r * ldy + h * 8, _mm256_fmadd_ps(acc[r], _mm256_set1_ps(sx[r]), b));\n  }\n}"),
]:
    assert new.count(old) == 1, old[:60]
    new = new.replace(old, rep)
Path(sys.argv[2]).write_text(src[:a] + new + src[b:])
