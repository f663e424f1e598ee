#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main(){
  const long N=200000000;
  // clock: dependent add chain
  long x=0; auto t0=std::chrono::steady_clock::now();
  for(long i=0;i<N;++i){ asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
  double dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  printf("GHz ~ %.2f\n", 4.0*N/dt/1e9);
  __m256i a0=_mm256_set1_epi8(3),b=_mm256_set1_epi8(5);
  __m256i s[8]; for(int i=0;i<8;++i) s[i]=_mm256_set1_epi16(i);
  t0=std::chrono::steady_clock::now();
  for(long i=0;i<N/10;++i){
    for(int k=0;k<8;++k) { __m256i p; asm volatile("vpmaddubsw %1, %2, %0" : "=x"(p) : "x"(b), "x"(a0)); asm volatile("vpaddw %1, %0, %0" : "+x"(s[k]) : "x"(p)); }
  }
  dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  printf("maddubs+addw pairs/ns %.3f\n", 8.0*(N/10)/dt/1e9);
  t0=std::chrono::steady_clock::now();
  for(long i=0;i<N/10;++i){
    for(int k=0;k<8;++k) { __m256i p; asm volatile("vpmaddubsw %1, %2, %0" : "=x"(p) : "x"(b), "x"(a0)); asm volatile("" :: "x"(p)); }
  }
  dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  printf("maddubs alone /ns %.3f\n", 8.0*(N/10)/dt/1e9);
  int mem[64]={1};
  t0=std::chrono::steady_clock::now();
  for(long i=0;i<N/10;++i){
    for(int k=0;k<8;++k) { __m256i p; asm volatile("vpbroadcastd %1, %0" : "=x"(p) : "m"(mem[k])); asm volatile("vpmaddubsw %1, %2, %0" : "=x"(p) : "x"(p), "x"(a0)); asm volatile("vpaddw %1, %0, %0" : "+x"(s[k]) : "x"(p)); }
  }
  dt=std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
  printf("bcast+maddubs+addw /ns %.3f\n", 8.0*(N/10)/dt/1e9);
  for(int i=0;i<8;++i) x+=_mm256_extract_epi16(s[i],0);
  return x==42;
}
