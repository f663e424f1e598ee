// Cycles for 8 independent zmm vpdpbusd plus two (or more) other instructions: which share its pipes.
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define D(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define D8 D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7)
#define CL :"m"(buf[0]):"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13"
int buf[64];
int main(){
  double t0=now(); unsigned long z=0; for(long i=0;i<500000000;i++){ __asm__ volatile("add $1, %0":"+r"(z)); } double ghz=0.5/(now()-t0);
  long N=20000000; double t;
#define RUN(name, extra) t0=now(); for(long n=0;n<N;n++) __asm__ volatile(D8 extra ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13"); t=now()-t0; printf("%-40s %.2f cycles per 8 dpbusd\n", name, t*ghz*1e9/N);
  RUN("8 dpbusd", "")
  RUN("+2 fma", "vfmadd231ps %%zmm30, %%zmm31, %%zmm8\n\tvfmadd231ps %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 vpmulld", "vpmulld %%zmm30, %%zmm31, %%zmm8\n\tvpmulld %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 vpmaddwd", "vpmaddwd %%zmm30, %%zmm31, %%zmm8\n\tvpmaddwd %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 vpdpwssd", "vpdpwssd %%zmm30, %%zmm31, %%zmm8\n\tvpdpwssd %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 cvtdq2ps", "vcvtdq2ps %%zmm30, %%zmm8\n\tvcvtdq2ps %%zmm31, %%zmm9\n\t")
  RUN("+2 vaddps", "vaddps %%zmm30, %%zmm31, %%zmm8\n\tvaddps %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 vpaddd", "vpaddd %%zmm30, %%zmm31, %%zmm8\n\tvpaddd %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 vmulps", "vmulps %%zmm30, %%zmm31, %%zmm8\n\tvmulps %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+4 vpandd+2 vpsrlw", "vpandd %%zmm30, %%zmm31, %%zmm8\n\tvpandd %%zmm30, %%zmm31, %%zmm9\n\tvpandd %%zmm30, %%zmm31, %%zmm10\n\tvpandd %%zmm30, %%zmm31, %%zmm11\n\tvpsrlw $4, %%zmm31, %%zmm12\n\tvpsrlw $4, %%zmm31, %%zmm13\n\t")
  RUN("+8 vpbroadcastd mem", "vpbroadcastd buf(%%rip), %%zmm8\n\tvpbroadcastd buf+4(%%rip), %%zmm9\n\tvpbroadcastd buf+8(%%rip), %%zmm10\n\tvpbroadcastd buf+12(%%rip), %%zmm11\n\tvpbroadcastd buf+16(%%rip), %%zmm12\n\tvpbroadcastd buf+20(%%rip), %%zmm13\n\tvpbroadcastd buf+24(%%rip), %%zmm8\n\tvpbroadcastd buf+28(%%rip), %%zmm9\n\t")
  RUN("+2 vpmovzxbd mem", "vpmovzxbd buf(%%rip), %%zmm8\n\tvpmovzxbd buf+16(%%rip), %%zmm9\n\t")
  RUN("+2 vpermd", "vpermd %%zmm30, %%zmm31, %%zmm8\n\tvpermd %%zmm30, %%zmm31, %%zmm9\n\t")
  RUN("+2 vpshufb", "vpshufb %%zmm30, %%zmm31, %%zmm8\n\tvpshufb %%zmm30, %%zmm31, %%zmm9\n\t")
  return 0;
}
