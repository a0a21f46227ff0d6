// SGD and AdamW on CUDA (the CPU twin is kernels/cpu/optimizer_update.cpp). Every update, single
// or multi-tensor, runs one kernel per optimizer: a launch carries up to kMaxTensorsPerLaunch
// tensors in its parameter block (TensorList below), the concatenated tensors are cut into
// chunks of kChunk elements, and each block walks chunks (grid-stride over chunks); a block finds
// its chunk's tensor by binary search over the chunk prefix sums. A single-tensor call is a
// multi-tensor call of one tensor, so both give identical bits.
//
// Note [Optimizer FMA contraction]
// kernels/cpu/optimizer_update.cpp spells out which products it fuses (std::fma where the target
// has FMA; the file is built with -ffp-contract=off, so the compiler fuses nothing else):
//   SGD:   g = fma(wd, p, g);  b = fma(buf, mom, damp * g);  d = fma(mom, b, g) (nesterov);
//          p = fma(-lr, d, p)
//   AdamW: m = fma(m, beta1, (1 - beta1) * g);  v = fma(v, beta2, (1 - beta2) * (g * g));
//          p = fma(-step_size, m / denom, p * decay);  decay = float(fma(-lr, wd, 1.0)) in f64
// The kernels below spell out every operation with __fmaf_rn / __fmul_rn / __fadd_rn /
// __fdiv_rn / __fsqrt_rn, which nvcc neither contracts nor approximates, so they round exactly
// where the CPU does and the results are bit-identical. (Until 2026-11 the CPU side left the
// fusing to GCC's default contraction: g++ 12 fused these products, g++ 13 on the GPU machine
// fused `buf * mom + damp * g` differently in some elements, and the CUDA test caught it.) A CPU
// built without FMA (LOOM_NATIVE=OFF on x86-64) rounds those products separately; CPU and CUDA
// then differ in the last bit of some elements (well inside the 1e-6 relative the tests allow).
// To change the order, edit both files.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/optimizer_update.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kBlock = kBlockThreads;
constexpr int64_t kChunk = 16 * kBlock;  // elements per chunk: 16 per thread
constexpr int kMaxTensors = int(kMaxTensorsPerLaunch);

// The tensors of one launch, passed by value as a __grid_constant__ kernel parameter (read in
// place from the parameter bank: no copy, no device-side pointer arrays). Tensors with n == 0
// are never listed, so chunk_begin increases strictly.
template <int kArrays>
struct TensorList {
  void* ptr[kArrays][kMaxTensors];       // ptr[a][t]: array a of tensor t
  int64_t n[kMaxTensors];                // elements of tensor t
  int64_t chunk_begin[kMaxTensors + 1];  // chunks of the tensors before t; [count] = all
  int count;                             // tensors listed, 1..kMaxTensors
};

struct SgdScalars {
  float wd, mom, damp, neg_lr;
  bool decays, use_momentum, first, nesterov;
};

struct AdamWScalars {
  float decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step_size, bias_correction2_sqrt, eps;
  bool decays;
};

// CUDA's portable limit on a kernel's parameters is 4 KB (32 KB only from CUDA 12.1 on Volta+).
static_assert(sizeof(TensorList<3>) + sizeof(SgdScalars) <= 4096, "SGD launch parameters > 4 KB");
static_assert(sizeof(TensorList<4>) + sizeof(AdamWScalars) <= 4096,
              "AdamW launch parameters > 4 KB");

// The tensor t whose chunks [chunk_begin[t], chunk_begin[t + 1]) hold `chunk`.
template <int kArrays>
__device__ inline int tensor_of_chunk(const TensorList<kArrays>& list, int64_t chunk) {
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (list.chunk_begin[mid] <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// See Note [Optimizer FMA contraction] for the operation order.
__global__ void __launch_bounds__(kBlock)
    sgd_kernel(const __grid_constant__ TensorList<3> list, const SgdScalars s) {
  const int64_t chunks = list.chunk_begin[list.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int t = tensor_of_chunk(list, chunk);
    float* param = static_cast<float*>(list.ptr[0][t]);
    const float* grad = static_cast<const float*>(list.ptr[1][t]);
    float* buf = static_cast<float*>(list.ptr[2][t]);
    const int64_t begin = (chunk - list.chunk_begin[t]) * kChunk;
    const int64_t end = min(begin + kChunk, list.n[t]);
    for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
      const float p = param[i];
      float g = grad[i];
      if (s.decays) g = __fmaf_rn(s.wd, p, g);  // grad.add(p, alpha=wd)
      if (s.use_momentum) {
        // buf.mul_(momentum).add_(g, alpha=1-dampening); buf = g on the first step
        const float b = s.first ? g : __fmaf_rn(buf[i], s.mom, __fmul_rn(s.damp, g));
        buf[i] = b;
        g = s.nesterov ? __fmaf_rn(s.mom, b, g) : b;
      }
      param[i] = __fmaf_rn(s.neg_lr, g, p);  // p.add_(g, alpha=-lr)
    }
  }
}

__global__ void __launch_bounds__(kBlock)
    adamw_kernel(const __grid_constant__ TensorList<4> list, const AdamWScalars s) {
  const int64_t chunks = list.chunk_begin[list.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int t = tensor_of_chunk(list, chunk);
    float* param = static_cast<float*>(list.ptr[0][t]);
    const float* grad = static_cast<const float*>(list.ptr[1][t]);
    float* exp_avg = static_cast<float*>(list.ptr[2][t]);
    float* exp_avg_sq = static_cast<float*>(list.ptr[3][t]);
    const int64_t begin = (chunk - list.chunk_begin[t]) * kChunk;
    const int64_t end = min(begin + kChunk, list.n[t]);
    for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
      const float g = grad[i];
      float p = param[i];
      if (s.decays) p = __fmul_rn(p, s.decay);  // param.mul_(1 - lr * wd)
      // exp_avg.mul_(beta1).add_(g, alpha=1-beta1)
      const float m = __fmaf_rn(exp_avg[i], s.beta1, __fmul_rn(s.one_minus_b1, g));
      // exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1-beta2)
      const float v = __fmaf_rn(exp_avg_sq[i], s.beta2, __fmul_rn(s.one_minus_b2, __fmul_rn(g, g)));
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      // denom = sqrt(v) / sqrt(bias_correction2) + eps; param.addcdiv_(m, denom, -step_size)
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
      param[i] = __fmaf_rn(s.neg_step_size, __fdiv_rn(m, denom), p);
    }
  }
}

// Packs tensors [0, count) into TensorLists of up to kMaxTensors non-empty tensors and calls
// launch(list) for each. fill(i, n, ptrs) gives tensor i (checked beforehand, so that a bad
// tensor throws before any launch has updated the others).
template <int kArrays, typename Fill, typename Launch>
void for_each_launch(int64_t count, Fill fill, Launch launch) {
  TensorList<kArrays> list{};
  for (int64_t i = 0; i < count; ++i) {
    int64_t n = 0;
    void* ptrs[kArrays] = {};
    fill(i, n, ptrs);
    if (n == 0) continue;
    const int t = list.count;
    for (int a = 0; a < kArrays; ++a) list.ptr[a][t] = ptrs[a];
    list.n[t] = n;
    list.chunk_begin[t + 1] = list.chunk_begin[t] + (n + kChunk - 1) / kChunk;
    if (++list.count == kMaxTensors) {
      launch(list);
      list.count = 0;  // chunk_begin[0] stays 0; the rest is rewritten before it is read
    }
  }
  if (list.count > 0) launch(list);
}

unsigned grid_for(int64_t chunks) {
  return unsigned(std::min<int64_t>(chunks, int64_t(kMaxGridBlocks)));
}

// "tensors[3].grad" for the multi-tensor calls, "grad" for the single one.
std::string arg_name(bool multi, int64_t i, const char* field) {
  return multi ? ::loom::detail::str_cat("tensors[", i, "].", field) : std::string(field);
}

void check_tensor_list(const char* op, const void* tensors, int64_t count) {
  LOOM_CHECK(count >= 0, "cuda ", op, ": count = ", count, " is negative");
  LOOM_CHECK(count == 0 || tensors != nullptr, "cuda ", op,
             ": tensors is null for count = ", count);
}

void check_size_and_ptr(const char* op, bool multi, int64_t i, int64_t n, const void* p,
                        const char* field, const char* why = "") {
  LOOM_CHECK(n >= 0, "cuda ", op, ": ", arg_name(multi, i, "n"), " = ", n, " is negative");
  LOOM_CHECK(n == 0 || p != nullptr, "cuda ", op, ": ", arg_name(multi, i, field), " is null for ",
             n, " elements", why);
}

SgdScalars sgd_scalars(const SgdHyper& h) {
  SgdScalars s;  // rounded from the doubles exactly as cpu::sgd_step does
  s.wd = float(h.weight_decay);
  s.mom = float(h.momentum);
  s.damp = float(1.0 - h.dampening);
  s.neg_lr = float(-h.lr);
  s.decays = h.weight_decay != 0.0;
  s.use_momentum = h.momentum != 0.0;
  s.first = h.first_step;
  s.nesterov = h.nesterov;
  return s;
}

AdamWScalars adamw_scalars(const AdamWHyper& h) {
  // In f64 and rounded once, as cpu::adamw_step does; the decay's product and difference are
  // one fma there (Note [Optimizer FMA contraction]).
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2;
  const double step = double(h.step);
  const double bias_correction1 = 1.0 - std::pow(b1, step);
  const double bias_correction2 = 1.0 - std::pow(b2, step);
  AdamWScalars s;
  s.decay = float(std::fma(-lr, h.weight_decay, 1.0));
  s.one_minus_b1 = float(1.0 - b1);
  s.one_minus_b2 = float(1.0 - b2);
  s.neg_step_size = float(-(lr / bias_correction1));
  s.bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  s.beta1 = float(b1);
  s.beta2 = float(b2);
  s.eps = float(h.eps);
  s.decays = h.weight_decay != 0.0;
  return s;
}

void sgd_launches(const char* op, bool multi, const SgdTensor* tensors, int64_t count,
                  const SgdHyper& h, Stream stream) {
  check_tensor_list(op, tensors, count);
  const SgdScalars s = sgd_scalars(h);
  for (int64_t i = 0; i < count; ++i) {  // all of them before the first launch
    const SgdTensor& t = tensors[i];
    check_size_and_ptr(op, multi, i, t.n, t.param, "param");
    check_size_and_ptr(op, multi, i, t.n, t.grad, "grad");
    if (s.use_momentum)
      check_size_and_ptr(op, multi, i, t.n, t.momentum_buf, "momentum_buf",
                         " (momentum != 0 needs a momentum buffer)");
  }
  for_each_launch<3>(
      count,
      [&](int64_t i, int64_t& n, void** ptrs) {
        const SgdTensor& t = tensors[i];
        n = t.n;
        ptrs[0] = t.param;
        ptrs[1] = const_cast<float*>(t.grad);
        ptrs[2] = t.momentum_buf;
      },
      [&](const TensorList<3>& list) {
        LOOM_LAUNCH(sgd_kernel, grid_for(list.chunk_begin[list.count]), kBlock, 0, stream, list, s);
      });
}

void adamw_launches(const char* op, bool multi, const AdamWTensor* tensors, int64_t count,
                    const AdamWHyper& h, Stream stream) {
  check_tensor_list(op, tensors, count);
  const AdamWScalars s = adamw_scalars(h);
  for (int64_t i = 0; i < count; ++i) {  // all of them before the first launch
    const AdamWTensor& t = tensors[i];
    check_size_and_ptr(op, multi, i, t.n, t.param, "param");
    check_size_and_ptr(op, multi, i, t.n, t.grad, "grad");
    check_size_and_ptr(op, multi, i, t.n, t.exp_avg, "exp_avg");
    check_size_and_ptr(op, multi, i, t.n, t.exp_avg_sq, "exp_avg_sq");
  }
  for_each_launch<4>(
      count,
      [&](int64_t i, int64_t& n, void** ptrs) {
        const AdamWTensor& t = tensors[i];
        n = t.n;
        ptrs[0] = t.param;
        ptrs[1] = const_cast<float*>(t.grad);
        ptrs[2] = t.exp_avg;
        ptrs[3] = t.exp_avg_sq;
      },
      [&](const TensorList<4>& list) {
        LOOM_LAUNCH(adamw_kernel, grid_for(list.chunk_begin[list.count]), kBlock, 0, stream, list,
                    s);
      });
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, const SgdHyper& h,
              Stream stream) {
  const SgdTensor t{param, grad, momentum_buf, n};
  sgd_launches("sgd_step", false, &t, 1, h, stream);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                const AdamWHyper& h, Stream stream) {
  const AdamWTensor t{param, grad, exp_avg, exp_avg_sq, n};
  adamw_launches("adamw_step", false, &t, 1, h, stream);
}

void sgd_step_multi(const SgdTensor* tensors, int64_t count, const SgdHyper& h, Stream stream) {
  sgd_launches("sgd_step_multi", true, tensors, count, h, stream);
}

void adamw_step_multi(const AdamWTensor* tensors, int64_t count, const AdamWHyper& h,
                      Stream stream) {
  adamw_launches("adamw_step_multi", true, tensors, count, h, stream);
}

}  // namespace loom::kernels::cuda
