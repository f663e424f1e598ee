#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
unsigned char w[64*1024] __attribute__((aligned(64)));
signed char x[65536] __attribute__((aligned(64)));
#define PRE "vpcmpeqb %%ymm15,%%ymm15,%%ymm15\n\t" "1:\n\t" "vmovdqu (%1),%%ymm0\n\t" "vpand %%ymm15,%%ymm0,%%ymm1\n\t" "vpsrlw $4,%%ymm0,%%ymm2\n\t" "vpand %%ymm15,%%ymm2,%%ymm2\n\t"
#define POST "dec %0\n\tjnz 1b" : "+r"(m) : "r"(w), "r"(x) : "memory","xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm15"
// bcast from memory (the kernel)
#define ROWB(acc, off) "vpbroadcastd " #off "(%2),%%ymm4\n\t" "vpmaddubsw %%ymm4,%%ymm1,%%ymm4\n\t" "vpaddw %%ymm4,%%ymm" #acc ",%%ymm" #acc "\n\t" \
                      "vpbroadcastd " #off "+4(%2),%%ymm5\n\t" "vpmaddubsw %%ymm5,%%ymm2,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t"
// no broadcast: a register
#define ROWR(acc, off) "vpmaddubsw %%ymm3,%%ymm1,%%ymm4\n\t" "vpaddw %%ymm4,%%ymm" #acc ",%%ymm" #acc "\n\t" \
                      "vpmaddubsw %%ymm3,%%ymm2,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t"
// memory operand: pre-broadcast activations, 32 bytes each
#define ROWM(acc, off) "vpmaddubsw " #off "(%2),%%ymm1,%%ymm4\n\t" "vpaddw %%ymm4,%%ymm" #acc ",%%ymm" #acc "\n\t" \
                      "vpmaddubsw " #off "+32(%2),%%ymm2,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t"
// one broadcastq serving lo and hi (two accumulators a row): its timing below is void (it clobbers ymm0/ymm15)
#define ROWQ(acc, acc2, off) "vpbroadcastq " #off "(%2),%%ymm4\n\t" "vpmaddubsw %%ymm4,%%ymm1,%%ymm5\n\t" "vpaddw %%ymm5,%%ymm" #acc ",%%ymm" #acc "\n\t" \
                      "vpmaddubsw %%ymm4,%%ymm2,%%ymm4\n\t" "vpaddw %%ymm4,%%ymm" #acc2 ",%%ymm" #acc2 "\n\t"
#define RUN(name, body) m=n; t0=now(); __asm__ volatile(PRE body POST); dt=now()-t0; printf("%s: %.2f cycles/step, %.2f maddubs/cycle\n", name, dt*3.67e9/n, n*12/dt/3.67e9);
int main(){ long n=100000000, m; double t0, dt;
 RUN("bcast-mem", ROWB(8,0) ROWB(9,1536) ROWB(10,3072) ROWB(11,4608) ROWB(12,6144) ROWB(13,7680))
 RUN("register ", ROWR(8,0) ROWR(9,1536) ROWR(10,3072) ROWR(11,4608) ROWR(12,6144) ROWR(13,7680))
 RUN("mem-opnd ", ROWM(8,0) ROWM(9,1536) ROWM(10,3072) ROWM(11,4608) ROWM(12,6144) ROWM(13,7680))
 RUN("bcastq   ", ROWQ(8,3,0) ROWQ(9,6,1536) ROWQ(10,7,3072) ROWQ(11,14,4608) ROWQ(12,0,6144) ROWQ(13,15,7680))
}
