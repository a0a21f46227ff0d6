// See Note [Batch order] in core/io/batch_loader.h.
#include "core/io/batch_loader.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom::io {
namespace {

std::string data_prefix(const std::string& source) {
  return source.empty() ? "data: " : "data " + source + ": ";
}

}  // namespace

BatchLoader::BatchLoader(std::vector<int32_t> tokens, int64_t batch, int64_t seq,
                         std::string source)
    : batch_(batch), seq_(seq) {
  LOOM_CHECK(batch > 0 && seq > 0, data_prefix(source), "batch size and sequence length must be ",
             "positive, got a batch of ", batch, " x ", seq);
  int64_t n = int64_t(tokens.size());
  int64_t span = batch * seq;
  LOOM_CHECK(n >= span + 1, data_prefix(source), "the stream has ", n, " tokens; a batch of ",
             batch, " x ", seq, " needs ", span + 1);
  batches_per_pass_ = (n - 1) / span;
  tokens_ = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
}

Batch BatchLoader::batch_at(int64_t k) const {
  LOOM_CHECK(k >= 0, "BatchLoader::batch_at: batch index ", k, " is negative");
  const int64_t span = batch_ * seq_;
  const int32_t* start = tokens_->data() + (k % batches_per_pass_) * span;
  Batch out{Tensor::empty({batch_, seq_}, DType::kI32), Tensor::empty({batch_, seq_}, DType::kI32)};
  // Rows are consecutive in the stream, so [B, T] row-major is one contiguous run of tokens.
  std::memcpy(out.inputs.data<int32_t>(), start, size_t(span) * sizeof(int32_t));
  std::memcpy(out.targets.data<int32_t>(), start + 1, size_t(span) * sizeof(int32_t));
  return out;
}

Batch BatchLoader::next_batch() { return batch_at(next_++); }

void check_token_range(const std::vector<int32_t>& tokens, int64_t vocab,
                       const std::string& source) {
  auto bad = std::find_if(tokens.begin(), tokens.end(),
                          [vocab](int32_t t) { return t < 0 || t >= vocab; });
  LOOM_CHECK(bad == tokens.end(), data_prefix(source), "token ", *bad, " at position ",
             bad - tokens.begin(), " is outside the model's vocabulary 0..", vocab - 1);
}

void BatchLoader::seek(int64_t k) {
  LOOM_CHECK(k >= 0, "BatchLoader::seek: batch index must be >= 0, got ", k);
  next_ = k;
}

}  // namespace loom::io
