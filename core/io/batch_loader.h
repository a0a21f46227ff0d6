// Batches from a token stream, read the way llm.c's DataLoader reads them, so a loom run and an
// llm.c or PyTorch run over the same tokens see the same batches in the same order.
//
// Note [Batch order]
// With B rows of T positions, batch k starts at position p_k and holds
//   inputs[b, t]  = tokens[p_k + b*T + t]
//   targets[b, t] = tokens[p_k + b*T + t + 1]
// so it reads B*T + 1 tokens. p_0 = 0 and p_{k+1} = p_k + B*T, except that when the next batch
// would not fit (p_{k+1} + B*T + 1 > n) it starts again at 0: a batch never straddles the end of
// the stream. Hence p_k = (k mod m) * B*T with m = (n - 1) / (B*T) batches per pass, which is
// llm.c's rule (it resets to 0 when the next batch does not fit).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

struct Batch {
  Tensor inputs;   // i32 [B, T], on the CPU
  Tensor targets;  // i32 [B, T], inputs shifted by one position
};

class BatchLoader {
 public:
  // `source` names the stream in errors ("train.bin"); it may be empty. Throws loom::Error when
  // the stream is too short for one batch ("data: the stream has 100 tokens; a batch of 4 x 64
  // needs 257") or when B or T is not positive.
  BatchLoader(std::vector<int32_t> tokens, int64_t batch, int64_t seq, std::string source = "");

  Batch next_batch();                      // batch index(), then advances
  Batch batch_at(int64_t k) const;         // batch k of Note [Batch order]; k >= 0
  void reset() { next_ = 0; }              // back to batch 0
  void seek(int64_t k);                    // next_batch() returns batch k next; k >= 0
  int64_t index() const { return next_; }  // how many batches next_batch() has returned
  int64_t batches_per_pass() const { return batches_per_pass_; }  // m in Note [Batch order]

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  const std::vector<int32_t>& tokens() const { return *tokens_; }

 private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t batch_;
  int64_t seq_;
  int64_t batches_per_pass_;
  int64_t next_ = 0;
};

// Checks that every token is in [0, vocab): a token id past the model's vocabulary would index
// past the embedding table. Throws loom::Error naming the source, the token and its position.
void check_token_range(const std::vector<int32_t>& tokens, int64_t vocab,
                       const std::string& source = "");

}  // namespace loom::io
