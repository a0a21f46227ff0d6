// Note [GEMM attention]
// The flash kernels of attention.cu keep the [T, T] scores out of memory but do their products
// with CUDA-core FMA loops: 8 TFLOP/s on an H100 at GPT-2's shape, a twentieth of what cuBLAS's
// bf16 batched GEMM reaches there, and 66 of GPT-2 124M's 125 ms bf16 step. Here the scores of a
// group of heads go through device memory instead, so every T^2 D product is one batched GEMM:
//
//   forward:   S = scale Q K^T;  P = softmax(S) (masked), lse;  O = P V
//   backward:  S = scale Q K^T;  dP = dO V^T;  P = exp(S - lse), dS = P (dP - rowsum(dO O));
//              dV = P^T dO;  dK = scale dS^T Q;  dQ = scale dS K
//
// the same formulas as kernels/cpu/attention.cpp, with the probabilities recomputed from lse in
// the backward as there (nothing [T, T] is kept between the passes). Every GEMM accumulates in f32
// (compute 32F, never TF32). With bf16 storage, S = q k^T and dP = dout v^T read the bf16 arrays
// as they are, on tensor cores: a product of two bf16 values is exact in f32, so only the f32
// sums round, as they would on f32 copies. The products with P and dS, f32 values, take f32
// copies of their other operand (rounding P or dS to bf16, as FlashAttention does, would break
// the contract), and the results are rounded to bf16 once. So both overloads match the CPU to f32
// rounding, like the flash kernels.
//
// Causal mask: the rows go in up to kMaxCausalBlocks blocks, and block [r0, r1) only needs keys
// [0, r1), so every GEMM is cut to the blocks it needs (with 4 blocks, 10/16 of the square; 8:
// 36/64). The row kernels write zeros to the masked entries of a block's keys, which later GEMMs
// read; entries past a row's block are never computed nor read. dV and dK, sums over query rows,
// are cut the other way: key block [j0, j1) takes rows [j0, T).
//
// Workspace per head: S (T^2 floats) in the forward, S and dP/dS in the backward, plus for bf16
// f32 copies of v and out (forward) or q, k, out, dout, dq, dk, dv (backward). Heads go through in
// passes of as many as the given workspace holds (the batch of every GEMM). One pass per call is
// fastest; GPT-2 124M's 96 heads of T 1024 need 400 MB (forward) or 800 MB (backward) for that, and
// the op layer decides how much to give (core/ops/attention.cpp).
//
// Row kernels: one warp per row of S, lanes striding over the keys; warp reductions (xor
// butterflies, so every lane holds the same bits). Every output element is written by one GEMM
// or one lane, in a fixed order: runs are bit-identical on one GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"

namespace loom::kernels::cuda {

namespace {

constexpr size_t kRegionAlign = 256;  // every workspace region starts 256-byte aligned
constexpr int kWarpSize = 32;
constexpr int kRowWarps = 8;  // rows per block of the row kernels: one warp each
constexpr int kRowThreads = kRowWarps * kWarpSize;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxCausalBlocks = 8;
constexpr int64_t kCausalBlockRows = 128;  // the smallest row block worth a GEMM of its own
constexpr int kF32 = 0, kBf16 = 1;         // convert()'s type codes

// f32 arrays of [heads, T, D] the bf16 overloads need: forward v and out; backward q k out dout
// dq dk dv (the score products S = q k^T and dP = dout v^T read the bf16 arrays themselves).
int64_t f32_copies(bool bf16, bool backward) { return bf16 ? (backward ? 7 : 2) : 0; }
int64_t score_buffers(bool backward) { return backward ? 2 : 1; }

size_t round_up(size_t n) { return (n + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

size_t checked_mul(size_t a, size_t b) {
  size_t r = 0;
  LOOM_CHECK(!__builtin_mul_overflow(a, b, &r), "attention_gemm: workspace size overflows (", a,
             " x ", b, " bytes)");
  return r;
}

// Row blocks of the causal mask: block b is rows [b t / n, (b + 1) t / n).
__host__ __device__ inline int64_t causal_blocks(int64_t t, bool causal) {
  if (!causal) return 1;
  const int64_t n = t / kCausalBlockRows;
  return n < 1 ? 1 : (n > kMaxCausalBlocks ? kMaxCausalBlocks : n);
}
__host__ __device__ inline int64_t block_start(int64_t b, int64_t t, int64_t blocks) {
  return b * t / blocks;
}
// The end of the block holding row i: the keys its scores are computed for.
__device__ inline int64_t block_end(int64_t i, int64_t t, int64_t blocks) {
  for (int64_t b = 1; b < blocks; ++b) {
    const int64_t end = block_start(b, t, blocks);
    if (i < end) return end;
  }
  return t;
}

__device__ inline float warp_max(float v) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Row r = (head, i) of s [heads, T, T] (only its first block_end(i) entries exist): the masked
// softmax in place, as kernels/cpu/attention.cpp computes it, and lse[r].
__global__ void softmax_rows_kernel(float* s, float* lse, int64_t rows, int64_t t, int64_t blocks,
                                    bool causal) {
  const int64_t row = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x % kWarpSize);
  if (row >= rows) return;  // a whole warp leaves together: the shuffles below stay full-mask
  const int64_t i = row % t;
  const int64_t visible = causal ? i + 1 : t, end = causal ? block_end(i, t, blocks) : t;
  float* sr = s + row * t;
  float m = -INFINITY;
  for (int64_t j = lane; j < visible; j += kWarpSize) m = fmaxf(m, sr[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t j = lane; j < visible; j += kWarpSize) sum += expf(sr[j] - m);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < end; j += kWarpSize)
    sr[j] = j < visible ? expf(sr[j] - m) * inv : 0.0f;
  if (lane == 0) lse[row] = m + logf(sum);
}

// Row r of the backward: p holds the scores and gets P = exp(s - lse) (masked: 0); ds holds dP
// and gets dS = P (dP - delta), delta = rowsum(dout * out) (kernels/cpu/attention.cpp's shortcut).
__global__ void dscores_rows_kernel(float* p, float* ds, const float* lse, const float* out,
                                    const float* dout, int64_t rows, int64_t t, int64_t d,
                                    int64_t blocks, bool causal) {
  const int64_t row = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x % kWarpSize);
  if (row >= rows) return;
  const int64_t i = row % t;
  const int64_t visible = causal ? i + 1 : t, end = causal ? block_end(i, t, blocks) : t;
  float delta = 0.0f;
  for (int64_t c = lane; c < d; c += kWarpSize) delta += out[row * d + c] * dout[row * d + c];
  delta = warp_sum(delta);
  const float l = lse[row];
  float* pr = p + row * t;
  float* dr = ds + row * t;
  for (int64_t j = lane; j < end; j += kWarpSize) {
    const float pj = j < visible ? expf(pr[j] - l) : 0.0f;
    pr[j] = pj;
    dr[j] = pj * (dr[j] - delta);
  }
}

// One pass: `heads` consecutive heads, every pointer already at the pass's first head.
struct Pass {
  int64_t heads, t, d;
  bool causal;
  Stream stream;
  int64_t blocks() const { return causal_blocks(t, causal); }
  int64_t rows() const { return heads * t; }
  int64_t td() const { return t * d; }
  int64_t tt() const { return t * t; }
  float scale() const { return d > 0 ? 1.0f / std::sqrt(float(d)) : 1.0f; }
  size_t score_bytes() const { return size_t(heads) * size_t(tt()) * sizeof(float); }
};

// s[r0:r1, 0:kend] = alpha a[r0:r1] b[0:kend]^T for each row block (d = 0: all zeros): the
// scores (a = q, b = k, alpha = scale) or dP (a = dout, b = v, alpha = 1). E = float, or BFloat16
// (exact products, f32 sums and result).
template <typename E>
void row_block_products(const E* a, const E* b, float alpha, float* s, const Pass& p) {
  if (p.d == 0) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(s, 0, p.score_bytes(), p.stream));
    return;
  }
  const int64_t t = p.t, d = p.d, n = p.blocks();
  for (int64_t blk = 0; blk < n; ++blk) {
    const int64_t r0 = block_start(blk, t, n), r1 = block_start(blk + 1, t, n);
    const int64_t kend = p.causal ? r1 : t;
    gemm_strided_batched(false, true, r1 - r0, kend, d, alpha, a + r0 * d, d, p.td(), b, d, p.td(),
                         0.0f, s + r0 * t, t, p.tt(), p.heads, p.stream);
  }
}

// q, k: the storage type E (the scores' GEMM reads them as they are); v, out: f32.
template <typename E>
void forward_pass(const E* q, const E* k, const float* v, float* out, float* lse, float* s,
                  const Pass& p) {
  const int64_t t = p.t, d = p.d, n = p.blocks();
  row_block_products(q, k, p.scale(), s, p);
  LOOM_LAUNCH(softmax_rows_kernel, blocks_for(p.rows(), kRowWarps), kRowThreads, 0, p.stream, s,
              lse, p.rows(), t, n, p.causal);
  for (int64_t b = 0; b < n; ++b) {  // out[r0:r1] = P[r0:r1, 0:kend] v[0:kend]
    const int64_t r0 = block_start(b, t, n), r1 = block_start(b + 1, t, n);
    const int64_t kend = p.causal ? r1 : t;
    gemm_strided_batched(false, false, r1 - r0, d, kend, 1.0f, s + r0 * t, t, p.tt(), v, d, p.td(),
                         0.0f, out + r0 * d, d, p.td(), p.heads, p.stream);
  }
}

// The storage-type arrays (E) feed the S and dP products; the f32 ones everything else.
template <typename E>
struct BackwardInputs {
  const E *q, *k, *v, *dout;            // storage type: S = q k^T, dP = dout v^T
  const float *qf, *kf, *outf, *doutf;  // f32: dK, dQ, delta, dV
};

template <typename E>
void backward_pass(const BackwardInputs<E>& in, const float* lse, float* dq, float* dk, float* dv,
                   float* s, float* ds, const Pass& p) {
  const int64_t t = p.t, d = p.d, n = p.blocks();
  const float scale = p.scale();
  const float *q = in.qf, *k = in.kf, *out = in.outf, *dout = in.doutf;
  row_block_products(in.q, in.k, scale, s, p);
  row_block_products(in.dout, in.v, 1.0f, ds, p);
  LOOM_LAUNCH(dscores_rows_kernel, blocks_for(p.rows(), kRowWarps), kRowThreads, 0, p.stream, s, ds,
              lse, out, dout, p.rows(), t, d, n, p.causal);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t j0 = block_start(b, t, n), j1 = block_start(b + 1, t, n);
    const int64_t i0 = p.causal ? j0 : 0;  // the first query row that sees keys [j0, j1)
    // dv[j0:j1] = P[i0:T, j0:j1]^T dout[i0:T];  dk[j0:j1] = scale dS[i0:T, j0:j1]^T q[i0:T]
    gemm_strided_batched(true, false, j1 - j0, d, t - i0, 1.0f, s + i0 * t + j0, t, p.tt(),
                         dout + i0 * d, d, p.td(), 0.0f, dv + j0 * d, d, p.td(), p.heads, p.stream);
    gemm_strided_batched(true, false, j1 - j0, d, t - i0, scale, ds + i0 * t + j0, t, p.tt(),
                         q + i0 * d, d, p.td(), 0.0f, dk + j0 * d, d, p.td(), p.heads, p.stream);
    // dq[j0:j1] = scale dS[j0:j1, 0:kend] k[0:kend] (the block as query rows)
    const int64_t kend = p.causal ? j1 : t;
    gemm_strided_batched(false, false, j1 - j0, d, kend, scale, ds + j0 * t, t, p.tt(), k, d,
                         p.td(), 0.0f, dq + j0 * d, d, p.td(), p.heads, p.stream);
  }
}

// Hands out consecutive 256-byte aligned regions of the workspace.
class Regions {
 public:
  explicit Regions(void* base) : next_(static_cast<char*>(base)) {}
  float* take(size_t bytes) {
    float* r = reinterpret_cast<float*>(next_);
    next_ += round_up(bytes);
    return r;
  }

 private:
  char* next_;
};

// Checks the workspace and returns the heads per pass it allows.
int64_t checked_heads_per_pass(const char* fn, int64_t bh, int64_t t, int64_t d, bool bf16,
                               bool backward, const void* workspace, size_t workspace_bytes) {
  LOOM_CHECK(bh >= 0 && t >= 0 && d >= 0, fn, ": negative size (bh ", bh, ", t ", t, ", d ", d,
             ")");
  const size_t one = attention_gemm_workspace_bytes(1, t, d, bf16, backward);
  LOOM_CHECK(workspace_bytes >= one, fn, ": workspace of ", workspace_bytes,
             " bytes is less than the ", one, " bytes one head of t ", t, ", d ", d, " needs");
  LOOM_CHECK(workspace != nullptr, fn, ": workspace is null (", workspace_bytes, " bytes given)");
  LOOM_CHECK(reinterpret_cast<uintptr_t>(workspace) % sizeof(float) == 0, fn,
             ": workspace is not 4-byte aligned");
  return attention_gemm_heads_per_pass(bh, t, d, bf16, backward, workspace_bytes);
}

void convert_to_f32(const BFloat16* src, float* dst, int64_t n, Stream stream) {
  convert(src, kBf16, dst, kF32, n, stream);
}
void convert_to_bf16(const float* src, BFloat16* dst, int64_t n, Stream stream) {
  convert(src, kF32, dst, kBf16, n, stream);
}

}  // namespace

size_t attention_gemm_workspace_bytes(int64_t heads, int64_t t, int64_t d, bool bf16,
                                      bool backward) {
  LOOM_CHECK(heads >= 0 && t >= 0 && d >= 0,
             "attention_gemm_workspace_bytes: negative size (heads ", heads, ", t ", t, ", d ", d,
             ")");
  const size_t scores = checked_mul(checked_mul(size_t(heads), size_t(t)), size_t(t) * 4);
  const size_t array = checked_mul(checked_mul(size_t(heads), size_t(t)), size_t(d) * 4);
  return size_t(score_buffers(backward)) * round_up(scores) +
         size_t(f32_copies(bf16, backward)) * round_up(array);
}

int64_t attention_gemm_heads_per_pass(int64_t bh, int64_t t, int64_t d, bool bf16, bool backward,
                                      size_t max_bytes) {
  if (bh <= 0 || t <= 0 || d < 0) return 0;
  // Estimated in double first: a huge t must not overflow the exact count below.
  const double per_head = 4.0 * double(t) *
                          (double(score_buffers(backward)) * double(t) +
                           double(f32_copies(bf16, backward)) * double(d));
  if (per_head > double(max_bytes)) return 0;
  int64_t heads = std::min<int64_t>(bh, int64_t(double(max_bytes) / per_head));
  while (heads > 0 && attention_gemm_workspace_bytes(heads, t, d, bf16, backward) > max_bytes)
    --heads;  // the regions' rounding: a few steps at most
  return heads;
}

void attention_gemm_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                            int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
                            size_t workspace_bytes, Stream stream) {
  if (bh == 0 || t == 0) return;
  const int64_t per_pass = checked_heads_per_pass("attention_gemm_forward", bh, t, d, false, false,
                                                  workspace, workspace_bytes);
  for (int64_t h0 = 0; h0 < bh; h0 += per_pass) {
    const Pass p{std::min(per_pass, bh - h0), t, d, causal, stream};
    const int64_t at = h0 * t * d;
    forward_pass(q + at, k + at, v + at, out + at, lse + h0 * t, static_cast<float*>(workspace), p);
  }
}

void attention_gemm_forward(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* out,
                            float* lse, int64_t bh, int64_t t, int64_t d, bool causal,
                            void* workspace, size_t workspace_bytes, Stream stream) {
  if (bh == 0 || t == 0) return;
  const int64_t per_pass = checked_heads_per_pass("attention_gemm_forward", bh, t, d, true, false,
                                                  workspace, workspace_bytes);
  for (int64_t h0 = 0; h0 < bh; h0 += per_pass) {
    const Pass p{std::min(per_pass, bh - h0), t, d, causal, stream};
    const int64_t at = h0 * t * d, n = p.heads * p.td();
    Regions ws(workspace);
    float* s = ws.take(p.score_bytes());
    const size_t array = size_t(n) * sizeof(float);
    float *vf = ws.take(array), *of = ws.take(array);
    convert_to_f32(v + at, vf, n, stream);
    forward_pass(q + at, k + at, vf, of, lse + h0 * t, s, p);
    convert_to_bf16(of, out + at, n, stream);
  }
}

void attention_gemm_backward(const float* q, const float* k, const float* v, const float* out,
                             const float* lse, const float* dout, float* dq, float* dk, float* dv,
                             int64_t bh, int64_t t, int64_t d, bool causal, void* workspace,
                             size_t workspace_bytes, Stream stream) {
  if (bh == 0 || t == 0) return;
  const int64_t per_pass = checked_heads_per_pass("attention_gemm_backward", bh, t, d, false, true,
                                                  workspace, workspace_bytes);
  for (int64_t h0 = 0; h0 < bh; h0 += per_pass) {
    const Pass p{std::min(per_pass, bh - h0), t, d, causal, stream};
    const int64_t at = h0 * t * d;
    Regions ws(workspace);
    float* s = ws.take(p.score_bytes());
    float* ds = ws.take(p.score_bytes());
    const BackwardInputs<float> in{q + at, k + at, v + at,   dout + at,
                                   q + at, k + at, out + at, dout + at};
    backward_pass(in, lse + h0 * t, dq + at, dk + at, dv + at, s, ds, p);
  }
}

void attention_gemm_backward(const BFloat16* q, const BFloat16* k, const BFloat16* v,
                             const BFloat16* out, const float* lse, const BFloat16* dout,
                             BFloat16* dq, BFloat16* dk, BFloat16* dv, int64_t bh, int64_t t,
                             int64_t d, bool causal, void* workspace, size_t workspace_bytes,
                             Stream stream) {
  if (bh == 0 || t == 0) return;
  const int64_t per_pass = checked_heads_per_pass("attention_gemm_backward", bh, t, d, true, true,
                                                  workspace, workspace_bytes);
  for (int64_t h0 = 0; h0 < bh; h0 += per_pass) {
    const Pass p{std::min(per_pass, bh - h0), t, d, causal, stream};
    const int64_t at = h0 * t * d, n = p.heads * p.td();
    Regions ws(workspace);
    float* s = ws.take(p.score_bytes());
    float* ds = ws.take(p.score_bytes());
    const size_t array = size_t(n) * sizeof(float);
    float *qf = ws.take(array), *kf = ws.take(array), *of = ws.take(array);
    float *dof = ws.take(array), *dqf = ws.take(array), *dkf = ws.take(array),
          *dvf = ws.take(array);
    convert_to_f32(q + at, qf, n, stream);
    convert_to_f32(k + at, kf, n, stream);
    convert_to_f32(out + at, of, n, stream);
    convert_to_f32(dout + at, dof, n, stream);
    const BackwardInputs<BFloat16> in{q + at, k + at, v + at, dout + at, qf, kf, of, dof};
    backward_pass(in, lse + h0 * t, dqf, dkf, dvf, s, ds, p);
    convert_to_bf16(dqf, dq + at, n, stream);
    convert_to_bf16(dkf, dk + at, n, stream);
    convert_to_bf16(dvf, dv + at, n, stream);
  }
}

}  // namespace loom::kernels::cuda
