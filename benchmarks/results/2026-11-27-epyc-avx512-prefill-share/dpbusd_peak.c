// vpdpbusd / vpaddd / FMA throughput, 24 independent chains, one core: zmm and ymm forms.
#include <stdio.h>
#include <time.h>
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define R24(OP, W) OP(W, 0) OP(W, 1) OP(W, 2) OP(W, 3) OP(W, 4) OP(W, 5) OP(W, 6) OP(W, 7) OP(W, 8) OP(W, 9) OP(W, 10) \
  OP(W, 11) OP(W, 12) OP(W, 13) OP(W, 14) OP(W, 15) OP(W, 16) OP(W, 17) OP(W, 18) OP(W, 19) OP(W, 20) OP(W, 21)    \
  OP(W, 22) OP(W, 23)
#define DP(W, r) "vpdpbusd %%" #W "30, %%" #W "31, %%" #W #r "\n\t"
#define AD(W, r) "vpaddd %%" #W "30, %%" #W "31, %%" #W #r "\n\t"
#define FM(W, r) "vfmadd231ps %%" #W "30, %%" #W "31, %%" #W #r "\n\t"
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
  "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"
#define RUN(name, body)                                                                        \
  t0 = now();                                                                                  \
  for (long n = 0; n < N; n++) __asm__ volatile(body ::: CLOBBER);                             \
  printf("%-26s %.2f per cycle\n", name, N * 24.0 / ((now() - t0) * ghz * 1e9));
int main() {
  double t0 = now();
  unsigned long z = 0;
  for (long i = 0; i < 1000000000; i++) __asm__ volatile("add $1, %0" : "+r"(z));
  const double ghz = 1.0 / (now() - t0);  // a dependent add a cycle
  printf("~%.2f GHz\n", ghz);
  const long N = 20000000;
  RUN("zmm vpdpbusd, 24 chains", R24(DP, zmm))
  RUN("ymm vpdpbusd, 24 chains", R24(DP, ymm))
  RUN("zmm vpaddd", R24(AD, zmm))
  RUN("zmm vfmadd231ps", R24(FM, zmm))
  return 0;
}
