// The backward groups positions by vocabulary row with a counting sort (CSR: row -> positions in
// increasing order) and then gives each row to one thread, which sums its positions in order. No
// two threads write the same row, so there are no atomics and the result is deterministic.
#include "kernels/cpu/embedding.h"

#include <cstring>
#include <vector>

namespace loom::kernels::cpu {

namespace {

template <typename I>
void forward_impl(const float* weight, const I* indices, float* out, int64_t n, int64_t cols) {
  const size_t row_bytes = size_t(cols) * sizeof(float);
#pragma omp parallel for schedule(static) if (n * cols > (1 << 16))
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * cols, weight + int64_t(indices[i]) * cols, row_bytes);
}

template <typename I>
void backward_impl(const float* dout, const I* indices, float* dweight, int64_t n, int64_t vocab,
                   int64_t cols) {
  std::vector<int64_t> start(size_t(vocab) + 1, 0);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ++start[size_t(indices[i]) + 1];
  for (int64_t v = 0; v < vocab; ++v) start[size_t(v) + 1] += start[size_t(v)];
  {
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[size_t(cursor[size_t(indices[i])]++)] = i;
  }
#pragma omp parallel for schedule(static) if (vocab * cols > (1 << 16))
  for (int64_t v = 0; v < vocab; ++v) {
    float* row = dweight + v * cols;
    const int64_t begin = start[size_t(v)], end = start[size_t(v) + 1];
    if (begin == end) {
      std::memset(row, 0, size_t(cols) * sizeof(float));
      continue;
    }
    std::memcpy(row, dout + order[size_t(begin)] * cols, size_t(cols) * sizeof(float));
    for (int64_t j = begin + 1; j < end; ++j) {
      const float* g = dout + order[size_t(j)] * cols;
      for (int64_t c = 0; c < cols; ++c) row[c] += g[c];
    }
  }
}

}  // namespace

void embedding_forward(const float* weight, const int32_t* indices, float* out, int64_t n,
                       int64_t cols) {
  forward_impl(weight, indices, out, n, cols);
}
void embedding_forward(const float* weight, const int64_t* indices, float* out, int64_t n,
                       int64_t cols) {
  forward_impl(weight, indices, out, n, cols);
}

void embedding_backward(const float* dout, const int32_t* indices, float* dweight, int64_t n,
                        int64_t vocab, int64_t cols) {
  backward_impl(dout, indices, dweight, n, vocab, cols);
}
void embedding_backward(const float* dout, const int64_t* indices, float* dweight, int64_t n,
                        int64_t vocab, int64_t cols) {
  backward_impl(dout, indices, dweight, n, vocab, cols);
}

}  // namespace loom::kernels::cpu
