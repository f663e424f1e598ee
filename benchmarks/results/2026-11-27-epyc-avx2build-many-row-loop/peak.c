#include <stdio.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#ifndef OP
#define OP "vpmaddubsw"
#endif
#define M(d) OP " %%ymm0,%%ymm1,%%ymm" #d "\n\t"
#define A(d,s) "vpaddw %%ymm" #d ",%%ymm" #s ",%%ymm" #s "\n\t"
void* run(void* arg){ long n=(long)arg;
 __asm__ volatile("vpxor %%ymm0,%%ymm0,%%ymm0\n\tvpxor %%ymm1,%%ymm1,%%ymm1\n\t"
  "1:\n\t" M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) A(2,10) A(3,11) A(4,12) A(5,13) A(6,14) A(7,15) A(8,10) A(9,11)
  "dec %0\n\tjnz 1b" : "+r"(n) :: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15");
 return 0;}
int main(){ long n=200000000;
 for(int th=1;th<=2;th++){ pthread_t p[2]; double t0=now();
  for(int i=0;i<th;i++) pthread_create(&p[i],0,run,(void*)n);
  for(int i=0;i<th;i++) pthread_join(p[i],0);
  double dt=now()-t0; printf("%s %d threads: %.2f G/s total, %.2f per cycle per thread at 3.67 GHz\n",OP,th,th*n*8/dt/1e9, n*8/dt/1e9/3.67);}}
