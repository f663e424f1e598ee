#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <chrono>
#include <vector>
struct alignas(64) Cfg { uint8_t p=1, s=0, r[14]={}; uint16_t c[16]={}; uint8_t rows[16]={}; };
int main() {
  printf("perm %ld\n", syscall(SYS_arch_prctl, 0x1023, 18));
  Cfg cfg; for (int t=0;t<8;++t){cfg.rows[t]=16; cfg.c[t]=64;}
  _tile_loadconfig(&cfg);
  alignas(64) static int8_t A[16*4096]; alignas(64) static uint8_t B[16*64*256]; alignas(64) static int32_t C[256*4];
  const long N = 20000000;
  auto t0 = std::chrono::steady_clock::now();
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, A, 64); _tile_loadd(5, B, 64);
  for (long i = 0; i < N; ++i) { _tile_dpbsud(0,4,5); _tile_dpbsud(1,4,5); _tile_dpbsud(2,4,5); _tile_dpbsud(3,4,5); }
  _tile_stored(0, C, 64);
  auto t1 = std::chrono::steady_clock::now();
  double s = std::chrono::duration<double>(t1-t0).count();
  printf("dp only: %.2f ns per tdpbsud (16x16x64) = %.1f GMAC/s\n", s/(4.0*N)*1e9, 4.0*N*16*16*64/s/1e9);
  const long M = 2000000;
  t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < M; ++i) {
    int off = (i & 255) * 64;
    _tile_loadd(4, A + (i & 63) * 64, 4096); _tile_loadd(5, B + off * 16 % (16*64*255), 64);
    _tile_zero(0); _tile_dpbsud(0,4,5);
    _tile_loadd(6, A + (i & 63) * 64 + 32, 4096); _tile_loadd(7, B + (off*16 + 1024) % (16*64*255), 64);
    _tile_zero(1); _tile_dpbsud(1,6,7);
  }
  _tile_stored(0, C, 64);
  t1 = std::chrono::steady_clock::now();
  s = std::chrono::duration<double>(t1-t0).count();
  printf("zero+2 loads+dp: %.2f ns per group\n", s/(2.0*M)*1e9);
  t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < M; ++i) {
    _tile_zero(0); _tile_dpbsud(0,4,5); _tile_stored(0, C, 64);
    _tile_zero(1); _tile_dpbsud(1,6,7); _tile_stored(1, C+256, 64);
  }
  t1 = std::chrono::steady_clock::now();
  s = std::chrono::duration<double>(t1-t0).count();
  printf("zero+dp+store: %.2f ns per group\n", s/(2.0*M)*1e9);
  // VNNI reference
  __m512i acc[8]; for (int r=0;r<8;++r) acc[r]=_mm512_setzero_si512();
  __m512i w = _mm512_set1_epi8(3);
  t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < N; ++i) for (int r=0;r<8;++r) acc[r] = _mm512_dpbusd_epi32(acc[r], w, _mm512_set1_epi32(i+r));
  t1 = std::chrono::steady_clock::now();
  s = std::chrono::duration<double>(t1-t0).count();
  int32_t out[16]; __m512i t=acc[0]; for(int r=1;r<8;++r) t=_mm512_add_epi32(t,acc[r]); _mm512_storeu_si512(out,t);
  printf("vpdpbusd: %.3f ns each = %.1f GMAC/s (%d)\n", s/(8.0*N)*1e9, 8.0*N*64/s/1e9, out[0]);
  _tile_release();
}
