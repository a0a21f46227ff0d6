// The CUDA grouped GEMMs (kernels/cuda/grouped_gemm.h: cuBLAS's grouped GEMM) against their CPU
// twins (kernels/cpu/grouped_gemm.h): both products with groups of 0, 1 and odd row counts,
// alpha / beta, grouped_gemm_tn's empty group (zeros with beta 0, untouched with beta 1); a
// workspace that is too small is refused; two runs give the same bits. Skips without a GPU, and
// when built without CUDA.
//
// Tolerance per element: 1e-5 (S + |beta c|) with S the sum of |products| of that element (the
// CPU twin run on |inputs|), as cuda_gemm_test's f32 GEMMs: both sides add in f32 in their own
// orders (cuBLAS in full f32, CUBLAS_COMPUTE_32F: never TF32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cpu/grouped_gemm.h"
#include "kernels/cuda/runtime.h"
#include "testing/device_buffer.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/grouped_gemm.h"
#endif

namespace loom::kernels {
namespace {

#if !LOOM_WITH_CUDA

TEST(CudaGroupedGemm, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

using Buffer = ::loom::testing::DeviceBuffer;
constexpr cuda::Stream kStream = nullptr;

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(gen);
  return v;
}

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<float>& scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (scale[i] + 1e-30)) << what << " element " << i;
}

TEST(CudaGroupedGemm, ForwardAndInputGradientMatchTheCpuTwin) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<int64_t> rows{3, 0, 1, 17, 6};
  const int64_t groups = 5, n = 19, k = 33, total = 27;
  for (bool trans_b : {true, false})
    for (float beta : {0.0f, 1.0f}) {
      const std::vector<float> a = random_floats(size_t(total * k), 1);
      std::vector<std::vector<float> > b;
      for (int64_t g = 0; g < groups; ++g) b.push_back(random_floats(size_t(n * k), 10 + g));
      const std::vector<float> c0 = random_floats(size_t(total * n), 3);
      const int64_t ldb = trans_b ? k : n;
      // The CPU twin, and it again on |inputs| for the tolerance's scale.
      std::vector<float> want = c0, scale = absolute(c0);
      std::vector<const float*> bp, bap;
      std::vector<std::vector<float> > babs;
      for (auto& v : b) {
        bp.push_back(v.data());
        babs.push_back(absolute(v));
        bap.push_back(babs.back().data());
      }
      const std::vector<float> aabs = absolute(a);
      cpu::grouped_gemm(trans_b, rows.data(), groups, n, k, 0.5f, a.data(), k, bp.data(), ldb, beta,
                        want.data(), n);
      cpu::grouped_gemm(trans_b, rows.data(), groups, n, k, 0.5f, aabs.data(), k, bap.data(), ldb,
                        beta, scale.data(), n);
      Buffer da(a), dc(c0), workspace(cuda::grouped_gemm_workspace_bytes(groups));
      std::vector<Buffer> db;
      std::vector<const float*> dbp;
      for (auto& v : b) {
        db.emplace_back(v);
        dbp.push_back(db.back().as<float>());
      }
      cuda::grouped_gemm(trans_b, rows.data(), groups, n, k, 0.5f, da.as<float>(), k, dbp.data(),
                         ldb, beta, dc.as<float>(), n, workspace.get(), workspace.bytes(), kStream);
      const std::vector<float> got = dc.read<float>(c0.size());
      expect_close(got, want, scale, "grouped_gemm trans_b " + std::to_string(trans_b));
      // Deterministic: a second run from the same C gives the same bits.
      dc.write(c0);
      cuda::grouped_gemm(trans_b, rows.data(), groups, n, k, 0.5f, da.as<float>(), k, dbp.data(),
                         ldb, beta, dc.as<float>(), n, workspace.get(), workspace.bytes(), kStream);
      const std::vector<float> again = dc.read<float>(c0.size());
      EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0);
    }
}

TEST(CudaGroupedGemm, WeightGradientMatchesTheCpuTwin) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<int64_t> rows{4, 0, 9, 1};
  const int64_t groups = 4, m = 11, n = 13, total = 14;
  const std::vector<float> a = random_floats(size_t(total * m), 4);
  const std::vector<float> b = random_floats(size_t(total * n), 5);
  for (float beta : {0.0f, 1.0f}) {
    std::vector<std::vector<float> > want, scale;
    std::vector<float*> wp, sp;
    for (int64_t g = 0; g < groups; ++g) {
      want.push_back(random_floats(size_t(m * n), 20 + g));
      scale.push_back(absolute(want.back()));
    }
    std::vector<std::vector<float> > start = want;
    for (int64_t g = 0; g < groups; ++g) {
      wp.push_back(want[size_t(g)].data());
      sp.push_back(scale[size_t(g)].data());
    }
    const std::vector<float> aabs = absolute(a), babs = absolute(b);
    cpu::grouped_gemm_tn(rows.data(), groups, m, n, 1.0f, a.data(), m, b.data(), n, beta, wp.data(),
                         n);
    cpu::grouped_gemm_tn(rows.data(), groups, m, n, 1.0f, aabs.data(), m, babs.data(), n, beta,
                         sp.data(), n);
    Buffer da(a), dbuf(b), workspace(cuda::grouped_gemm_workspace_bytes(groups));
    std::vector<Buffer> dc;
    std::vector<float*> dcp;
    for (auto& v : start) {
      dc.emplace_back(v);
      dcp.push_back(dc.back().as<float>());
    }
    cuda::grouped_gemm_tn(rows.data(), groups, m, n, 1.0f, da.as<float>(), m, dbuf.as<float>(), n,
                          beta, dcp.data(), n, workspace.get(), workspace.bytes(), kStream);
    for (int64_t g = 0; g < groups; ++g)
      expect_close(dc[size_t(g)].read<float>(size_t(m * n)), want[size_t(g)], scale[size_t(g)],
                   "grouped_gemm_tn group " + std::to_string(g) + " beta " + std::to_string(beta));
  }
}

TEST(CudaGroupedGemm, RefusesASmallWorkspace) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::vector<int64_t> rows{1, 1};
  const std::vector<float> a(4, 1.0f), b(4, 1.0f);
  Buffer da(a), db0(b), db1(b), dc(std::vector<float>(4, 0.0f)), workspace(8);
  std::vector<const float*> bp{db0.as<float>(), db1.as<float>()};
  try {
    cuda::grouped_gemm(true, rows.data(), 2, 2, 2, 1.0f, da.as<float>(), 2, bp.data(), 2, 0.0f,
                       dc.as<float>(), 2, workspace.get(), workspace.bytes(), kStream);
    ADD_FAILURE() << "a workspace of 8 bytes for 2 groups was accepted";
  } catch (const ::loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("grouped_gemm_workspace_bytes"), std::string::npos);
  }
}

#endif

}  // namespace
}  // namespace loom::kernels
