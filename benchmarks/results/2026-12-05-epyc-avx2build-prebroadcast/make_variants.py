"""Write orig.h (the AVX2 build's block<R, BITS> from w4a8.cpp, as the package compiles it) and varE.h (the same with
each row's 4 activation bytes read as a 32-byte copy from a pre-broadcast buffer instead of vpbroadcastd).

    python make_variants.py ../../../verispec/models/kernels/w4a8.cpp
"""
import sys

src = open(sys.argv[1]).read()
a = src.index("template <int R, int BITS>\nvoid block", src.index("#elif defined(__AVX2__)"))
body = src[a:src.index("#else\n#error")]
open("orig.h", "w").write(body)
old = ("lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x4(x))));\n"
       "              lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x4(x + 4))));")
new = ("const __m256i* xe = reinterpret_cast<const __m256i*>(XE + r * K * 8 + (g * 32 + t * 8) * 8);\n"
       "              lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, _mm256_load_si256(xe)));\n"
       "              lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(hi, _mm256_load_si256(xe + 1)));")
assert old in body
open("varE.h", "w").write("static const int8_t* XE;\n" + body.replace(old, new))
