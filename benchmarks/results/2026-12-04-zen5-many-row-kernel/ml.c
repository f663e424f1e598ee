#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){ __m512i w=_mm512_set1_epi32(3);
 long N=100000000;
 { __m512i a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i); double t0=now();
  for(long i=0;i<N;i++){
   #pragma GCC unroll 12
   for(int j=0;j<12;j++) a[j]=_mm512_mullo_epi32(a[j],w);
   __asm__ volatile("" : "+v"(w));}
  double t=now()-t0; int s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("vpmulld: %.2f G/s (%d)\n", N*12/t/1e9, s);}
 { __m512i a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i); __m512i x=_mm512_set1_epi8(1); double t0=now();
  for(long i=0;i<N;i++){
   #pragma GCC unroll 12
   for(int j=0;j<12;j++) a[j]=_mm512_dpbusd_epi32(a[j],w,x);
   a[0]=_mm512_mullo_epi32(a[0],w); a[4]=_mm512_mullo_epi32(a[4],w);
   __asm__ volatile("" : "+v"(w));}
  double t=now()-t0; int s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("12 dpbusd + 2 mulld: %.2f G dpbusd/s (%d)\n", N*12/t/1e9, s);}
 { __m512i a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i); __m512i x=_mm512_set1_epi8(1); double t0=now();
  for(long i=0;i<N;i++){
   #pragma GCC unroll 12
   for(int j=0;j<12;j++) a[j]=_mm512_dpbusd_epi32(a[j],w,x);
   a[0]=_mm512_madd_epi16(a[0],w); a[4]=_mm512_madd_epi16(a[4],w);
   __asm__ volatile("" : "+v"(w));}
  double t=now()-t0; int s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("12 dpbusd + 2 maddwd: %.2f G dpbusd/s (%d)\n", N*12/t/1e9, s);}
}
