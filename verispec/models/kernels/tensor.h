// The few ATen headers the kernels use, in place of <torch/extension.h>: that header pulls in all of torch's C++
// API and takes ~12 s of compiler time per source file, these ~3 s. The kernels compile once per machine, but
// also once per fresh CI checkout, for both instruction sets.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

namespace torch {  // the names the kernels use, as <torch/extension.h> spells them
using at::Tensor;
using at::empty;
using at::kBool;
using at::kHalf;
using at::kLong;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt32 = at::kInt;
constexpr auto kUInt8 = at::kByte;
}  // namespace torch
