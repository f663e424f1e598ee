// A decoder layer's work around attention, in two calls, for a model whose linears all run on the w4a8 kernel:
//   layer_pre:  RMSNorm -> q/k/v projection (+ bias) -> rope on q and k
//   layer_post: output projection + residual -> RMSNorm -> gate/up projection -> SiLU(gate) * up -> down
//               projection + residual
// In Python these are ~40 small torch calls a layer, each costing more dispatch than arithmetic at one token
// (about 0.25 ms a layer of the 0.5B draft: a third of its step). Here they are loops over rows, so every row's
// result depends on that row alone (exact greedy speculation needs that), in the same fixed order in both builds
// (vec.h; -ffp-contract=off).
#include "ops.h"
#include "tensor.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "vec.h"

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

const float* norm_of(const torch::Tensor& norm, int64_t K) {
  TORCH_CHECK(norm.numel() == K && norm.scalar_type() == torch::kFloat32 && norm.is_contiguous(), "norm: [K] float32");
  return norm.data_ptr<float>();
}

// A linear layer's operands with its input width read from its codes ([N / 16, K / 32, 32]: K per column block).
Linear linear_from(const torch::Tensor& w, const torch::Tensor& codes, const torch::Tensor& units,
                   const torch::Tensor& bias) {
  TORCH_CHECK(w.dim() == 3 && w.size(0) > 0, "w: packed uint8");
  return linear_of(w, codes, units, bias, codes.numel() / w.size(0));
}

// A buffer of at least n floats, grown (never shrunk) as forwards get wider.
float* grow(std::vector<float>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// One decoder layer's operands, in layer()'s order, as pointers read from its tensors once.
struct LayerOps {
  const float* norm1;
  float eps1;
  Linear qkv, o;
  const float* norm2;
  float eps2;
  Linear w13, w2;
};

// The operands of the work after attention (t: wo, so, oo, norm2, w13, s13, o13, w2, s2, o2), checked against the
// layer's width K; the q/k/v half of the result is left empty.
LayerOps post_ops(const torch::Tensor* t, double eps2, int64_t K) {
  const auto none = torch::empty({0}, torch::kFloat32);
  LayerOps L{nullptr, 0.f, Linear{}, linear_from(t[0], t[1], t[2], none), norm_of(t[3], K), static_cast<float>(eps2),
             linear_from(t[4], t[5], t[6], none), linear_from(t[7], t[8], t[9], none)};
  TORCH_CHECK(L.w13.K == K, "the gate/up projection must read the layer's [M, K] input");
  TORCH_CHECK(L.o.N == K, "the output projection must map attention back to [M, K]");
  TORCH_CHECK(L.w2.N == K && L.w2.K * 2 == L.w13.N, "the down projection must map SiLU(gate) * up back to [M, K]");
  return L;
}

// All of a layer's operands, in layer()'s order (t: norm1, wqkv, sqkv, oqkv, bqkv, then post_ops's).
LayerOps layer_ops(const torch::Tensor* t, double eps1, double eps2, int64_t K) {
  LayerOps L = post_ops(t + 5, eps2, K);
  L.norm1 = norm_of(t[0], K);
  L.eps1 = static_cast<float>(eps1);
  L.qkv = linear_from(t[1], t[2], t[3], t[4]);
  TORCH_CHECK(L.qkv.K == K, "the q/k/v projection must read the layer's [M, K] input");
  return L;
}

// The buffers a layer's work writes, grown to the widest forward and reused (a LayerStack keeps one).
struct Workspace {
  std::vector<float> h, qkv, attn, x1, gu, act;
  MmScratch mm;
};

// RMSNorm -> q/k/v projection (+ bias) -> rope on q and k, into y [M, L.N]. cos, sin [C, T, D], C = 1 (shared) or B.
void pre_into(const float* x, int64_t M, int64_t K, const float* norm, float eps, const Linear& L, const float* cp,
              const float* sp, bool shared, int64_t T, int64_t heads, int64_t kv_heads, int64_t D, float* yp,
              Workspace& ws) {
  float* h = grow(ws.h, M * K);
  rms_norm(x, norm, eps, h, M, K);
  mm_into(h, M, L, yp, ws.mm);
  const int64_t N = L.N, half = D / 2;
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
}

// Output projection + residual -> RMSNorm -> gate/up projection -> SiLU(gate) * up -> down projection + residual,
// into y [M, K] (y must not be x).
void post_into(const float* xp, const float* attn, int64_t M, int64_t K, const LayerOps& L, float* yp, Workspace& ws) {
  float* x1p = grow(ws.x1, M * K);
  mm_into(attn, M, L.o, x1p, ws.mm);
  for_rows(M, [&](int64_t m) {  // the residual, in torch's order
    for (int64_t i = m * K; i < (m + 1) * K; ++i) x1p[i] = xp[i] + x1p[i];
  });
  float* h = grow(ws.h, M * K);
  rms_norm(x1p, L.norm2, L.eps2, h, M, K);
  const int64_t I = L.w13.N / 2;
  float* gp = grow(ws.gu, M * 2 * I);
  mm_into(h, M, L.w13, gp, ws.mm);  // [M, 2 I]: gate, then up
  float* ap = grow(ws.act, M * I);
  for_rows(M, [&](int64_t m) {
    const float* g = gp + m * 2 * I;
    float* a = ap + m * I;
    for (int64_t i = 0; i < I; i += kLanes) {  // SiLU(g) * u = g / (1 + e^-g) * u
      const int n = static_cast<int>(std::min<int64_t>(kLanes, I - i));
      const f16v gv = load(g + i, n);
      store(a + i, gv / (exp16(-gv) + 1.0f) * load(g + I + i, n), n);
    }
  });
  mm_into(ap, M, L.w2, yp, ws.mm);
  for_rows(M, [&](int64_t m) {
    for (int64_t i = m * K; i < (m + 1) * K; ++i) yp[i] = x1p[i] + yp[i];
  });
}

// Where a forward's new keys and values go and which cached ones it reads: batch row b is cache row rows[b], writes
// its token t at slot slots[b, t], then reads slots 0 .. read - 1; mask [B, T, read] bool or null (causal).
struct CachePlan {
  float* k;  // the layer's [rows, KV, capacity, D] keys (D contiguous) and their strides
  Strides ks;
  float* v;
  Strides vs;
  const int64_t* rows;
  const int64_t* slots;
  int64_t B, T, read;
  const bool* mask;
};

// A whole decoder layer: pre_into, the new keys and values written into the cache, attention over it, post_into.
void layer_into(const float* x, int64_t K, const LayerOps& L, const float* cos, const float* sin, bool shared,
                int64_t heads, int64_t kv_heads, int64_t D, const CachePlan& c, float* y, Workspace& ws) {
  const int64_t B = c.B, T = c.T, M = B * T, N = L.qkv.N;
  TORCH_CHECK(N >= (heads + 2 * kv_heads) * D, "the q/k/v projection is narrower than its heads");
  TORCH_CHECK(L.o.K == heads * D, "the output projection must read the heads' [M, heads * D]");
  float* qkv = grow(ws.qkv, M * N);
  pre_into(x, M, K, L.norm1, L.eps1, L.qkv, cos, sin, shared, T, heads, kv_heads, D, qkv, ws);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < kv_heads; ++g) {
        const int64_t slot = c.slots[b * T + t];
        std::memcpy(c.k + c.rows[b] * c.ks.b + g * c.ks.h + slot * c.ks.t, qkv + (b * T + t) * N + (heads + g) * D,
                    sizeof(float) * D);
        std::memcpy(c.v + c.rows[b] * c.vs.b + g * c.vs.h + slot * c.vs.t,
                    qkv + (b * T + t) * N + (heads + kv_heads + g) * D, sizeof(float) * D);
      }
  float* attn = grow(ws.attn, M * heads * D);  // [B * T, heads * D]: row b * T + t, head h at h * D
  attention_into(qkv, Strides{T * N, D, N}, c.k, c.ks, c.v, c.vs, c.rows, c.mask, B, heads, kv_heads, T, c.read, D,
                 static_cast<float>(std::pow(static_cast<double>(D), -0.5)), attn, Strides{T * heads * D, D, heads * D});
  post_into(x, attn, M, K, L, y, ws);
}

// The cache plan of layer()'s and the stack's tensors, checked: kc, vc [rows, KV, capacity, D] (one layer's), rows
// [B] and slots [B, T] int64, mask [B, T, read] bool or empty.
CachePlan cache_plan(const torch::Tensor& kc, const torch::Tensor& vc, const torch::Tensor& rows,
                     const torch::Tensor& slots, int64_t read, const torch::Tensor& mask, int64_t kv_heads, int64_t D) {
  TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == torch::kLong && slots.is_contiguous() &&
              rows.dim() == 1 && rows.scalar_type() == torch::kLong && rows.is_contiguous() &&
              rows.size(0) == slots.size(0), "rows [B] and slots [B, T]: int64");
  TORCH_CHECK(kc.dim() == 4 && kc.sizes() == vc.sizes() && kc.scalar_type() == torch::kFloat32 &&
              vc.scalar_type() == torch::kFloat32 && kc.stride(3) == 1 && vc.stride(3) == 1 &&
              kc.size(1) == kv_heads && kc.size(3) == D && read <= kc.size(2),
              "kc, vc: the layer's [rows, KV, capacity, D] float32 cache");
  const int64_t B = slots.size(0), T = slots.size(1);
  TORCH_CHECK(T <= read, "more queries than keys");
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rp[b] >= 0 && rp[b] < kc.size(0), "cache row out of range");
    for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sp[b * T + t] >= 0 && sp[b * T + t] < kc.size(2), "cache slot out of range");
  }
  if (mask.numel() > 0)
    TORCH_CHECK(mask.scalar_type() == torch::kBool && mask.is_contiguous() && mask.dim() == 3 && mask.size(0) == B &&
                mask.size(1) == T && mask.size(2) == read, "mask: contiguous [B, T, S] bool");
  return CachePlan{kc.data_ptr<float>(), Strides{kc.stride(0), kc.stride(1), kc.stride(2)}, vc.data_ptr<float>(),
                   Strides{vc.stride(0), vc.stride(1), vc.stride(2)}, rp, sp, B, T, read,
                   mask.numel() > 0 ? mask.data_ptr<bool>() : nullptr};
}

// cos, sin [C, T, D] float32, C = 1 (shared by every row) or B; returns whether shared.
bool check_rope(const torch::Tensor& cos, const torch::Tensor& sin, int64_t M, int64_t T) {
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() && cos.size(1) == T && cos.is_contiguous() &&
              sin.is_contiguous() && cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32 &&
              T > 0 && M % T == 0 && (cos.size(0) == 1 || cos.size(0) == M / T) && cos.size(-1) % 2 == 0,
              "cos, sin: [1 or B, T, D] float32");
  return cos.size(0) == 1;
}

}  // namespace

// x [M, K] (M = B * T rows, row m is token m % T of sequence m / T); cos, sin [C, T, D] with C = 1 (shared) or B.
// Returns [M, (heads + 2 * kv_heads) * D]: q, k, v per row, q and k rotated (rotate-half, as HF Llama/Qwen2).
torch::Tensor layer_pre(torch::Tensor x, torch::Tensor norm, double eps, torch::Tensor w, torch::Tensor s,
                        torch::Tensor o, torch::Tensor bias, torch::Tensor cos, torch::Tensor sin, int64_t heads,
                        int64_t kv_heads, int64_t T) {
  check_rows(x, "x");
  const int64_t M = x.size(0), K = x.size(1), D = cos.size(-1);
  const bool shared = check_rope(cos, sin, M, T);
  const Linear L = linear_of(w, s, o, bias, K);
  TORCH_CHECK(L.N >= (heads + 2 * kv_heads) * D, "the q/k/v projection is narrower than its heads");
  auto y = torch::empty({M, L.N}, torch::kFloat32);
  Workspace ws;
  pre_into(x.data_ptr<float>(), M, K, norm_of(norm, K), static_cast<float>(eps), L, cos.data_ptr<float>(),
           sin.data_ptr<float>(), shared, T, heads, kv_heads, D, y.data_ptr<float>(), ws);
  return y;
}

// x [M, K] the layer's input, attn [M, heads * D] attention's output per row. Returns the layer's output [M, K].
torch::Tensor layer_post(torch::Tensor x, torch::Tensor attn, torch::Tensor wo, torch::Tensor so, torch::Tensor oo,
                         torch::Tensor norm, double eps, torch::Tensor w13, torch::Tensor s13, torch::Tensor o13,
                         torch::Tensor w2, torch::Tensor s2, torch::Tensor o2) {
  check_rows(x, "x");
  check_rows(attn, "attn");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(attn.size(0) == M, "attn: a row per row of x");
  const torch::Tensor t[10] = {wo, so, oo, norm, w13, s13, o13, w2, s2, o2};
  const LayerOps L = post_ops(t, eps, K);
  TORCH_CHECK(L.o.K == attn.size(1), "attn: the output projection's [M, heads * D] input");
  auto y = torch::empty({M, K}, torch::kFloat32);
  Workspace ws;
  post_into(x.data_ptr<float>(), attn.data_ptr<float>(), M, K, L, y.data_ptr<float>(), ws);
  return y;
}

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
  check_rows(x, "x");
  const int64_t M = x.size(0), K = x.size(1), D = cos.size(-1);
  const CachePlan c = cache_plan(kc, vc, rows, slots, read, mask, kv_heads, D);
  TORCH_CHECK(c.B * c.T == M, "x: a row per (sequence, token) of slots");
  const bool shared = check_rope(cos, sin, M, c.T);
  const torch::Tensor t[15] = {norm1, wqkv, sqkv, oqkv, bqkv, wo, so, oo, norm2, w13, s13, o13, w2, s2, o2};
  const LayerOps L = layer_ops(t, eps1, eps2, K);
  auto y = torch::empty({M, K}, torch::kFloat32);
  Workspace ws;
  layer_into(x.data_ptr<float>(), K, L, cos.data_ptr<float>(), sin.data_ptr<float>(), shared, heads, kv_heads, D, c,
             y.data_ptr<float>(), ws);
  return y;
}

// A model's decoder layers, their operands read from the tensors once (360 of them for the 0.5B draft), with the
// buffers their work writes kept from forward to forward. The ~100 us of Python and argument passing each layer's
// own call costs (~2.4 ms of the 0.5B draft's 16 ms token) is paid once a forward, and no layer allocates a tensor.
// Each layer computes exactly what its own `layer` call computes. Calls hold the GIL (pybind's default), so one
// forward runs at a time.
struct StackState {
  std::vector<torch::Tensor> tensors;  // kept alive: LayerOps point into them
  std::vector<LayerOps> ops;
  int64_t heads, kv_heads, K;
  Workspace ws;
  std::vector<float> a, b;  // the layers' inputs and outputs, in turn
};

std::shared_ptr<StackState> stack_state(std::vector<torch::Tensor> tensors, const std::vector<double>& eps,
                                        int64_t heads, int64_t kv_heads) {
  constexpr int64_t kOps = 15;
  const int64_t n = static_cast<int64_t>(tensors.size()) / kOps;
  TORCH_CHECK(static_cast<int64_t>(tensors.size()) == n * kOps && static_cast<int64_t>(eps.size()) == 2 * n && n > 0,
              "a layer stack: 15 operands and 2 epsilons for each layer");
  auto s = std::make_shared<StackState>();
  s->heads = heads;
  s->kv_heads = kv_heads;
  s->K = tensors[0].numel();
  for (int64_t i = 0; i < n; ++i) s->ops.push_back(layer_ops(tensors.data() + i * kOps, eps[2 * i], eps[2 * i + 1], s->K));
  s->tensors = std::move(tensors);
  return s;
}

// Layers start .. n-1 over x [B * T, K] (a start above 0 lets a caller read the output of the first layers, as
// EAGLE-3's drafter does); k, v the whole cache [layers, rows, KV, capacity, D]; the rest as layer()'s.
torch::Tensor stack_run(StackState& s, int64_t n, torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                        torch::Tensor k, torch::Tensor v, torch::Tensor rows, torch::Tensor slots, int64_t read,
                        torch::Tensor mask, int64_t start) {
  check_rows(x, "x");
  TORCH_CHECK(start >= 0 && start <= n && n <= static_cast<int64_t>(s.ops.size()), "layers: 0 <= start <= n <= layers");
  TORCH_CHECK(x.size(1) == s.K, "x: [M, hidden size]");
  TORCH_CHECK(k.dim() == 5 && k.sizes() == v.sizes() && k.size(0) >= n, "k, v: the cache's [layers, rows, KV, capacity, D]");
  const int64_t M = x.size(0), K = s.K, D = cos.size(-1);
  CachePlan c = cache_plan(k.select(0, 0), v.select(0, 0), rows, slots, read, mask, s.kv_heads, D);
  TORCH_CHECK(c.B * c.T == M, "x: a row per (sequence, token) of slots");
  const bool shared = check_rope(cos, sin, M, c.T);
  float* k0 = c.k;
  float* v0 = c.v;
  const float* in = x.data_ptr<float>();
  float* bufs[2] = {grow(s.a, M * K), grow(s.b, M * K)};
  for (int64_t i = start; i < n; ++i) {
    c.k = k0 + i * k.stride(0);
    c.v = v0 + i * v.stride(0);
    float* out = bufs[(i - start) % 2];
    layer_into(in, K, s.ops[i], cos.data_ptr<float>(), sin.data_ptr<float>(), shared, s.heads, s.kv_heads, D, c, out,
               s.ws);
    in = out;
  }
  auto y = torch::empty({M, K}, torch::kFloat32);
  std::memcpy(y.data_ptr<float>(), in, sizeof(float) * M * K);
  return y;
}
