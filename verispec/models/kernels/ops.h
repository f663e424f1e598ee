// What the kernels' sources call in each other without tensors: a w4a8 matmul and attention over raw pointers
// into buffers the caller owns. A compiled layer stack reuses its buffers from token to token, where a tensor per
// intermediate cost ~20 allocations and ~15 views a layer (~0.5 us each: a tenth of the 0.5B draft's step outside
// its matmuls). The torch-facing functions (w4a8_mm, attention) wrap these, so both compute the same bits.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tensor.h"

// A packed w4a8 linear layer's operands (see w4a8.cpp): weights, per-group codes, per-unit bf16 steps, optional
// float32 bias; N outputs, K inputs, 3, 4, 6 or 8 bits a weight.
struct Linear {
  const uint8_t* w = nullptr;
  const uint8_t* codes = nullptr;
  const uint16_t* units = nullptr;
  const float* bias = nullptr;
  int64_t N = 0, K = 0;
  int bits = 4;
};

// The activations' int8 codes, their group sums and row scales: grown to the largest forward, then reused.
struct MmScratch {
  std::vector<int8_t> xq;
  std::vector<int32_t> xsum;
  std::vector<float> sx;
};

// The operands of w4a8_mm(x, w, codes, units, bias) for inputs of width K, checked once.
Linear linear_of(const torch::Tensor& w, const torch::Tensor& codes, const torch::Tensor& units,
                 const torch::Tensor& bias, int64_t K);
// y [M, L.N] = x [M, L.K] W^T + bias, both row-major and contiguous.
void mm_into(const float* x, int64_t M, const Linear& L, float* y, MmScratch& scratch);

// Strides of a [B, heads, tokens, D] operand (D contiguous), in floats.
struct Strides {
  int64_t b, h, t;
};
// attention() over pointers: batch row b reads keys and values at k + rows[b] * ks.b (rows null: b), so a batch's
// cache rows are read in place wherever they sit; mask [B, T, S] bool or null (causal).
void attention_into(const float* q, Strides qs, const float* k, Strides ks, const float* v, Strides vs,
                    const int64_t* rows, const bool* mask, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S,
                    int64_t D, float scale, float* out, Strides os);

// layer.cpp's compiled layer stack: a model's decoder layers with their operands read once and their buffers kept
// (see stack_run there).
struct StackState;
std::shared_ptr<StackState> stack_state(std::vector<torch::Tensor> tensors, const std::vector<double>& eps,
                                        int64_t heads, int64_t kv_heads);
torch::Tensor stack_run(StackState& s, int64_t n, torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                        torch::Tensor k, torch::Tensor v, torch::Tensor rows, torch::Tensor slots, int64_t read,
                        torch::Tensor mask, int64_t start);
