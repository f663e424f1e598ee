// A sampled round's passes over the vocabulary on a CPU: the temperature softmax of a row of logits, an inverse-CDF
// draw from a row of weights (verispec/sampling.py's logits_to_probs and sample, whose torch versions define them;
// these compute the same up to float rounding), and a chain's whole verification from the target's logits
// (verify.verify_chain over those two, the same bits). A T = 0.7 round draws once per draft token and once in its
// verification, and softmaxes each verified position: in torch that is ~25 small calls a draft token, and after a
// forward has evicted the caches each of them cost more than its arithmetic (0.6-0.9 ms a draft token and ~1.3 ms a
// verification on a 2-core AMD EPYC: ~5% of a round). Here one call each (the first two a row per task), on vec.h's
// vectors, so every build gives the same bits.
#include "tensor.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "vec.h"

namespace {

typedef double d4 __attribute__((vector_size(32)));
typedef float f4u __attribute__((vector_size(16), aligned(4), may_alias));  // an unaligned 4-float access

// The largest (smallest) of a vector's lanes, in lane order.
float lanes_max(f16v v) {
  float x[kLanes];
  store(x, v);
  float m = x[0];
  for (int i = 1; i < kLanes; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
float lanes_min(f16v v) { return -lanes_max(-v); }

// The sum of n floats in float64 (four lanes a step, four accumulators, then in a fixed order), and the least of
// them and *low in *low (a NaN leaves the sum NaN).
double sum64(const float* w, int64_t n, float* low) {
  d4 a[4] = {};
  f16v m = splat(*low);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    m = vmin(load(w + i), m);
    for (int j = 0; j < 4; ++j) a[j] += __builtin_convertvector(*reinterpret_cast<const f4u*>(w + i + 4 * j), d4);
  }
  const d4 t = (a[0] + a[1]) + (a[2] + a[3]);
  double s = (t[0] + t[1]) + (t[2] + t[3]);
  float lo = lanes_min(m);
  for (; i < n; ++i) {
    s += w[i];
    lo = w[i] < lo ? w[i] : lo;
  }
  *low = lo;
  return s;
}

// A row's maximum, as softmax_t takes it (a NaN is skipped: it turns the sum NaN).
float row_max(const float* xr, int64_t V) {
  const int64_t body = V / kLanes * kLanes;
  f16v mv = splat(kNegInf);
  for (int64_t i = 0; i < body; i += kLanes) mv = vmax(load(xr + i), mv);
  float m = lanes_max(mv);
  for (int64_t i = body; i < V; ++i) m = xr[i] > m ? xr[i] : m;
  return m;
}

// e^((x - m) / T) of one id, the very value the vector loops below give it (every lane is computed alike).
float exp_at(float x, float m, float inv_t) {
  float e[kLanes];
  store(e, exp16(splat((x - m) * inv_t)));
  return e[0];
}

// The sum of a row's e^((x - m) / T), stored into yr where it is given: 1 / it normalizes the row, or 0 where the
// row has no softmax (m +-inf, or a NaN or an overflow in the sum), where softmax_t gives NaN.
float exp_sum_inverse(const float* xr, float* yr, int64_t V, float m, float inv_t) {
  const int64_t body = V / kLanes * kLanes;
  f16v acc = {};
  for (int64_t i = 0; i < body; i += kLanes) {
    const f16v e = exp16((load(xr + i) - m) * inv_t);
    if (yr) store(yr + i, e);
    acc += e;
  }
  float total = hsum(acc);
  for (int64_t i = body; i < V; ++i) {
    const float e = exp_at(xr[i], m, inv_t);
    if (yr) yr[i] = e;
    total += e;
  }
  if (std::isinf(m) || !std::isfinite(total)) return 0.f;  // >= 1 otherwise: the maximum's own term is e^0
  return 1.0f / total;
}

// The softmax of a row into yr (inv from exp_sum_inverse, which stored the exponentials there).
void normalize(float* yr, int64_t V, float inv) {
  const int64_t body = V / kLanes * kLanes;
  if (inv == 0.f) {
    for (int64_t i = 0; i < V; ++i) yr[i] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  for (int64_t i = 0; i < body; i += kLanes) store(yr + i, load(yr + i) * inv);
  for (int64_t i = body; i < V; ++i) yr[i] = yr[i] * inv;
}

// One draw from a row of weights (sample_rows' rule; ends: scratch for the V / block block sums).
int64_t draw(const float* wr, int64_t V, double u, int64_t block, std::vector<double>& ends) {
  const int64_t nb = V / block;
  float low = 0.f;  // the least weight (a NaN: caught by the total)
  double total = 0;
  for (int64_t b = 0; b < nb; ++b) ends[b] = total += sum64(wr + b * block, block, &low);
  if (!(low >= 0.f) || !std::isfinite(total) || !(total > 0)) return -1;
  const double target = u * total;
  int64_t b = 0;
  while (b < nb && !(ends[b] > target)) ++b;  // the first block whose end passes the target
  if (b == nb)  // the product rounded up to the total: the last block with weight
    for (b = nb - 1; b > 0 && !(ends[b] > ends[b - 1]); --b) {}
  double sum = b ? ends[b - 1] : 0.0;
  int64_t last = -1;
  for (int64_t i = b * block; i < (b + 1) * block; ++i) {
    if (wr[i] > 0.f) last = i;
    sum += wr[i];
    if (sum > target && wr[i] > 0.f) return i;
  }
  return last;  // past the block's sum only by rounding: its last id with weight
}

}  // namespace

// x [R, V] float32 -> softmax((x - max) / temperature) per row, float32 (torch's steps: shift by the maximum, divide,
// exponentiate, normalize; the divisions as multiplies by the inverse). A row with a NaN, or whose maximum is -inf or
// +inf, gives NaN (as torch's does).
torch::Tensor softmax_t(torch::Tensor x, double temperature) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [R, V] float32");
  TORCH_CHECK(temperature > 0, "temperature > 0");
  const int64_t R = x.size(0), V = x.size(1);
  auto y = torch::empty({R, V}, torch::kFloat32);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float inv_t = static_cast<float>(1.0 / temperature);
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * V;
      float* yr = yp + r * V;
      normalize(yr, V, exp_sum_inverse(xr, yr, V, row_max(xr, V), inv_t));
    }
  });
  return y;
}

// w [R, V] float32 weights, u [R] float64 uniforms in [0, 1): ids [R] int64, row r's the first id whose cumulative
// sum passes u[r] * (the row's total): its weight is > 0. The sums are float64, taken in blocks of `block` ids (V a
// multiple of it): the block the draw falls in first, then within it. -1 for a row with a negative or non-finite
// weight or no weight at all (the caller raises).
torch::Tensor sample_rows(torch::Tensor w, torch::Tensor u, int64_t block) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous(), "w: contiguous [R, V] float32");
  const int64_t R = w.size(0), V = w.size(1);
  TORCH_CHECK(u.dim() == 1 && u.size(0) == R && u.scalar_type() == at::kDouble && u.is_contiguous(), "u: [R] float64");
  TORCH_CHECK(block > 0 && V % block == 0, "V must be a multiple of block");
  auto ids = torch::empty({R}, torch::kLong);
  const float* wp = w.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  int64_t* ip = ids.data_ptr<int64_t>();
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> ends(V / block);
    for (int64_t r = r0; r < r1; ++r) ip[r] = draw(wp + r * V, V, up[r], block, ends);
  });
  return ids;
}

// One sampled chain's verification from the target's logits, in one call: verify.verify_chain(draft,
// logits_to_probs(logits), q) for temperature alone (no top-k, no top-p), with the same uniforms (u [G] float32, the
// acceptance tests; u_last [1] float64, the last draw), the same probabilities bit for bit, so the same outcome.
// logits [G + 1, V]; draft [G] int64; q [G, V] float32, or no rows for a deterministic proposal (one-hot q).
// Only the rows' normalizers are taken (no probabilities written), and only the drawn row's law is built.
// Returns [accepted, token]; token -1 where the drawn row has no law (the caller raises, as sample does).
torch::Tensor verify_row(torch::Tensor logits, double temperature, torch::Tensor draft, torch::Tensor q,
                         torch::Tensor u, torch::Tensor u_last, int64_t block) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat32 && logits.is_contiguous(),
              "logits: contiguous [G + 1, V] float32");
  TORCH_CHECK(temperature > 0, "temperature > 0");
  const int64_t G = logits.size(0) - 1, V = logits.size(1);
  TORCH_CHECK(G >= 0 && block > 0 && V % block == 0, "V must be a multiple of block");
  TORCH_CHECK(draft.dim() == 1 && draft.size(0) == G && draft.scalar_type() == torch::kLong && draft.is_contiguous(),
              "draft: [G] int64");
  const bool one_hot = q.numel() == 0;
  TORCH_CHECK(one_hot || (q.dim() == 2 && q.size(0) == G && q.size(1) == V && q.scalar_type() == torch::kFloat32 &&
                          q.is_contiguous()), "q: contiguous [G, V] float32, or empty");
  TORCH_CHECK(u.dim() == 1 && u.size(0) == G && u.scalar_type() == torch::kFloat32 && u.is_contiguous(),
              "u: [G] float32");
  TORCH_CHECK(u_last.numel() == 1 && u_last.scalar_type() == at::kDouble, "u_last: [1] float64");
  const float* xp = logits.data_ptr<float>();
  const int64_t* dp = draft.data_ptr<int64_t>();
  const float* qp = one_hot ? nullptr : q.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  for (int64_t i = 0; i < G; ++i) TORCH_CHECK(0 <= dp[i] && dp[i] < V, "a drafted id is outside the vocabulary");
  const float inv_t = static_cast<float>(1.0 / temperature);
  std::vector<float> m(G + 1), inv(G + 1);
  int64_t n = 0, ready = 0;  // n: the accepted prefix; rows < ready have their normalizers
  while (true) {
    if (n == ready) {  // the next two rows' normalizers at once, one a thread (a rejection usually ends it early)
      const int64_t stop = std::min(G + 1, ready + 2);
      at::parallel_for(ready, stop, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          m[r] = row_max(xp + r * V, V);
          inv[r] = exp_sum_inverse(xp + r * V, nullptr, V, m[r], inv_t);
        }
      });
      ready = stop;
    }
    if (n == G) break;
    const int64_t x = dp[n];  // accepted while u * q(x) < p(x); p(x) NaN (a row without a law) never is
    const float px =
        inv[n] == 0.f ? std::numeric_limits<float>::quiet_NaN() : exp_at(xp[n * V + x], m[n], inv_t) * inv[n];
    const float qx = one_hot ? 1.0f : qp[n * V + x];
    if (!(up[n] * qx < px)) break;
    ++n;
  }
  auto out = torch::empty({2}, torch::kLong);
  int64_t* op = out.data_ptr<int64_t>();
  op[0] = n;
  if (inv[n] == 0.f) {  // p_n is NaN: so is its residual, and sample refuses it
    op[1] = -1;
    return out;
  }
  thread_local std::vector<float> w;  // kept between calls: a fresh 600 KB buffer is fresh pages every round
  thread_local std::vector<double> ends;
  w.resize(V);
  ends.resize(V / block);
  const float* xr = xp + n * V;
  exp_sum_inverse(xr, w.data(), V, m[n], inv_t);
  normalize(w.data(), V, inv[n]);  // p_n, as softmax_t gives it
  if (n < G) {  // the residual max(0, p_n - q_n) in place, unless rounding leaves it no mass (then p_n itself)
    const int64_t x = dp[n];
    const float px = w[x];
    bool mass = false;
    if (one_hot) {  // p_n with x's weight removed (p(x) <= 1)
      w[x] = std::max(px - 1.0f, 0.0f);
      for (int64_t i = 0; i < V && !mass; ++i) mass = w[i] > 0.f;
    } else {
      const float* qr = qp + n * V;
      const int64_t body = V / kLanes * kLanes;
      f16v any = {};
      for (int64_t i = 0; i < body; i += kLanes) {
        const f16v r = vmax(load(w.data() + i) - load(qr + i), f16v{});  // p finite here: max(p - q, 0)
        store(w.data() + i, r);
        any = vmax(any, r);
      }
      mass = lanes_max(any) > 0.f;
      for (int64_t i = body; i < V; ++i) {
        w[i] = std::max(w[i] - qr[i], 0.0f);
        mass = mass || w[i] > 0.f;
      }
    }
    if (!mass) {  // all rounded away: p_n again
      exp_sum_inverse(xr, w.data(), V, m[n], inv_t);
      normalize(w.data(), V, inv[n]);
    }
  }
  op[1] = draw(w.data(), V, u_last.data_ptr<double>()[0], block, ends);
  return out;
}
