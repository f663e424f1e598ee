// A decoder layer's work around attention, in two calls, for a model whose linears all run on the w4a8 kernel:
//   layer_pre:  RMSNorm -> q/k/v projection (+ bias) -> rope on q and k
//   layer_post: output projection + residual -> RMSNorm -> gate/up projection -> SiLU(gate) * up -> down
//               projection + residual
// In Python these are ~40 small torch calls a layer, each costing more dispatch than arithmetic at one token
// (about 0.25 ms a layer of the 0.5B draft: a third of its step). Here they are loops over rows, so every row's
// result depends on that row alone (exact greedy speculation needs that), in the same fixed order in both builds
// (vec.h; -ffp-contract=off).
#include "tensor.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec.h"

torch::Tensor w4a8_mm(torch::Tensor x, torch::Tensor w, torch::Tensor s, torch::Tensor o, torch::Tensor bias);

namespace {

// fn(m) for the rows m = 0 .. M - 1 of an element-wise step: on the calling thread up to 16 rows (a decoding step,
// a verification), split over the threads above that (a prompt's prefill: 2-3% of its time on 2 cores). A row's
// arithmetic is the same on any thread, so its bits do not depend on the split.
template <typename F>
void for_rows(int64_t M, const F& fn) {
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) fn(m);
  });
}

// y[m] = weight * (x[m] / sqrt(mean(x[m]^2) + eps)) for the M rows of K floats.
void rms_norm(const float* x, const float* weight, float eps, float* y, int64_t M, int64_t K) {
  for_rows(M, [&](int64_t m) {
    const float* xm = x + m * K;
    f16v acc = {};
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) {
      const f16v v = load(xm + k);
      acc += v * v;
    }
    if (k < K) {
      const f16v v = load(xm + k, static_cast<int>(K - k));
      acc += v * v;
    }
    const float inv = 1.0f / std::sqrt(hsum(acc) / static_cast<float>(K) + eps);
    for (k = 0; k < K; ++k) y[m * K + k] = weight[k] * (xm[k] * inv);
  });
}

void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), name,
              ": contiguous [rows, features] float32");
}

}  // namespace

// x [M, K] (M = B * T rows, row m is token m % T of sequence m / T); cos, sin [C, T, D] with C = 1 (shared) or B.
// Returns [M, (heads + 2 * kv_heads) * D]: q, k, v per row, q and k rotated (rotate-half, as HF Llama/Qwen2).
torch::Tensor layer_pre(torch::Tensor x, torch::Tensor norm, double eps, torch::Tensor w, torch::Tensor s,
                        torch::Tensor o, torch::Tensor bias, torch::Tensor cos, torch::Tensor sin, int64_t heads,
                        int64_t kv_heads, int64_t T) {
  check_rows(x, "x");
  const int64_t M = x.size(0), K = x.size(1), D = cos.size(-1), half = D / 2;
  TORCH_CHECK(norm.numel() == K && norm.scalar_type() == torch::kFloat32 && norm.is_contiguous(), "norm: [K] float32");
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && cos.size(1) == T && cos.is_contiguous() &&
              sin.is_contiguous() && cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32 &&
              M % T == 0 && (cos.size(0) == 1 || cos.size(0) == M / T) && D % 2 == 0, "cos, sin: [1 or B, T, D] float32");
  auto h = torch::empty({M, K}, torch::kFloat32);
  rms_norm(x.data_ptr<float>(), norm.data_ptr<float>(), static_cast<float>(eps), h.data_ptr<float>(), M, K);
  auto y = w4a8_mm(h, w, s, o, bias);
  const int64_t N = y.size(1);
  TORCH_CHECK(N >= (heads + 2 * kv_heads) * D, "the q/k/v projection is narrower than its heads");
  float* yp = y.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const bool shared = cos.size(0) == 1;
  for_rows(M, [&](int64_t m) {
    const int64_t b = shared ? 0 : m / T, t = m % T;
    const float* c = cp + (b * T + t) * D;
    const float* sn = sp + (b * T + t) * D;
    for (int64_t hd = 0; hd < heads + kv_heads; ++hd) {  // q's heads, then k's
      float* v = yp + m * N + hd * D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] + (-x2) * sn[i];
        v[i + half] = x2 * c[i + half] + x1 * sn[i + half];
      }
    }
  });
  return y;
}

// x [M, K] the layer's input, attn [M, heads * D] attention's output per row. Returns the layer's output [M, K].
torch::Tensor layer_post(torch::Tensor x, torch::Tensor attn, torch::Tensor wo, torch::Tensor so, torch::Tensor oo,
                         torch::Tensor norm, double eps, torch::Tensor w13, torch::Tensor s13, torch::Tensor o13,
                         torch::Tensor w2, torch::Tensor s2, torch::Tensor o2) {
  check_rows(x, "x");
  check_rows(attn, "attn");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(norm.numel() == K && norm.scalar_type() == torch::kFloat32 && norm.is_contiguous(), "norm: [K] float32");
  const auto none = torch::empty({0}, torch::kFloat32);
  auto x1 = w4a8_mm(attn, wo, so, oo, none);
  TORCH_CHECK(x1.size(0) == M && x1.size(1) == K, "the output projection must map attention back to [M, K]");
  float* x1p = x1.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  for_rows(M, [&](int64_t m) {  // the residual, in torch's order
    for (int64_t i = m * K; i < (m + 1) * K; ++i) x1p[i] = xp[i] + x1p[i];
  });
  auto h = torch::empty({M, K}, torch::kFloat32);
  rms_norm(x1p, norm.data_ptr<float>(), static_cast<float>(eps), h.data_ptr<float>(), M, K);
  auto gu = w4a8_mm(h, w13, s13, o13, none);  // [M, 2 I]: gate, then up
  const int64_t I = gu.size(1) / 2;
  auto act = torch::empty({M, I}, torch::kFloat32);
  float* ap = act.data_ptr<float>();
  const float* gp = gu.data_ptr<float>();
  for_rows(M, [&](int64_t m) {
    const float* g = gp + m * 2 * I;
    float* a = ap + m * I;
    for (int64_t i = 0; i < I; i += kLanes) {  // SiLU(g) * u = g / (1 + e^-g) * u
      const int n = static_cast<int>(std::min<int64_t>(kLanes, I - i));
      const f16v gv = load(g + i, n);
      store(a + i, gv / (exp16(-gv) + 1.0f) * load(g + I + i, n), n);
    }
  });
  auto y = w4a8_mm(act, w2, s2, o2, none);
  TORCH_CHECK(y.size(0) == M && y.size(1) == K, "the down projection must map back to [M, K]");
  float* yp = y.data_ptr<float>();
  for_rows(M, [&](int64_t m) {
    for (int64_t i = m * K; i < (m + 1) * K; ++i) yp[i] = x1p[i] + yp[i];
  });
  return y;
}

torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor mask, double scale);

// A whole decoder layer in one call: layer_pre, the new keys and values written into the layer's cache, attention()
// over it, layer_post. Saves the ~20 Python and torch calls a layer otherwise makes between the compiled parts
// (about 2 ms of a 1.5B target's step). x [B * T, K]; kc, vc [rows, KV, capacity, D] the layer's cache; row b of
// the forward is cache row rows[b] and writes its token t at slot slots[b, t], then reads slots 0 .. read - 1;
// mask as attention()'s ([B, T, read] bool, or empty: query t sees keys 0 .. read - T + t).
torch::Tensor layer(torch::Tensor x, torch::Tensor norm1, double eps1, torch::Tensor wqkv, torch::Tensor sqkv,
                    torch::Tensor oqkv, torch::Tensor bqkv, torch::Tensor cos, torch::Tensor sin, int64_t heads,
                    int64_t kv_heads, torch::Tensor kc, torch::Tensor vc, torch::Tensor rows, torch::Tensor slots,
                    int64_t read, torch::Tensor mask, torch::Tensor wo, torch::Tensor so, torch::Tensor oo,
                    torch::Tensor norm2, double eps2, torch::Tensor w13, torch::Tensor s13, torch::Tensor o13,
                    torch::Tensor w2, torch::Tensor s2, torch::Tensor o2) {
  TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == torch::kLong && slots.is_contiguous() &&
              rows.dim() == 1 && rows.scalar_type() == torch::kLong && rows.size(0) == slots.size(0),
              "rows [B] and slots [B, T]: int64");
  const int64_t B = slots.size(0), T = slots.size(1), D = cos.size(-1);
  TORCH_CHECK(kc.dim() == 4 && kc.sizes() == vc.sizes() && kc.scalar_type() == torch::kFloat32 &&
              vc.scalar_type() == torch::kFloat32 && kc.stride(3) == 1 && vc.stride(3) == 1 &&
              kc.size(1) == kv_heads && kc.size(3) == D && read <= kc.size(2), "kc, vc: the layer's [rows, KV, capacity, D] float32 cache");
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rp[b] >= 0 && rp[b] < kc.size(0), "cache row out of range");
    for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sp[b * T + t] >= 0 && sp[b * T + t] < kc.size(2), "cache slot out of range");
  }
  auto qkv = layer_pre(x, norm1, eps1, wqkv, sqkv, oqkv, bqkv, cos, sin, heads, kv_heads, T);
  const int64_t N = qkv.size(1);
  const float* qp = qkv.data_ptr<float>();
  float* kp = kc.data_ptr<float>();
  float* vp = vc.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t at = rp[b] * kc.stride(0) + g * kc.stride(1) + sp[b * T + t] * kc.stride(2);
        const int64_t av = rp[b] * vc.stride(0) + g * vc.stride(1) + sp[b * T + t] * vc.stride(2);
        std::memcpy(kp + at, qp + (b * T + t) * N + (heads + g) * D, sizeof(float) * D);
        std::memcpy(vp + av, qp + (b * T + t) * N + (heads + kv_heads + g) * D, sizeof(float) * D);
      }
  bool consecutive = true;  // rows r0 .. r0 + B - 1 are read in place; other sets are gathered (a copy)
  for (int64_t b = 1; b < B; ++b) consecutive = consecutive && rp[b] == rp[0] + b;
  auto k = consecutive ? kc.narrow(0, rp[0], B) : kc.index_select(0, rows);
  auto v = consecutive ? vc.narrow(0, rp[0], B) : vc.index_select(0, rows);
  auto q = qkv.view({B, T, N / D, D}).narrow(2, 0, heads).permute({0, 2, 1, 3});
  auto attn = attention(q, k.narrow(2, 0, read), v.narrow(2, 0, read), mask, std::pow(static_cast<double>(D), -0.5));
  attn = attn.permute({0, 2, 1, 3}).reshape({B * T, heads * D});
  return layer_post(x, attn, wo, so, oo, norm2, eps2, w13, s13, o13, w2, s2, o2);
}

// Layers start .. n-1 of a model whose layers all run whole in `layer`, in one call: the ~100 us of Python and
// argument passing each layer's call costs (~2.4 ms of the 0.5B draft's 16 ms token) paid once (a start above 0
// lets a caller read the output of the first layers, as EAGLE-3's drafter does). ops holds 15 operands a layer and
// eps two, in `layer`'s order; k, v are the whole cache [layers, rows, KV, capacity, D]. Each layer computes exactly
// what its own `layer` call computes.
torch::Tensor layers(const std::vector<torch::Tensor>& ops, const std::vector<double>& eps, int64_t heads,
                     int64_t kv_heads, int64_t n, torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                     torch::Tensor k, torch::Tensor v, torch::Tensor rows, torch::Tensor slots, int64_t read,
                     torch::Tensor mask, int64_t start) {
  constexpr int64_t kOps = 15;
  TORCH_CHECK(static_cast<int64_t>(ops.size()) >= n * kOps && static_cast<int64_t>(eps.size()) >= 2 * n && n >= 0,
              "layers: 15 operands and 2 epsilons for each of the n layers");
  TORCH_CHECK(start >= 0 && start <= n, "layers: 0 <= start <= n");
  TORCH_CHECK(k.dim() == 5 && k.sizes() == v.sizes() && k.size(0) >= n, "k, v: the cache's [layers, rows, KV, capacity, D]");
  for (int64_t i = start; i < n; ++i) {
    const torch::Tensor* o = ops.data() + i * kOps;
    x = layer(x, o[0], eps[2 * i], o[1], o[2], o[3], o[4], cos, sin, heads, kv_heads, k.select(0, i), v.select(0, i),
              rows, slots, read, mask, o[5], o[6], o[7], o[8], eps[2 * i + 1], o[9], o[10], o[11], o[12], o[13], o[14]);
  }
  return x;
}
