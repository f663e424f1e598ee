#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <stdint.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int8_t buf[4096] __attribute__((aligned(64)));
int main(){ __m512i w=_mm512_set1_epi8(3), w2=_mm512_set1_epi8(2);
 for(int i=0;i<4096;i++) buf[i]=i;
 long N=50000000;
 { __m512i a[8]; for(int i=0;i<8;i++) a[i]=_mm512_set1_epi32(i); double t0=now();
  for(long i=0;i<N;i++){ const int8_t* p=buf+(i&63)*32;
   #pragma GCC unroll 8
   for(int j=0;j<8;j++){ __asm__("vpdpbusd %[p]%{1to16%}, %[w], %[acc]" : [acc] "+v"(a[j]) : [w] "v"(w), [p] "m"(*(const int32_t*)(p+j*4)));
     __asm__("vpdpbusd %[p]%{1to16%}, %[w], %[acc]" : [acc] "+v"(a[j]) : [w] "v"(w2), [p] "m"(*(const int32_t*)(p+j*4+256)));}
  }
  double t=now()-t0; int s=0; for(int i=0;i<8;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("embedded bcast, 8 rows x 2: %.2f G dpbusd/s (%d)\n", N*16/t/1e9, s);}
 { __m512i a[8]; for(int i=0;i<8;i++) a[i]=_mm512_set1_epi32(i); double t0=now();
  for(long i=0;i<N;i++){ const int8_t* p=buf+(i&63)*32;
   #pragma GCC unroll 8
   for(int j=0;j<8;j++){ a[j]=_mm512_dpbusd_epi32(a[j],w,_mm512_set1_epi32(*(const int32_t*)(p+j*4)));
     a[j]=_mm512_dpbusd_epi32(a[j],w2,_mm512_set1_epi32(*(const int32_t*)(p+j*4+256)));}
  }
  double t=now()-t0; int s=0; for(int i=0;i<8;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("vpbroadcastd, 8 rows x 2: %.2f G dpbusd/s (%d)\n", N*16/t/1e9, s);}
 { __m512i a[8]; for(int i=0;i<8;i++) a[i]=_mm512_set1_epi32(i); __m512i x=_mm512_set1_epi8(1); double t0=now();
  for(long i=0;i<N;i++){
   #pragma GCC unroll 8
   for(int j=0;j<8;j++){ a[j]=_mm512_dpbusd_epi32(a[j],w,x); a[j]=_mm512_dpbusd_epi32(a[j],w2,x);}
   __asm__ volatile("" : "+v"(x));
  }
  double t=now()-t0; int s=0; for(int i=0;i<8;i++) s+=_mm512_reduce_add_epi32(a[i]); printf("registers, 8 rows x 2: %.2f G dpbusd/s (%d)\n", N*16/t/1e9, s);}
}
