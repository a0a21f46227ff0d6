// Attention per (batch, head), parallel over (batch, head) with OpenMP; Eigen GEMMs inside run
// single-threaded there (Eigen does not nest inside an active parallel region).
//
// Queries go in blocks of kBlockRows rows. With the causal mask, block [r0, r0 + br) attends only
// to keys [0, r0 + br), so every GEMM is cut to that width: about half of the T x T work is
// skipped, and only the diagonal block needs explicit masking.
//
// Backward, for a block of queries (P the probabilities, dO the output gradient):
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = dS K / sqrt(D),
//   dK += dS^T Q / sqrt(D)
// rowsum(dO * O) equals rowsum(P * dP), and costs D instead of T per row.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include "kernels/cpu/aligned_buffer.h"
#include "kernels/cpu/eigen.h"

namespace loom::kernels::cpu {

namespace {

constexpr int64_t kBlockRows = 32;

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Mat = Eigen::Map<RowMat>;
using ConstMat = Eigen::Map<const RowMat>;
using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

// Keys visible to query block [r0, r0 + br).
int64_t visible_keys(int64_t r0, int64_t br, int64_t t, bool causal) {
  return causal ? r0 + br : t;
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       int64_t bh, int64_t t, int64_t d, bool causal) {
  if (bh == 0 || t == 0) return;
  const float scale = d > 0 ? 1.0f / std::sqrt(float(d)) : 1.0f;
#pragma omp parallel if (bh > 1)
  {
    AlignedVector<float> scores(size_t(std::min(kBlockRows, t) * t));  // Note [Aligned scratch]
#pragma omp for schedule(static)
    for (int64_t i = 0; i < bh; ++i) {
      const int64_t base = i * t * d;
      for (int64_t r0 = 0; r0 < t; r0 += kBlockRows) {
        const int64_t br = std::min(kBlockRows, t - r0), kn = visible_keys(r0, br, t, causal);
        Mat s(scores.data(), br, kn);
        ConstMat qb(q + base + r0 * d, br, d), keys(k + base, kn, d), values(v + base, kn, d);
        s.noalias() = (scale * qb) * keys.transpose();
        for (int64_t r = 0; r < br; ++r) {
          const int64_t row = r0 + r, valid = causal ? row + 1 : kn;
          Row sr(s.row(r).data(), valid);
          const float m = sr.maxCoeff();
          sr = (sr - m).exp();
          const float sum = sr.sum();
          sr *= 1.0f / sum;
          std::fill(s.row(r).data() + valid, s.row(r).data() + kn, 0.0f);
          lse[i * t + row] = m + std::log(sum);
        }
        Mat ob(out + base + r0 * d, br, d);
        ob.noalias() = s * values;
      }
    }
  }
}

void attention_backward(const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        int64_t bh, int64_t t, int64_t d, bool causal) {
  if (bh == 0 || t == 0) return;
  const float scale = d > 0 ? 1.0f / std::sqrt(float(d)) : 1.0f;
#pragma omp parallel if (bh > 1)
  {
    const size_t block = size_t(std::min(kBlockRows, t) * t);
    AlignedVector<float> probs(block), dprobs(block);  // Note [Aligned scratch]
#pragma omp for schedule(static)
    for (int64_t i = 0; i < bh; ++i) {
      const int64_t base = i * t * d;
      Mat(dk + base, t, d).setZero();
      Mat(dv + base, t, d).setZero();
      for (int64_t r0 = 0; r0 < t; r0 += kBlockRows) {
        const int64_t br = std::min(kBlockRows, t - r0), kn = visible_keys(r0, br, t, causal);
        Mat p(probs.data(), br, kn), dp(dprobs.data(), br, kn);
        ConstMat qb(q + base + r0 * d, br, d), keys(k + base, kn, d), values(v + base, kn, d);
        ConstMat ob(out + base + r0 * d, br, d), dob(dout + base + r0 * d, br, d);
        p.noalias() = (scale * qb) * keys.transpose();
        for (int64_t r = 0; r < br; ++r) {
          const int64_t row = r0 + r, valid = causal ? row + 1 : kn;
          Row pr(p.row(r).data(), valid);
          pr = (pr - lse[i * t + row]).exp();
          std::fill(p.row(r).data() + valid, p.row(r).data() + kn, 0.0f);
        }
        Mat(dv + base, kn, d).noalias() += p.transpose() * dob;
        dp.noalias() = dob * values.transpose();
        for (int64_t r = 0; r < br; ++r) {
          const float delta = (ob.row(r).array() * dob.row(r).array()).sum();
          Row(dp.row(r).data(), kn) =
              ConstRow(p.row(r).data(), kn) * (ConstRow(dp.row(r).data(), kn) - delta);
        }
        Mat(dq + base + r0 * d, br, d).noalias() = (scale * dp) * keys;
        Mat(dk + base, kn, d).noalias() += (scale * dp.transpose()) * qb;
      }
    }
  }
}

}  // namespace loom::kernels::cpu
