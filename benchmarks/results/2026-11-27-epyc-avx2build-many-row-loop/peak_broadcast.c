#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
char buf[4096] __attribute__((aligned(64)));
#define B(d,o) LD " " #o "(%1),%%ymm" #d "\n\t"
#define M(d) "vpmaddubsw %%ymm" #d ",%%ymm1,%%ymm" #d "\n\t"
#define A(d,s) "vpaddw %%ymm" #d ",%%ymm" #s ",%%ymm" #s "\n\t"
int main(){ long n=200000000, m=n; double t0=now();
 __asm__ volatile("vpxor %%ymm1,%%ymm1,%%ymm1\n\t"
  "1:\n\t" B(2,0) B(3,4) B(4,8) B(5,12) B(6,16) B(7,20) M(2) M(3) M(4) M(5) M(6) M(7) A(2,10) A(3,11) A(4,12) A(5,13) A(6,14) A(7,15)
  B(2,32) B(3,36) B(4,40) B(5,44) B(6,48) B(7,52) M(2) M(3) M(4) M(5) M(6) M(7) A(2,10) A(3,11) A(4,12) A(5,13) A(6,14) A(7,15)
  "dec %0\n\tjnz 1b" : "+r"(m) : "r"(buf) : "xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15");
 double dt=now()-t0; printf("%s: %.2f maddubs per cycle\n", LD, n*12/dt/1e9/3.67);}
