#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
unsigned char w[128*1024] __attribute__((aligned(64)));
signed char x[6*1536] __attribute__((aligned(64)));
#define ROW(acc, off) "vpbroadcastd " #off "(%2),%%ymm4\n\t" "vpmaddubsw %%ymm4,%%ymm1,%%ymm4\n\t" "vpaddw %%ymm4,%%ymm" #acc ",%%ymm" #acc "\n\t" \
                      "vpbroadcastd " #off "+4(%2),%%ymm5\n\t" "vpmaddubsw %%ymm5,%%ymm2,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t"
#define STEP "vmovdqu (%1),%%ymm0\n\t" "vpand %%ymm15,%%ymm0,%%ymm1\n\t" "vpsrlw $4,%%ymm0,%%ymm2\n\t" "vpand %%ymm15,%%ymm2,%%ymm2\n\t" \
  ROW(8,0) ROW(9,1536) ROW(10,3072) ROW(11,4608) ROW(12,6144) ROW(13,7680) "add $64,%1\n\t" "add $8,%2\n\t"
int main(){ long n=2000, m; double t0, dt; long steps = 0;
 t0=now();
 for (long it = 0; it < n; ++it) {  // over w: 1536 inputs x 16 cols x 8 blocks... each group-half 4 steps
   for (long blk = 0; blk < 8; ++blk) {
     unsigned char* wp = w + blk * 1536 * 8; signed char* xp = x;
     for (long g = 0; g < 48; ++g) {
       for (int h = 0; h < 2; ++h) {
         unsigned char* wh = wp + g * 256 + h * 32; signed char* xh = xp + g * 32;
         __asm__ volatile("vpcmpeqb %%ymm15,%%ymm15,%%ymm15\n\t" "vpxor %%ymm8,%%ymm8,%%ymm8\n\t" "vpxor %%ymm9,%%ymm9,%%ymm9\n\t" "vpxor %%ymm10,%%ymm10,%%ymm10\n\t"
          "vpxor %%ymm11,%%ymm11,%%ymm11\n\t" "vpxor %%ymm12,%%ymm12,%%ymm12\n\t" "vpxor %%ymm13,%%ymm13,%%ymm13\n\t"
          "mov $4,%0\n\t" STEP STEP STEP STEP
          "vpaddw %%ymm8,%%ymm9,%%ymm9\n\tvpaddw %%ymm10,%%ymm11,%%ymm11\n\tvpaddw %%ymm12,%%ymm13,%%ymm13\n\tvpaddw %%ymm9,%%ymm11,%%ymm11\n\tvpaddw %%ymm11,%%ymm13,%%ymm13\n\tvmovdqu %%ymm13,(%3)"
          : "=&r"(m), "+r"(wh), "+r"(xh) : "r"(w + 100000) : "memory","xmm0","xmm1","xmm2","xmm4","xmm5","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm15");
         steps += 4;
       }
     }
   }
 }
 dt=now()-t0; printf("group-halves: %.2f cycles/step, %.2f maddubs/cycle\n", dt*3.67e9/steps, steps*12/dt/3.67e9);
}
