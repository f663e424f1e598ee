#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <stdint.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  __m512i a[12]; for(int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i);
  __m512i w=_mm512_set1_epi8(3), x=_mm512_set1_epi8(5);
  long N=200000000;
  double t0=now();
  for(long i=0;i<N;i++){
    #pragma GCC unroll 12
    for(int j=0;j<12;j++) a[j]=_mm512_dpbusd_epi32(a[j],w,x);
    __asm__ volatile("" : "+v"(w));
  }
  double t=now()-t0;
  int s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]);
  printf("dpbusd zmm: %.2f G/s (%d)\n", N*12/t/1e9, s);
  // add chain
  t0=now();
  for(long i=0;i<N;i++){
    #pragma GCC unroll 12
    for(int j=0;j<12;j++) a[j]=_mm512_add_epi32(a[j],w);
    __asm__ volatile("" : "+v"(w));
  }
  t=now()-t0; s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]);
  printf("add zmm: %.2f G/s (%d)\n", N*12/t/1e9, s);
}
