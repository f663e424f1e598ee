// Read bandwidth over 1 GB with OpenMP threads (OMP_NUM_THREADS), 512-bit loads; argument: L2 prefetch distance (0: none).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t N=(size_t)1<<30; // 1 GB
  int pf = argc>1?atoi(argv[1]):0;
  unsigned char*b=aligned_alloc(64,N); memset(b,1,N);
  for(int rep=0;rep<6;rep++){
    double t0=now(); long tot=0;
    #pragma omp parallel reduction(+:tot)
    {
      int t=omp_get_thread_num(), n=omp_get_num_threads();
      size_t lo=N/n*t, hi=N/n*(t+1);
      __m512i acc=_mm512_setzero_si512();
      for(size_t i=lo;i<hi;i+=256){
        if(pf) _mm_prefetch((const char*)b+i+pf,_MM_HINT_T1), _mm_prefetch((const char*)b+i+pf+64,_MM_HINT_T1),_mm_prefetch((const char*)b+i+pf+128,_MM_HINT_T1),_mm_prefetch((const char*)b+i+pf+192,_MM_HINT_T1);
        acc=_mm512_add_epi32(acc,_mm512_load_si512(b+i));
        acc=_mm512_add_epi32(acc,_mm512_load_si512(b+i+64));
        acc=_mm512_add_epi32(acc,_mm512_load_si512(b+i+128));
        acc=_mm512_add_epi32(acc,_mm512_load_si512(b+i+192));
      }
      tot+=_mm512_reduce_add_epi32(acc);
    }
    double dt=now()-t0; printf("pf %d: %.1f GB/s (%ld)\n",pf,N/dt/1e9,tot&1);
  }
}
