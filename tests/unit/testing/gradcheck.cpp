#include "testing/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/autograd.h"

namespace loom::testing {

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape);
}

namespace {

double projected(const Tensor& out, const std::vector<float>& r) {
  std::vector<float> y = out.to_vector<float>();
  double total = 0.0;
  for (size_t i = 0; i < y.size(); ++i) total += double(y[i]) * double(r[i]);
  return total;
}

}  // namespace

void expect_gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                            const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) const_cast<Tensor&>(t).zero_grad();
  Tensor out = f(inputs);
  Tensor r = random_tensor(out.shape(), options.seed);
  std::vector<float> rv = r.to_vector<float>();
  out.backward(r);

  autograd::NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    ASSERT_TRUE(x.grad().defined()) << "input " << k << " got no gradient";
    std::vector<float> analytic = x.grad().to_vector<float>();
    ASSERT_TRUE(x.is_contiguous() && x.device().is_cpu())
        << "gradcheck needs contiguous CPU inputs";
    float* data = x.data<float>();
    int failures = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = data[i];
      data[i] = saved + float(options.eps);
      const double plus = projected(f(inputs), rv);
      data[i] = saved - float(options.eps);
      const double minus = projected(f(inputs), rv);
      data[i] = saved;
      const double numeric = (plus - minus) / (2.0 * options.eps);
      const double diff = std::fabs(double(analytic[size_t(i)]) - numeric);
      if (diff > options.atol + options.rtol * std::fabs(numeric) && failures++ < 5) {
        ADD_FAILURE() << "input " << k << " element " << i << ": autograd " << analytic[size_t(i)]
                      << " vs finite difference " << numeric;
      }
    }
    EXPECT_EQ(failures, 0) << "input " << k << ": " << failures << " of " << x.numel()
                           << " gradient elements differ";
  }
}

void expect_close(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  std::vector<float> a = actual.to_vector<float>(), e = expected.to_vector<float>();
  int failures = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = std::fabs(double(a[i]) - double(e[i]));
    if (!(diff <= atol + rtol * std::fabs(double(e[i]))) && failures++ < 5)
      ADD_FAILURE() << "element " << i << ": " << a[i] << " vs expected " << e[i];
  }
  EXPECT_EQ(failures, 0) << failures << " of " << a.size() << " elements differ";
}

}  // namespace loom::testing
