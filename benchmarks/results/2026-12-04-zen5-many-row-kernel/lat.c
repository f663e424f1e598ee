#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define RUN(NC) { __m512i a[NC]; for(int i=0;i<NC;i++) a[i]=_mm512_set1_epi32(i); long N=100000000; double t0=now(); \
  for(long i=0;i<N;i++){ _Pragma("GCC unroll 16") for(int j=0;j<NC;j++) a[j]=_mm512_dpbusd_epi32(a[j],w,x); __asm__ volatile("" : "+v"(w)); } \
  double t=now()-t0; int s=0; for(int i=0;i<NC;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("%2d chains: %.2f G dpbusd/s (%d)\n", NC, N*NC/t/1e9, s);}
int main(){ __m512i w=_mm512_set1_epi8(3), x=_mm512_set1_epi8(5);
 RUN(1) RUN(2) RUN(4) RUN(6) RUN(8) RUN(10) RUN(12) RUN(16) }
