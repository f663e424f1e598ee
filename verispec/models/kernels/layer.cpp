// A decoder layer's work around attention, in two calls, for a model whose linears all run on the w4a8 kernel:
//   layer_pre:  RMSNorm -> q/k/v projection (+ bias) -> rope on q and k
//   layer_post: output projection + residual -> RMSNorm -> gate/up projection -> SiLU(gate) * up -> down
//               projection + residual
// In Python these are ~40 small torch calls a layer, each costing more dispatch than arithmetic at one token
// (about 0.25 ms a layer of the 0.5B draft: a third of its step). Here they are loops over rows, so every row's
// result depends on that row alone (exact greedy speculation needs that), in the same fixed order in both builds
// (vec.h; -ffp-contract=off).
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec.h"

torch::Tensor w4a8_mm(torch::Tensor x, torch::Tensor w, torch::Tensor s, torch::Tensor o, torch::Tensor bias);

namespace {

// y[m] = weight * (x[m] / sqrt(mean(x[m]^2) + eps)) for the M rows of K floats.
void rms_norm(const float* x, const float* weight, float eps, float* y, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
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
  }
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
  for (int64_t m = 0; m < M; ++m) {
    const int64_t b = cos.size(0) == 1 ? 0 : m / T, t = m % T;
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
  }
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
  for (int64_t i = 0; i < M * K; ++i) x1p[i] = xp[i] + x1p[i];  // the residual, in torch's order
  auto h = torch::empty({M, K}, torch::kFloat32);
  rms_norm(x1p, norm.data_ptr<float>(), static_cast<float>(eps), h.data_ptr<float>(), M, K);
  auto gu = w4a8_mm(h, w13, s13, o13, none);  // [M, 2 I]: gate, then up
  const int64_t I = gu.size(1) / 2;
  auto act = torch::empty({M, I}, torch::kFloat32);
  float* ap = act.data_ptr<float>();
  const float* gp = gu.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* g = gp + m * 2 * I;
    float* a = ap + m * I;
    for (int64_t i = 0; i < I; i += kLanes) {  // SiLU(g) * u = g / (1 + e^-g) * u
      const int n = static_cast<int>(std::min<int64_t>(kLanes, I - i));
      const f16v gv = load(g + i, n);
      store(a + i, gv / (exp16(-gv) + 1.0f) * load(g + I + i, n), n);
    }
  }
  auto y = w4a8_mm(act, w2, s2, o2, none);
  TORCH_CHECK(y.size(0) == M && y.size(1) == K, "the down projection must map back to [M, K]");
  float* yp = y.data_ptr<float>();
  for (int64_t i = 0; i < M * K; ++i) yp[i] = x1p[i] + yp[i];
  return y;
}
