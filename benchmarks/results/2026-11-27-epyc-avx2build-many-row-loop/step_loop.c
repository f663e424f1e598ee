#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
unsigned char w[64*1024] __attribute__((aligned(64)));
signed char x[8192] __attribute__((aligned(64)));
// per step: load w, split nibbles, 6 rows x (2 bcast, 2 maddubs, 2 add)
#define ROW(acc, off) "vpbroadcastd " #off "(%2),%%ymm4\n\t" "vpmaddubsw %%ymm4,%%ymm1,%%ymm4\n\t" "vpaddw %%ymm4,%%ymm" #acc ",%%ymm" #acc "\n\t" \
                      "vpbroadcastd " #off "+4(%2),%%ymm5\n\t" "vpmaddubsw %%ymm5,%%ymm2,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t"
#define ROWP(acc, off) "vpbroadcastd " #off "(%2),%%ymm4\n\t" "vpbroadcastd " #off "+4(%2),%%ymm5\n\t" "vpmaddubsw %%ymm4,%%ymm1,%%ymm4\n\t" "vpmaddubsw %%ymm5,%%ymm2,%%ymm5\n\t" "vpaddw %%ymm4,%%ymm5,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t"
int main(){ long n=100000000, m; double t0, dt;
 m=n; t0=now();
 __asm__ volatile("vpcmpeqb %%ymm15,%%ymm15,%%ymm15\n\t"
  "1:\n\t" "vmovdqu (%1),%%ymm0\n\t" "vpand %%ymm15,%%ymm0,%%ymm1\n\t" "vpsrlw $4,%%ymm0,%%ymm2\n\t" "vpand %%ymm15,%%ymm2,%%ymm2\n\t"
  ROW(8,0) ROW(9,1536) ROW(10,3072) ROW(11,4608) ROW(12,6144) ROW(13,7680)
  "dec %0\n\tjnz 1b" : "+r"(m) : "r"(w), "r"(x) : "memory","xmm0","xmm1","xmm2","xmm4","xmm5","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm15");
 dt=now()-t0; printf("chain2: %.2f cycles/step, %.2f maddubs/cycle\n", dt*3.67e9/n, n*12/dt/3.67e9);
 m=n; t0=now();
 __asm__ volatile("vpcmpeqb %%ymm15,%%ymm15,%%ymm15\n\t"
  "1:\n\t" "vmovdqu (%1),%%ymm0\n\t" "vpand %%ymm15,%%ymm0,%%ymm1\n\t" "vpsrlw $4,%%ymm0,%%ymm2\n\t" "vpand %%ymm15,%%ymm2,%%ymm2\n\t"
  ROWP(8,0) ROWP(9,1536) ROWP(10,3072) ROWP(11,4608) ROWP(12,6144) ROWP(13,7680)
  "dec %0\n\tjnz 1b" : "+r"(m) : "r"(w), "r"(x) : "memory","xmm0","xmm1","xmm2","xmm4","xmm5","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm15");
 dt=now()-t0; printf("pair:   %.2f cycles/step, %.2f maddubs/cycle\n", dt*3.67e9/n, n*12/dt/3.67e9);
}
