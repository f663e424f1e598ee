// vpdpbusd (zmm) throughput at 8, 12 and 4 independent chains, and its latency (one chain); ymm at 8.
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define L(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define Y(r) "vpdpbusd %%ymm30, %%ymm31, %%ymm" #r "\n\t"
int main(){
  double t0=now(); unsigned long z=0; for(long i=0;i<500000000;i++){ __asm__ volatile("add $1, %0":"+r"(z)); } double ghz=0.5/(now()-t0);
  long N=20000000; double t;
  t0=now(); for(long n=0;n<N;n++) __asm__ volatile(L(0)L(1)L(2)L(3)L(4)L(5)L(6)L(7) L(0)L(1)L(2)L(3)L(4)L(5)L(6)L(7) L(0)L(1)L(2)L(3)L(4)L(5)L(6)L(7):::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7");
  t=now()-t0; printf("zmm 8 chains: %.2f/cycle\n", N*24.0/(t*ghz*1e9));
  t0=now(); for(long n=0;n<N;n++) __asm__ volatile(L(0)L(1)L(2)L(3)L(4)L(5)L(6)L(7)L(8)L(9)L(10)L(11) L(0)L(1)L(2)L(3)L(4)L(5)L(6)L(7)L(8)L(9)L(10)L(11):::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11");
  t=now()-t0; printf("zmm 12 chains: %.2f/cycle\n", N*24.0/(t*ghz*1e9));
  t0=now(); for(long n=0;n<N;n++) __asm__ volatile(L(0)L(1)L(2)L(3) L(0)L(1)L(2)L(3) L(0)L(1)L(2)L(3) L(0)L(1)L(2)L(3):::"xmm0","xmm1","xmm2","xmm3");
  t=now()-t0; printf("zmm 4 chains: %.2f/cycle\n", N*16.0/(t*ghz*1e9));
  t0=now(); for(long n=0;n<N;n++) __asm__ volatile(L(0)L(0)L(0)L(0)L(0)L(0)L(0)L(0):::"xmm0");
  t=now()-t0; printf("zmm 1 chain: %.2f/cycle -> latency %.1f\n", N*8.0/(t*ghz*1e9), (t*ghz*1e9)/(N*8.0));
  t0=now(); for(long n=0;n<N;n++) __asm__ volatile(Y(0)Y(1)Y(2)Y(3)Y(4)Y(5)Y(6)Y(7) Y(0)Y(1)Y(2)Y(3)Y(4)Y(5)Y(6)Y(7):::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7");
  t=now()-t0; printf("ymm 8 chains: %.2f/cycle\n", N*16.0/(t*ghz*1e9));
  return 0;
}
