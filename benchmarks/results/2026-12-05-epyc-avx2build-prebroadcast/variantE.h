constexpr bool kVnni=false;
inline __m256i dpbusd(__m256i a, __m256i, __m256i){return a;}
inline __m256i dpwssd(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
inline __m256i top3(__m256i top, int b) { return top; }
constexpr int kPrefetch = 16384; constexpr int kPrefetchL1 = PF;
template <int R, int BITS> constexpr bool kUnroll = (BITS == 6 && R <= 2) || (BITS == 4 && R == 1);
#include "varE.h"
template <int R> void block(const uint8_t* w, const uint8_t* c, const uint16_t* u, const int8_t* xq, const int32_t* xsum2, const float* sx, const float* bias, int64_t K, float* y, int64_t ldy) { block<R,4>(w,c,u,xq,xsum2,sx,bias,K,y,ldy); }
