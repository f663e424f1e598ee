// A sampled round's two passes over the vocabulary on a CPU: the temperature softmax of a row of logits and an
// inverse-CDF draw from a row of weights (verispec/sampling.py's logits_to_probs and sample, whose torch versions
// define them; these compute the same up to float rounding). A T = 0.7 round draws once per draft token and once
// in its verification, and softmaxes each verified position: in torch that is ~25 small calls a draft token, and
// after a forward has evicted the caches each of them cost more than its arithmetic (0.6-0.9 ms a draft token
// and ~1.7 ms a verification on a 2-core AMD EPYC: ~5% of a round). Here one call each, a row per task, on
// vec.h's vectors, so every build gives the same bits.
#include "tensor.h"
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
      const int64_t body = V / kLanes * kLanes;
      f16v mv = splat(kNegInf);
      for (int64_t i = 0; i < body; i += kLanes) mv = vmax(load(xr + i), mv);  // NaN skipped: it turns the sum NaN
      float m = lanes_max(mv);
      for (int64_t i = body; i < V; ++i) m = xr[i] > m ? xr[i] : m;
      f16v acc = {};
      for (int64_t i = 0; i < body; i += kLanes) {
        const f16v e = exp16((load(xr + i) - m) * inv_t);
        store(yr + i, e);
        acc += e;
      }
      float total = hsum(acc);
      for (int64_t i = body; i < V; ++i) {
        float e[kLanes];
        store(e, exp16(splat((xr[i] - m) * inv_t)));
        yr[i] = e[0];
        total += yr[i];
      }
      if (std::isinf(m) || !std::isfinite(total)) {  // >= 1 otherwise: the maximum's own term is e^0
        for (int64_t i = 0; i < V; ++i) yr[i] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float inv = 1.0f / total;
      for (int64_t i = 0; i < body; i += kLanes) store(yr + i, load(yr + i) * inv);
      for (int64_t i = body; i < V; ++i) yr[i] = yr[i] * inv;
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
  const int64_t nb = V / block;
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> ends(nb);  // the cumulative sum at each block's end
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = wp + r * V;
      float low = 0.f;  // the least weight (a NaN: caught by the total)
      double total = 0;
      for (int64_t b = 0; b < nb; ++b) ends[b] = total += sum64(wr + b * block, block, &low);
      if (!(low >= 0.f) || !std::isfinite(total) || !(total > 0)) {
        ip[r] = -1;
        continue;
      }
      const double target = up[r] * total;
      int64_t b = 0;
      while (b < nb && !(ends[b] > target)) ++b;  // the first block whose end passes the target
      if (b == nb)  // the product rounded up to the total: the last block with weight
        for (b = nb - 1; b > 0 && !(ends[b] > ends[b - 1]); --b) {}
      double sum = b ? ends[b - 1] : 0.0;
      int64_t id = -1, last = -1;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        if (wr[i] > 0.f) last = i;
        sum += wr[i];
        if (sum > target && wr[i] > 0.f) {
          id = i;
          break;
        }
      }
      ip[r] = id >= 0 ? id : last;  // past the block's sum only by rounding: its last id with weight
    }
  });
  return ids;
}
