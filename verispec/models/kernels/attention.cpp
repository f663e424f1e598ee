// Attention of a few new queries over a float32 KV cache: what a decoding step, a draft step and a verification
// forward spend their non-matmul time in on a CPU.
//
// Each query is computed on its own, by the same instructions whatever else is in the forward: its scores over
// the keys it sees, their softmax and the weighted sum of values depend only on (query, those keys and values).
// So a token verified among drafts, or in a batch of rows, gets the bits that a one-token decoding step gives it,
// which exact greedy speculation needs. (torch's attention kernels tile queries together and round a query's
// result differently with other queries beside it; the Python fallback therefore calls them once per query.)
//
// The code uses GCC's 16-float vectors (one AVX-512 register, or two AVX2 ones): element-wise IEEE operations in a
// fixed order, no reassociation or contraction (-ffp-contract=off), so the AVX-512 and AVX2 builds give the same
// bits. A head dimension that is not a multiple of 16 is zero-padded in registers (zeros add nothing).
#include "ops.h"
#include "tensor.h"
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec.h"

namespace {

// One (row, key head, query) of attention() for its R query heads. ND: vectors per head (D / 16) when a
// compile-time constant for the common head sizes (a multiple of 16), so that a head's vectors stay in
// registers; 0: at run time, the last vector zero-padded.
//
// The keys a query sees are taken in order and packed (the c-th seen key is score c), so a query's arithmetic
// depends on which keys it sees, never on where they sit: a token-tree node that sees the prefix and its ancestors
// (slots with gaps between them) gets the bits a decoding step over the same keys, side by side, gives.
template <int ND>
void attend(const float* const* qs, int64_t R, const float* kb, int64_t ks, const float* vb, int64_t vs,
            const bool* seen, int64_t n, int64_t D, float scale, float* const* os, std::vector<float>& scores,
            std::vector<int64_t>& keys) {
  const int64_t nd = ND ? ND : (D + kLanes - 1) / kLanes;
  const int tail = ND ? kLanes : static_cast<int>(D - (nd - 1) * kLanes);  // floats in the last vector
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  scores.assign(R * padded, kNegInf);
  keys.resize(n);
  f16v kv[ND ? ND : 1];
  std::vector<f16v> dyn(ND ? 0 : nd);
  f16v* kj = ND ? kv : dyn.data();
  int64_t c = 0;  // keys seen so far
  for (int64_t j = 0; j < n; ++j) {
    if (seen && !seen[j]) continue;
    for (int64_t i = 0; i < nd; ++i) kj[i] = ND ? load(kb + j * ks + i * kLanes) : load(kb + j * ks + i * kLanes, i + 1 < nd ? kLanes : tail);
    for (int64_t r = 0; r < R; ++r) {
      f16v acc = (ND ? load(qs[r]) : load(qs[r], nd > 1 ? kLanes : tail)) * kj[0];
      for (int64_t i = 1; i < nd; ++i) acc += (ND ? load(qs[r] + i * kLanes) : load(qs[r] + i * kLanes, i + 1 < nd ? kLanes : tail)) * kj[i];
      scores[r * padded + c] = hsum(acc) * scale;
    }
    keys[c++] = j;
  }
  const int64_t used = (c + kLanes - 1) / kLanes * kLanes;
  for (int64_t r = 0; r < R; ++r) {
    float* s = scores.data() + r * padded;
    float m = kNegInf;
    for (int64_t j = 0; j < c; ++j) m = s[j] > m ? s[j] : m;
    float* o = os[r];
    if (m == kNegInf) {  // sees no key: zeros, as a fully masked row would be
      std::memset(o, 0, sizeof(float) * D);
      continue;
    }
    f16v sum = {};
    for (int64_t j = 0; j < used; j += kLanes) {
      const f16v p = exp16(load(s + j) - m);  // the padding's -inf gives 0
      store(s + j, p);
      sum += p;
    }
    const float total = hsum(sum);
    f16v accv[ND ? ND : 1] = {};
    std::vector<f16v> accd(ND ? 0 : nd);
    f16v* acc = ND ? accv : accd.data();
    for (int64_t j = 0; j < c; ++j) {
      if (s[j] == 0.0f) continue;  // adds nothing (e^x below -87)
      const f16v p = splat(s[j]);
      const float* vj = vb + keys[j] * vs;
      for (int64_t i = 0; i < nd; ++i) acc[i] += p * (ND ? load(vj + i * kLanes) : load(vj + i * kLanes, i + 1 < nd ? kLanes : tail));
    }
    for (int64_t i = 0; i < nd; ++i) {
      const f16v out = acc[i] / total;
      store(o + i * kLanes, out, i + 1 < nd ? kLanes : tail);
    }
  }
}

}  // namespace

void attention_into(const float* qp, Strides qs_, const float* kp, Strides ks, const float* vp, Strides vs,
                    const int64_t* rows, const bool* mp, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S,
                    int64_t D, float sc, float* op, Strides os_) {
  const int64_t R = H / KV;  // query heads per key head
  const auto fn = D == 128 ? attend<8> : D == 64 ? attend<4> : attend<0>;
  // one task per (row, key head, query): its R query heads share every key and value read
  at::parallel_for(0, B * KV * T, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int64_t> keys;
    thread_local std::vector<const float*> qs;
    thread_local std::vector<float*> os;
    qs.resize(R);
    os.resize(R);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / (KV * T), g = (i / T) % KV, t = i % T, row = rows ? rows[b] : b;
      const bool* seen = mp ? mp + (b * T + t) * S : nullptr;
      int64_t n = S - T + t + 1;  // keys 0 .. n - 1 hold every key this query sees
      if (mp) {
        n = S;
        while (n > 0 && !seen[n - 1]) --n;
      }
      for (int64_t r = 0; r < R; ++r) {
        qs[r] = qp + b * qs_.b + (g * R + r) * qs_.h + t * qs_.t;
        os[r] = op + b * os_.b + (g * R + r) * os_.h + t * os_.t;
      }
      fn(qs.data(), R, kp + row * ks.b + g * ks.h, ks.t, vp + row * vs.b + g * vs.h, vs.t, seen, n, D, sc, os.data(),
         scores, keys);
    }
  });
}

// q [B, H, T, D], k and v [B, KV, S, D] (any strides, the last dimension contiguous), all float32; mask [B, T, S]
// bool (true: the query sees the key), or empty for causal (query t sees keys 0 .. S - T + t). H a multiple of
// KV (grouped-query attention). Returns softmax(q k^T * scale) v as [B, H, T, D] float32.
torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v: [B, heads, tokens, head_dim]");
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
              v.scalar_type() == torch::kFloat32, "q, k, v: float32");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "q, k, v: contiguous head_dim");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t KV = k.size(1), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == KV && v.size(2) == S && k.size(3) == D &&
              v.size(3) == D && KV > 0 && H % KV == 0 && D > 0, "k, v: [B, KV, S, D] with H a multiple of KV");
  TORCH_CHECK(T <= S, "more queries than keys");
  const bool masked = mask.numel() > 0;
  if (masked)
    TORCH_CHECK(mask.scalar_type() == torch::kBool && mask.is_contiguous() && mask.dim() == 3 &&
                mask.size(0) == B && mask.size(1) == T && mask.size(2) == S, "mask: contiguous [B, T, S] bool");
  auto out = torch::empty({B, H, T, D}, torch::kFloat32);
  const auto strides = [](const torch::Tensor& x) { return Strides{x.stride(0), x.stride(1), x.stride(2)}; };
  attention_into(q.data_ptr<float>(), strides(q), k.data_ptr<float>(), strides(k), v.data_ptr<float>(), strides(v),
                 nullptr, masked ? mask.data_ptr<bool>() : nullptr, B, H, KV, T, S, D, static_cast<float>(scale),
                 out.data_ptr<float>(), Strides{H * T * D, T * D, D});
  return out;
}
