#include <chrono>
#include <cstdio>
#include <immintrin.h>
int main(){ long n=1000000000; long x=0; auto t0=std::chrono::steady_clock::now();
 for(long i=0;i<n;++i){ asm volatile("add $1, %0" : "+r"(x)); }
 auto t1=std::chrono::steady_clock::now(); double s=std::chrono::duration<double>(t1-t0).count();
 printf("%.3f GHz (dep add chain)\n", n/s/1e9);
 __m512i a[8]; for(int r=0;r<8;++r) a[r]=_mm512_set1_epi32(r); __m512i w=_mm512_set1_epi8(1), xx=_mm512_set1_epi8(2);
 t0=std::chrono::steady_clock::now(); long m=200000000;
 for(long i=0;i<m;++i) for(int r=0;r<8;++r) a[r]=_mm512_dpbusd_epi32(a[r],w,xx);
 t1=std::chrono::steady_clock::now(); s=std::chrono::duration<double>(t1-t0).count();
 int o[16]; _mm512_storeu_si512(o,a[3]); printf("dpbusd no-broadcast: %.3f ns each (%d)\n", s/(8.0*m)*1e9, o[0]);
}
