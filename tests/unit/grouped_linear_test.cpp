// grouped_linear (Note [Grouped linear]) and its CPU kernels (kernels/cpu/grouped_gemm.h): each
// group's rows are linear() of them bit for bit, forward and every gradient (input, weights,
// biases), with empty groups and one-row groups; without biases; the bf16 path (each group
// through linear()); grouped_gemm_tn's empty group (zeros over garbage with beta 0, untouched
// with beta 1) against a sum written out in double; clear errors for bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/cpu/grouped_gemm.h"
#include "testing/gradcheck.h"

namespace loom {
namespace {

using testing::random_tensor;

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

struct Case {
  std::vector<int64_t> rows;
  bool bias;
};

TEST(GroupedLinear, EachGroupIsLinearBitForBit) {
  const int64_t in = 7, out = 5;
  for (const Case& c : {Case{{3, 0, 1, 6}, true}, Case{{4}, true}, Case{{0, 2, 2}, false}}) {
    int64_t total = 0;
    for (int64_t r : c.rows) total += r;
    const auto groups = c.rows.size();
    Tensor x = random_tensor({total, in}, 1);
    Tensor g = random_tensor({total, out}, 2);
    std::vector<Tensor> ws, bs, ws2, bs2;
    for (size_t i = 0; i < groups; ++i) {
      ws.push_back(random_tensor({out, in}, 10 + i));
      ws2.push_back(ws.back().clone());
      if (c.bias) {
        bs.push_back(random_tensor({out}, 20 + i));
        bs2.push_back(bs.back().clone());
      }
    }
    Tensor xa = x.clone(), xb = x.clone();
    for (auto* v : {&ws, &bs, &ws2, &bs2})
      for (Tensor& t : *v) t.set_requires_grad(true);
    xa.set_requires_grad(true);
    xb.set_requires_grad(true);
    Tensor y = grouped_linear(xa, c.rows, ws, bs);
    autograd::backward({y}, {g});
    // The same rows group by group through linear().
    std::vector<float> want;
    int64_t first = 0;
    for (size_t i = 0; i < groups; ++i) {
      Tensor part = linear(narrow(xb, 0, first, c.rows[i]), ws2[i], c.bias ? bs2[i] : Tensor());
      const std::vector<float> v = values(part);
      want.insert(want.end(), v.begin(), v.end());
      autograd::backward({part}, {narrow(g, 0, first, c.rows[i]).contiguous()});
      first += c.rows[i];
    }
    EXPECT_EQ(values(y), want);
    EXPECT_EQ(values(xa.grad()), values(xb.grad()));
    for (size_t i = 0; i < groups; ++i) {
      // An empty group's weight: linear() leaves no gradient, grouped_linear gives zeros.
      const std::vector<float> zeros_w(size_t(out * in), 0.0f), zeros_b(size_t(out), 0.0f);
      EXPECT_EQ(values(ws[i].grad()), c.rows[i] ? values(ws2[i].grad()) : zeros_w) << i;
      if (c.bias) EXPECT_EQ(values(bs[i].grad()), c.rows[i] ? values(bs2[i].grad()) : zeros_b);
    }
  }
}

TEST(GroupedLinear, Bf16RunsEachGroupThroughLinear) {
  const std::vector<int64_t> rows{2, 3};
  Tensor x = random_tensor({5, 4}, 3).to(DType::kBF16);
  std::vector<Tensor> ws{random_tensor({6, 4}, 4).to(DType::kBF16),
                         random_tensor({6, 4}, 5).to(DType::kBF16)};
  Tensor y = grouped_linear(x, rows, ws);
  EXPECT_EQ(y.dtype(), DType::kBF16);
  Tensor want = cat({linear(narrow(x, 0, 0, 2), ws[0]), linear(narrow(x, 0, 2, 3), ws[1])}, 0);
  EXPECT_EQ(values(y.to(DType::kF32)), values(want.to(DType::kF32)));
}

TEST(GroupedLinear, TnKernelAgainstASumInDouble) {
  // C_g = A_g^T B_g over groups of 2, 0 and 3 rows; the empty group's C is zeros over garbage
  // (beta 0) and untouched with beta 1.
  const std::vector<int64_t> rows{2, 0, 3};
  const int64_t m = 3, n = 2, total = 5;
  const std::vector<float> a = values(random_tensor({total, m}, 6));
  const std::vector<float> b = values(random_tensor({total, n}, 7));
  std::vector<std::vector<float>> c(
      3, std::vector<float>(size_t(m * n), std::numeric_limits<float>::quiet_NaN()));
  std::vector<float*> cp{c[0].data(), c[1].data(), c[2].data()};
  kernels::cpu::grouped_gemm_tn(rows.data(), 3, m, n, 1.0f, a.data(), m, b.data(), n, 0.0f,
                                cp.data(), n);
  int64_t first = 0;
  for (size_t g = 0; g < 3; ++g) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t r = first; r < first + rows[g]; ++r)
          want += double(a[size_t(r * m + i)]) * double(b[size_t(r * n + j)]);
        EXPECT_NEAR(c[g][size_t(i * n + j)], want, 1e-6) << g << " " << i << " " << j;
      }
    first += rows[g];
  }
  std::vector<float> kept(size_t(m * n), 2.5f);
  std::vector<float*> one{kept.data()};
  const int64_t none = 0;
  kernels::cpu::grouped_gemm_tn(&none, 1, m, n, 1.0f, a.data(), m, b.data(), n, 1.0f, one.data(),
                                n);
  EXPECT_EQ(kept, std::vector<float>(size_t(m * n), 2.5f));
}

TEST(GroupedLinear, BadArgumentsAreNamed) {
  Tensor x = random_tensor({4, 3}, 8);
  std::vector<Tensor> ws{random_tensor({2, 3}, 9), random_tensor({2, 3}, 10)};
  auto expect_error = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { grouped_linear(x, {1, 2}, ws); }, "the row counts add up to 3");
  expect_error([&] { grouped_linear(x, {4}, ws); }, "1 row counts for 2 weights");
  expect_error(
      [&] {
        grouped_linear(x, {2, 2}, {ws[0], random_tensor({2, 4}, 11)});
      },
      "weight 1 must be [2, 3]");
  expect_error(
      [&] {
        grouped_linear(x, {2, 2}, ws, {random_tensor({2}, 12)});
      },
      "1 biases for 2 weights");
}

}  // namespace
}  // namespace loom
