// The out-of-tree consumer: a small differentiable computation through the installed loom,
// checked exactly (every value below is representable in f32, so == is the right test).
// README.md's library example is this program; keep the two in step.
#include <cstdio>
#include <vector>

#include <loom/loom.h>

int main() {
  using loom::Tensor;
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<float>({0.5f, -1}, {2}).set_requires_grad(true);  // broadcast
  Tensor y = loom::scale(loom::mul(loom::add(a, b), a), 2.0);  // y = 2 (a + b) a
  y.backward(Tensor::ones({2, 2}));  // dy/da = 2 (2a + b), dy/db = 2 a summed over rows

  bool ok = y.to_vector<float>() == std::vector<float>{3, 4, 21, 24} &&
            a.grad().to_vector<float>() == std::vector<float>{5, 6, 13, 14} &&
            b.grad().to_vector<float>() == std::vector<float>{8, 12};
  std::printf("consumer %s\n", ok ? "ok" : "FAILED: wrong values or gradients");
  return ok ? 0 : 1;
}
