#include "collectives/hierarchical.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <functional>

#include "core/ops.h"

namespace loom::comm {

// One step of a two-level collective: the collective it posts, on which of the two groups, once
// which earlier step of the same call has completed.
struct Hierarchy::Step {
  static constexpr int kPrevious = -2;  // the step before it (the first step: none)
  static constexpr int kNone = -1;      // none: posted as soon as its turn comes
  const Communicator* group;
  std::function<WorkPtr()> post;
  int after = kPrevious;                 // or the index of the step it needs
  std::function<void()> done = nullptr;  // run once its collective is seen complete (or none)
};

// Note [Two-level calls in call order]
// A two-level call is a list of collectives on the node's group and the across-nodes group,
// posted in list order, each once the step it needs has completed (by default the one before
// it: a chain). MPI and NCCL need every rank to post the collectives of one group in the same
// order, and with several calls in flight (DDP's buckets, ZeRO's prefetches) the order in which
// their steps complete differs between ranks. So a step is posted only when every earlier call
// has posted all of its steps on the same group: on each group, steps are posted in (call
// order, step order), on every rank alike, while a call's step on one group may overlap an
// earlier call's step on the other (a reduce-scatter's step across nodes with the next one's
// inside the node), and a call's steps may overlap each other where they do not depend on each
// other (Note [Pipelined two-level allreduce]).
// Note [Two-level calls checked whole]
// A call a Communicator routes here is that group's collective, and is checked there as the
// flat call would be (Note [Collective signatures]): one exchange over the whole group with the
// user's signature (op, dtype, count, reduction, the caller's file and line). Once it agrees,
// every rank made this call and so built the same steps; they are posted with no checks of
// their own (Communicator::CheckedByCaller), each still in its sub-group's order. Before, each
// step was checked on its sub-group, which saw only hierarchical.cpp's lines and the pieces'
// counts: swapped calls of one size went unnoticed on a two-level group (and summed one tensor
// with another), where the flat group raises; a call of another count whose first pieces
// matched ran until a later piece; a rank whose call went flat under auto (another size, under
// the crossover) while its peers went two levels met no check and waited out the timeout; and an
// error named an internal step. Now each of those raises on every rank, naming the ranks' own
// calls, and nothing of the call is posted, so the group stays usable. A call made on the
// Hierarchy directly (tests, the cost measurements) checks each step, as does an all-to-all
// with splits (its steps' sizes come from the splits, which no signature holds).
// A routed call is made when its check agrees, which may be inside any loom wait or test (Note
// [The check queue]), a wait for another call's step among them: its chain() then progresses
// every call in flight and may complete that very step. So Chains::wait holds the step it waits
// for, PollingWork::wait notices a completion made meanwhile, and progress() is not re-entered
// (a DDP step on the emulated 2 x 2 cluster aborted with "pure virtual method called" before).
// Note [A failed two-level call]
// When a step raises (it timed out, or its own check found the ranks disagreeing), its call can
// no longer post its later steps, and the calls after it cannot post theirs either: a step is
// posted only once every earlier call has posted on its group (Note [Two-level calls in call
// order]), and skipping the failed call's steps would post the rest out of order on this rank
// alone. Before, the failed call stayed in the queue: a later call waited on the failed step
// again, for another whole timeout, and then raised that step's error as its own; dropping the
// failed call's Work waited the timeout once more. Now the failure is final, as an NCCL
// communicator's abort is: the failed call's wait and test raise its error again at once, every
// call in flight raises that an earlier call failed, naming it, and so does every later call as
// it is made, without waiting. Dropping them waits for nothing. The sub-groups' own steps
// already in flight are left to their Works' usual ends (Note [Abandoned operations] in
// mpi_work.cpp). The group's flat collectives stay usable as before.
struct Hierarchy::Chains {
  explicit Chains(std::string group_name) : name(std::move(group_name)) {}

  struct Chain {
    const char* op = "";
    std::exception_ptr error;  // its failure, or an earlier call's: Note [A failed two-level call]
    std::vector<Step> steps;
    Checks checks = Checks::kEachStep;
    std::function<void()> finish;  // a copy out of a staging buffer, after the last step
    std::vector<WorkPtr> works;    // by step: posted and not yet seen complete
    std::vector<char> complete;    // by step
    size_t posted = 0;
    bool done = false;

    // The step `i` needs complete before it is posted, or -1.
    int needs(size_t i) const {
      const int after = steps[i].after;
      return after == Step::kPrevious ? int(i) - 1 : after;
    }
    // The work the next post waits for, if it is in flight, else any of this call's in flight.
    WorkPtr blocking() const {
      if (posted < steps.size()) {
        const int need = needs(posted);
        if (need >= 0 && !complete[size_t(need)]) return works[size_t(need)];
      }
      for (size_t i = 0; i < posted; ++i)
        if (!complete[i]) return works[i];
      return nullptr;
    }
  };
  std::deque<std::shared_ptr<Chain>> calls;  // not yet done, in call order
  bool progressing = false;                  // inside progress()
  const std::string name;                    // the group's
  std::string failure;  // the first failed call and its error, in words (empty: none)

  // What a call raises when it cannot run or finish because an earlier call failed.
  CommError after_failure(const char* op, const char* what) const {
    return CommError(detail::str_cat(
        "[rank ", error_rank(), "] group '", name, "': a two-level ", op, " ", what,
        ": an earlier two-level call on the group failed (", failure,
        "); after a failure the group's two-level calls stop, since their steps could no longer "
        "be posted in the same order on every rank"));
  }

  // `culprit`'s step raised `error`: every call in flight fails (Note [A failed two-level call]).
  void fail(Chain& culprit, std::exception_ptr error) {
    if (!failure.empty()) {  // failed already, from inside this step's wait
      if (!culprit.error) culprit.error = std::move(error);
      return;
    }
    std::string what = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    failure = detail::str_cat("its ", culprit.op, ": ", what);
    culprit.error = std::move(error);
    for (const std::shared_ptr<Chain>& c : calls)
      if (c.get() != &culprit) c->error = std::make_exception_ptr(after_failure(c->op, "failed"));
    calls.clear();
  }

  // Posts and completes what it can without blocking. Not re-entered: a step's test may make
  // a routed call (its group's check agreed while the step's wait polled every queue: Note
  // [Two-level calls checked whole]), whose chain() then only joins `calls`, which this loop
  // reaches.
  void progress() {
    if (progressing) return;
    progressing = true;
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{progressing};
    std::vector<const Communicator*> busy;  // groups with an earlier call's step not yet posted
    for (size_t ci = 0; ci < calls.size(); ++ci) {  // by index: calls may join meanwhile
      const std::shared_ptr<Chain> c = calls[ci];
      try {
        advance(*c, busy);
      } catch (...) {  // a step's test or post raised: Note [A failed two-level call]
        fail(*c, std::current_exception());
        return;
      }
      for (size_t i = c->posted; i < c->steps.size(); ++i) busy.push_back(c->steps[i].group);
    }
    calls.erase(std::remove_if(calls.begin(), calls.end(), [](const auto& c) { return c->done; }),
                calls.end());
  }

  // progress() for one call: completes its steps in flight that have, and posts those whose
  // turn came (none on a `busy` group), until nothing moves.
  static void advance(Chain& c, const std::vector<const Communicator*>& busy) {
    for (bool moved = true; moved && !c.done;) {
      moved = false;
      for (size_t i = 0; i < c.posted; ++i)
        if (WorkPtr w = c.works[i]; !c.complete[i] && w->test()) {
          c.complete[i] = 1;
          c.works[i] = nullptr;
          if (c.steps[i].done) c.steps[i].done();
          moved = true;
        }
      while (c.posted < c.steps.size()) {
        const Step& step = c.steps[c.posted];
        const int need = c.needs(c.posted);
        if ((need >= 0 && !c.complete[size_t(need)]) ||
            std::find(busy.begin(), busy.end(), step.group) != busy.end())
          break;
        c.works[c.posted++] = post(step, c.checks);
        moved = true;
      }
      if (c.posted == c.steps.size() &&
          std::all_of(c.complete.begin(), c.complete.end(), [](char x) { return x != 0; })) {
        if (c.finish) c.finish();
        c.done = true;
      }
    }
  }

  // Blocks until `chain` is done: waits on the step its next post needs, else on one of its
  // own in flight, else (its next step waits its turn) on the earliest call's, which nothing
  // holds back. The target is held here: its wait may make a routed call whose chain()
  // progresses every call (Note [Two-level calls checked whole]), completing and dropping it.
  void wait(Chain& chain) {
    LOOM_ASSERT(!progressing, "Hierarchy: a call waited on while its steps are being posted");
    for (progress(); !chain.done && !chain.error; progress()) {
      WorkPtr target = chain.blocking();
      std::shared_ptr<Chain> owner;  // of target, when another call's
      for (size_t i = 0; target == nullptr && i < calls.size(); ++i)
        if ((target = calls[i]->blocking())) owner = calls[i];
      LOOM_ASSERT(target != nullptr, "Hierarchy: a call waits with no step in flight");
      try {
        target->wait();
      } catch (...) {  // Note [A failed two-level call]
        fail(owner ? *owner : chain, std::current_exception());
      }
    }
    if (chain.error) std::rethrow_exception(chain.error);
  }

  static WorkPtr post(const Step& step, Checks checks) {
    if (checks == Checks::kEachStep) return step.post();
    Communicator::CheckedByCaller checked;
    return step.post();
  }
};

namespace {

// A two-level call's Work: progress happens in test() and wait(), as for every Work, and moves
// every call of the Hierarchy along (Note [Two-level calls in call order]).
class ChainedWork final : public Work {
 public:
  ChainedWork(std::shared_ptr<Hierarchy::Chains> chains,
              std::shared_ptr<Hierarchy::Chains::Chain> chain)
      : chains_(std::move(chains)), chain_(std::move(chain)) {}
  ~ChainedWork() override {
    try {
      wait();  // as every Work: destroyed unfinished, it completes first (its buffers live here)
    } catch (...) {
    }
  }
  ChainedWork(const ChainedWork&) = delete;
  ChainedWork& operator=(const ChainedWork&) = delete;

  void wait() override {
    if (!chain_->done) chains_->wait(*chain_);
  }
  bool test() override {
    if (!chain_->done) chains_->progress();
    if (chain_->error) std::rethrow_exception(chain_->error);
    return chain_->done;
  }

 private:
  std::shared_ptr<Hierarchy::Chains> chains_;
  std::shared_ptr<Hierarchy::Chains::Chain> chain_;
};

// x [a, b, c] -> [b, a, c], contiguous (no autograd: communication buffers).
Tensor swap_leading(const Tensor& x, int64_t a, int64_t b, int64_t c) {
  return x.reshape({a, b, c}).transpose(0, 1).contiguous().reshape({a * b * c});
}

}  // namespace

Hierarchy::Hierarchy(Communicator& group, std::vector<int> node_of_rank)
    : chains_(std::make_shared<Chains>(group.name())), size_(group.size()) {
  const int n = size_;
  if (node_of_rank.empty()) node_of_rank = node_map(group).node_of_rank;
  LOOM_CHECK(int(node_of_rank.size()) == n, "Hierarchy: ", node_of_rank.size(),
             " node entries for a group of ", n);
  nodes_ = *std::max_element(node_of_rank.begin(), node_of_rank.end()) + 1;
  local_ = n / nodes_;
  // Even and consecutive: rank r on node r / local_.
  bool even = n % nodes_ == 0;
  for (int r = 0; even && r < n; ++r) even = node_of_rank[size_t(r)] == r / local_;
  const int rank = group.rank();
  // Every rank splits, whatever the outcome, so the group's collectives stay in step.
  intra_ = group.split(even ? rank / local_ : 0, rank, group.name() + ".node");
  inter_ = group.split(even ? rank % local_ : rank, rank, group.name() + ".across");
  applies_ = even && nodes_ > 1 && local_ > 1;
  if (!even)
    why_not_ = "ranks are not spread evenly and consecutively over the nodes";
  else if (nodes_ == 1)
    why_not_ = "one node";
  else if (local_ == 1)
    why_not_ = "one rank per node";
}

Hierarchy::~Hierarchy() = default;

WorkPtr Hierarchy::chain(const char* op, std::vector<Step> steps, std::function<void()> finish,
                         Checks checks) {
  if (!chains_->failure.empty()) throw chains_->after_failure(op, "cannot run");
  for (size_t i = 0; i < steps.size(); ++i)
    LOOM_ASSERT(steps[i].after < int(i), "Hierarchy: step ", i, " needs a later one");
  auto c = std::make_shared<Chains::Chain>();
  c->works.resize(steps.size());
  c->complete.assign(steps.size(), 0);
  c->steps = std::move(steps);
  c->checks = checks;
  c->finish = std::move(finish);
  c->op = op;
  chains_->calls.push_back(c);
  chains_->progress();  // posts the first step unless an earlier call holds its group
  return std::make_shared<ChainedWork>(chains_, std::move(c));
}

std::string Hierarchy::str() const {
  return detail::str_cat(nodes_, " node(s) x ", local_, " rank(s)",
                         applies_ ? " (hierarchical)" : " (flat: " + why_not_ + ")");
}

namespace {

void check_avg(const char* op, ReduceOp reduce, DType dtype) {
  LOOM_CHECK(reduce != ReduceOp::kAvg || is_floating(dtype), "Hierarchy::", op, ": avg of ",
             dtype_name(dtype), " tensors is not supported (use sum and divide)");
}

}  // namespace

int allreduce_pieces(size_t bytes, size_t piece_bytes) {
  if (piece_bytes == 0) return 1;
  const size_t pieces = (bytes + piece_bytes - 1) / piece_bytes;
  return int(std::clamp<size_t>(pieces, 1, size_t(kMaxAllreducePieces)));
}

namespace {

// `n` elements cut into about `wanted` equal pieces, the last one shorter (zero: one empty).
struct Pieces {
  int64_t n, per;
  int count;
  Pieces(int64_t total, int wanted)
      : n(total),
        per(std::max<int64_t>(1, (total + wanted - 1) / wanted)),
        count(total == 0 ? 1 : int((total + per - 1) / per)) {}
  int64_t at(int64_t j) const { return j * per; }
  int64_t len(int64_t j) const { return std::min(per, n - at(j)); }
};

// Piece [a, a + len) of every group rank's chunk of c elements, between a buffer in group rank
// order (node k, local l: chunk k L + l) and a staging buffer [l][k][len]: gathered into the
// staging (`to_stage`) or scattered back out of it (Note [Two-level reduce-scatters and
// all-gathers in pieces]).
void move_piece(Tensor grouped, Tensor stage, int64_t nodes, int64_t local, int64_t c, int64_t a,
                int64_t len, bool to_stage) {
  for (int64_t l = 0; l < local; ++l)
    for (int64_t k = 0; k < nodes; ++k) {
      Tensor in_group = grouped.narrow(0, (k * local + l) * c + a, len);
      Tensor staged = stage.narrow(0, (l * nodes + k) * len, len);
      (to_stage ? staged : in_group).copy_(to_stage ? in_group : staged);
    }
}

}  // namespace

// Note [Pipelined two-level allreduce]
// The three steps of a two-level allreduce use different resources: the node's reduce-scatter
// and all-gather its ranks' memory and cores, the allreduce across nodes the network. Run one
// after the other, a step waits for the whole of the one before it, and across nodes the link
// idles while the node reduces: on the emulated 2 x 4 cluster with 1 Gbit/s links the two levels
// reached 0.65 of a node's link bound at 16 MiB (benchmarks/README.md, "Emulated cluster"). So a
// large allreduce runs as K pieces of about piece_bytes (at most kMaxAllreducePieces), each
// piece its three steps, posted in the order
//   RS0, AR0, RS1, AG0, AR1, RS2, AG1, AR2, ..., AG(K-1)
// where piece k's AR needs its RS and its AG needs its AR, and a reduce-scatter needs nothing
// but its turn: while piece k crosses the network, piece k + 1 is reduced in the node and piece
// k - 1 gathered. Posting in list order keeps at most two pieces inside the node at once and
// the order of each group's collectives the same on every rank (Note [Two-level calls in call
// order]). The pieces are disjoint ranges of the buffer, a multiple of L elements each, so in
// place a piece's all-gather overwrites nothing another piece still reads, and every element is
// reduced as in the unpieced call (in the node in rank order, then across nodes).
WorkPtr Hierarchy::allreduce(const Tensor& input, Tensor& output, ReduceOp op, Checks checks) {
  LOOM_CHECK(applies_, "Hierarchy::allreduce on ", str());
  check_avg("allreduce", op, input.dtype());
  LOOM_CHECK(input.is_contiguous() && output.is_contiguous() && input.numel() == output.numel() &&
                 input.dtype() == output.dtype(),
             "Hierarchy::allreduce: input ", input.str(), " and output ", output.str(),
             " (contiguous, one dtype and size)");
  const int64_t n = input.numel(), chunk = (n + local_ - 1) / local_, padded = chunk * local_;
  // L equal pieces already: from the input and into the output, no staging (Note [Two levels
  // without staging]); else a staging buffer padded with zeros to a multiple of L.
  const bool staged = !(n > 0 && n % local_ == 0);
  Tensor from, into;
  if (staged) {
    into = Tensor::zeros({padded}, input.dtype(), input.device());
    if (n > 0) into.narrow(0, 0, n).copy_(input.reshape({n}));
    from = into;
  } else {
    from = input.reshape({n});
    into = output.reshape({n});
  }
  Tensor mine = Tensor::empty({chunk}, input.dtype(), input.device());
  Communicator *intra = intra_.get(), *inter = inter_.get();
  // avg: sums at both levels, then one division by the group size (as the flat call's rounding
  // of the whole sum); max, min and sum as they are.
  const ReduceOp level = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int size = size_;
  const int64_t local = local_;
  // Pieces of a multiple of L elements (Note [Pipelined two-level allreduce]).
  const int wanted = allreduce_pieces(size_t(padded) * dtype_size(input.dtype()), piece_bytes_);
  const Pieces part_of(chunk, wanted);  // of `mine`'s elements
  const int pieces = part_of.count;
  auto rs = [=](int64_t k) -> Step {
    const int64_t at = part_of.at(k), len = part_of.len(k);
    return {intra, [=]() mutable {
              Tensor part = mine.narrow(0, at, len);
              return intra->reduce_scatter(from.narrow(0, at * local, len * local), part, {level});
            }};
  };
  auto ar = [=](int64_t k, int after) -> Step {
    const int64_t at = part_of.at(k), len = part_of.len(k);
    return {inter,
            [=]() mutable {
              Tensor part = mine.narrow(0, at, len);
              return inter->allreduce(part, {level});
            },
            after};
  };
  auto ag = [=](int64_t k, int after) -> Step {
    const int64_t at = part_of.at(k), len = part_of.len(k);
    return {intra,
            [=]() mutable {
              Tensor part = into.narrow(0, at * local, len * local);
              return intra->allgather(mine.narrow(0, at, len), part);
            },
            after};
  };
  // RS0, AR0, then for each further piece RS(k), AG(k - 1), AR(k), and the last piece's AG.
  std::vector<Step> steps = {rs(0), ar(0, 0)};
  int last_ar = 1;  // the step of the piece before's allreduce across nodes
  for (int k = 1; k < pieces; ++k) {
    const int rs_k = int(steps.size());
    steps.push_back(rs(k));
    steps.back().after = Step::kNone;
    steps.push_back(ag(k - 1, last_ar));
    last_ar = int(steps.size());
    steps.push_back(ar(k, rs_k));
  }
  steps.push_back(ag(pieces - 1, last_ar));

  std::function<void()> finish;
  Tensor tensor = output;
  if (staged)
    finish = [into, tensor, n, op, size]() mutable {
      if (n == 0) return;
      Tensor result = into.narrow(0, 0, n).reshape(tensor.shape());
      if (op == ReduceOp::kAvg) result = scale(result.to(DType::kF32), 1.0 / size);
      tensor.copy_(result.to(tensor.dtype()));
    };
  else if (op == ReduceOp::kAvg)
    finish = [into, size]() mutable {
      into.copy_(scale(into.to(DType::kF32), 1.0 / size).to(into.dtype()));
    };
  return chain("allreduce", std::move(steps), std::move(finish), checks);
}

WorkPtr Hierarchy::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op, Checks checks) {
  LOOM_CHECK(applies_, "Hierarchy::reduce_scatter on ", str());
  check_avg("reduce_scatter", op, input.dtype());
  const int64_t c = output.numel();
  LOOM_CHECK(input.numel() == c * size_ && input.is_contiguous() && output.is_contiguous(),
             "Hierarchy::reduce_scatter: input ", input.str(), " and output ", output.str(),
             " (input must be the group size x output's elements, both contiguous)");
  // Note [Two levels without staging]
  // The group's chunks are in (node, local) order, so node k's L chunks lie together in the
  // input: the node's reduce-scatter of that slice hands local rank l node k's chunk for l,
  // summed over the node, straight into slot k of `mine`, one such call per node; the
  // reduce-scatter across nodes then sums slot k over the nodes into node k's rank l, its
  // output. An all-gather runs the same in reverse, each node's gather landing in its slice of
  // the output. Regrouping the whole input (local, node) first made one call of each level but
  // held a copy of the input, and of the output twice, beside it: on ZeRO-1's 13 MB bucket
  // (emulated 2 x 2 cluster) rank 0's peak rose 12 MB over the flat call's. A call of more than
  // one piece stages one piece at a time instead (Note [Two-level reduce-scatters and
  // all-gathers in pieces]): at most 2/K of the input, where the unpieced form cannot overlap
  // its levels at all.
  const Tensor flat_input = input.reshape({input.numel()});
  Tensor mine = Tensor::empty({int64_t(nodes_) * c}, input.dtype(), input.device());
  Communicator *intra = intra_.get(), *inter = inter_.get();
  const ReduceOp level = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const int size = size_;
  const int64_t slice = int64_t(local_) * c;
  Tensor out = output;
  std::vector<Step> steps;
  const int wanted =
      allreduce_pieces(size_t(input.numel()) * dtype_size(input.dtype()), piece_bytes_);
  if (wanted > 1 && c >= wanted) {
    // Note [Two-level reduce-scatters and all-gathers in pieces]
    // Large ones run in pieces as the allreduce does (Note [Pipelined two-level allreduce]),
    // each piece a range [a, a + len) of every rank's chunk: the node's reduce-scatter of piece
    // j gathers, for each local index l, element range j of the chunks of (node k, l) for every
    // k into a staging buffer [l][k][len] (a strided copy of 1/K of the input) and hands local
    // rank l the node's sums [k][len], which is the reduce-scatter across nodes' input for its
    // output's range j. An all-gather runs it in reverse, scattering each staged piece into the
    // output once its gather inside the node completed. A piece's staging is held from its
    // post to the step after it, so at most two pieces' (2/K of the data) are alive at once.
    // On the emulated 2 x 4 cluster with 1 Gbit/s links, at 16 MiB: reduce-scatter 91-97 ms in
    // pieces against 114-131 whole, all-gather 85-92 against 122-134 (the link bound: 67 ms).
    // Each element is reduced as in the whole call: in the node in rank order, then across.
    const Pieces pieces(c, wanted);
    const int64_t nodes = nodes_, local = local_;
    auto staged = std::make_shared<std::vector<Tensor>>(size_t(pieces.count));
    for (int j = 0; j < pieces.count; ++j) {
      const int64_t a = pieces.at(j), len = pieces.len(j);
      Step node_step{intra, [=]() mutable {
                       Tensor stage =
                           Tensor::empty({local * nodes * len}, input.dtype(), input.device());
                       move_piece(flat_input, stage, nodes, local, c, a, len, true);
                       (*staged)[size_t(j)] = stage;
                       Tensor sums = mine.narrow(0, nodes * a, nodes * len);
                       return intra->reduce_scatter(stage, sums, {level});
                     }};
      if (j > 0) node_step.after = Step::kNone;
      steps.push_back(std::move(node_step));
      steps.push_back({inter,
                       [=]() mutable {
                         (*staged)[size_t(j)] = Tensor();  // its reduce-scatter completed
                         Tensor range = out.narrow(0, a, len);
                         return inter->reduce_scatter(mine.narrow(0, nodes * a, nodes * len), range,
                                                      {level});
                       },
                       int(steps.size()) - 1});
    }
  } else {
    for (int64_t k = 0; k < nodes_; ++k)
      steps.push_back({intra, [=]() mutable {
                         Tensor slot = mine.narrow(0, k * c, c);
                         return intra->reduce_scatter(flat_input.narrow(0, k * slice, slice), slot,
                                                      {level});
                       }});
    steps.push_back({inter, [=]() mutable { return inter->reduce_scatter(mine, out, {level}); }});
  }
  std::function<void()> finish;
  if (op == ReduceOp::kAvg)
    finish = [out, size]() mutable {
      out.copy_(scale(out.to(DType::kF32), 1.0 / size).to(out.dtype()));
    };
  return chain("reduce_scatter", std::move(steps), std::move(finish), checks);
}

WorkPtr Hierarchy::allgather(const Tensor& input, Tensor& output, Checks checks) {
  LOOM_CHECK(applies_, "Hierarchy::allgather on ", str());
  const int64_t c = input.numel();
  LOOM_CHECK(output.numel() == c * size_ && input.is_contiguous() && output.is_contiguous(),
             "Hierarchy::allgather: input ", input.str(), " and output ", output.str(),
             " (output must be the group size x input's elements, both contiguous)");
  // Note [Two levels without staging]: across nodes first, then each node's slice of the output.
  Tensor across = Tensor::empty({int64_t(nodes_) * c}, input.dtype(), input.device());
  Communicator *intra = intra_.get(), *inter = inter_.get();
  Tensor flat_output = output.reshape({output.numel()});
  const int64_t slice = int64_t(local_) * c;
  const int wanted =
      allreduce_pieces(size_t(output.numel()) * dtype_size(output.dtype()), piece_bytes_);
  if (wanted > 1 && c >= wanted) {
    // Note [Two-level reduce-scatters and all-gathers in pieces], in reverse.
    const Pieces pieces(c, wanted);
    const int64_t nodes = nodes_, local = local_;
    const Tensor flat_in = input.reshape({c});
    auto staged = std::make_shared<std::vector<Tensor>>(size_t(pieces.count));
    std::vector<Step> steps;
    for (int j = 0; j < pieces.count; ++j) {
      const int64_t a = pieces.at(j), len = pieces.len(j);
      Step across_step{inter, [=]() mutable {
                         Tensor gathered = across.narrow(0, nodes * a, nodes * len);
                         return inter->allgather(flat_in.narrow(0, a, len), gathered);
                       }};
      if (j > 0) across_step.after = Step::kNone;
      steps.push_back(std::move(across_step));
      Step node_step{intra,
                     [=]() mutable {
                       Tensor stage =
                           Tensor::empty({local * nodes * len}, input.dtype(), input.device());
                       (*staged)[size_t(j)] = stage;
                       return intra->allgather(across.narrow(0, nodes * a, nodes * len), stage);
                     },
                     int(steps.size()) - 1};
      node_step.done = [=]() mutable {  // [l][k][len] into the output's chunk of (k, l)
        move_piece(flat_output, (*staged)[size_t(j)], nodes, local, c, a, len, false);
        (*staged)[size_t(j)] = Tensor();
      };
      steps.push_back(std::move(node_step));
    }
    return chain("allgather", std::move(steps), nullptr, checks);
  }
  std::vector<Step> steps = {{inter, [=]() mutable { return inter->allgather(input, across); }}};
  for (int64_t k = 0; k < nodes_; ++k)
    steps.push_back({intra, [=]() mutable {
                       Tensor node_k = flat_output.narrow(0, k * slice, slice);
                       return intra->allgather(across.narrow(0, k * c, c), node_k);
                     }});
  return chain("allgather", std::move(steps), nullptr, checks);
}

WorkPtr Hierarchy::all_to_all(const Tensor& input, Tensor& output, const AllToAllOptions& options,
                              Checks checks) {
  LOOM_CHECK(applies_, "Hierarchy::all_to_all on ", str());
  LOOM_CHECK(input.is_contiguous() && output.is_contiguous() && input.dtype() == output.dtype(),
             "Hierarchy::all_to_all: input ", input.str(), " and output ", output.str(),
             " (contiguous, one dtype)");
  if (options.input_splits.empty() && options.output_splits.empty())
    return all_to_all_equal(input, output, checks);
  return all_to_all_variable(input, output, options);  // its steps checked: See Checks
}

WorkPtr Hierarchy::all_to_all_equal(const Tensor& input, Tensor& output, Checks checks) {
  const int64_t n = size_;
  LOOM_CHECK(input.numel() == output.numel() && input.numel() % n == 0,
             "Hierarchy::all_to_all: input ", input.str(), " and output ", output.str(),
             " (one size, a multiple of the group size, or pass the splits)");
  const int64_t c = input.numel() / n, nodes = nodes_, local = local_;
  // Chunk j of the input goes to rank j = (node, local index). Regrouped by destination local
  // index, the node's all-to-all hands each rank what its node sends to its local index on
  // every node: [source local][destination node] chunks; regrouped by destination node, the
  // all-to-all across nodes delivers [source node][source local], the group's rank order.
  Tensor by_local = swap_leading(input, nodes, local, c);
  Tensor gathered = Tensor::empty({input.numel()}, input.dtype(), input.device());
  Tensor by_node;  // set by the second step; the step (held by the Work) keeps it alive
  Communicator *intra = intra_.get(), *inter = inter_.get();
  Tensor out = output;
  std::vector<Step> steps = {
      {intra, [=]() mutable { return intra->all_to_all(by_local, gathered); }},
      {inter,
       [=]() mutable {
         by_node = swap_leading(gathered, local, nodes, c);
         return inter->all_to_all(by_node, out);
       }},
  };
  return chain("all_to_all", std::move(steps), nullptr, checks);
}

namespace {

// The pieces of `from` (sizes `sizes`, in order) rearranged: piece order[k] becomes the k-th.
Tensor regroup(const Tensor& from, const std::vector<int64_t>& sizes,
               const std::vector<size_t>& order) {
  std::vector<int64_t> start(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) start[i + 1] = start[i] + sizes[i];
  Tensor flat = from.reshape({from.numel()});
  Tensor to = Tensor::empty({start.back()}, from.dtype(), from.device());
  int64_t at = 0;
  for (size_t i : order) {
    if (sizes[i] > 0) to.narrow(0, at, sizes[i]).copy_(flat.narrow(0, start[i], sizes[i]));
    at += sizes[i];
  }
  return to;
}

}  // namespace

// Variable splits. Group rank j = (node j / L, local j % L). Step 1 tells each rank, for every
// rank of its node, how much that rank sends to each rank it forwards for (same local index on
// every node); step 2 moves the data inside the node, grouped by destination local index; step
// 3 across nodes, grouped by destination node, lands in the group's rank order.
WorkPtr Hierarchy::all_to_all_variable(const Tensor& input, Tensor& output,
                                       const AllToAllOptions& options) {
  const int64_t n = size_, nodes = nodes_, local = local_;
  std::vector<int64_t> in_splits = options.input_splits, out_splits = options.output_splits;
  auto resolve = [&](std::vector<int64_t>& splits, const Tensor& t, const char* which) {
    if (splits.empty()) {
      LOOM_CHECK(t.numel() % n == 0, "Hierarchy::all_to_all: ", which, " has ", t.numel(),
                 " elements, not divisible into ", n, " equal splits (pass ", which, "_splits)");
      splits.assign(size_t(n), t.numel() / n);
    }
    int64_t total = 0;
    for (int64_t s : splits) {
      LOOM_CHECK(s >= 0, "Hierarchy::all_to_all: negative split ", s, " in ", which, "_splits");
      total += s;
    }
    LOOM_CHECK(int64_t(splits.size()) == n && total == t.numel(), "Hierarchy::all_to_all: ", which,
               "_splits (", splits.size(), " entries adding up to ", total,
               ") must have group size ", n, " entries adding up to ", which, "'s ", t.numel(),
               " elements");
  };
  resolve(in_splits, input, "input");
  resolve(out_splits, output, "output");
  // Step 1: to local l, the sizes this rank sends to (node m, l) for every m: [l][m].
  std::vector<int64_t> counts(size_t(local * nodes));
  for (int64_t l = 0; l < local; ++l)
    for (int64_t m = 0; m < nodes; ++m)
      counts[size_t(l * nodes + m)] = in_splits[size_t(m * local + l)];
  Tensor counts_out = Tensor::from_vector(counts, {local * nodes});
  Tensor counts_in = Tensor::empty({local * nodes}, DType::kI64);
  // Step 2's send order: by destination local l, then node m (piece m * L + l of the input).
  std::vector<size_t> by_local_order;
  std::vector<int64_t> intra_in(size_t(local), 0);
  for (int64_t l = 0; l < local; ++l)
    for (int64_t m = 0; m < nodes; ++m) {
      by_local_order.push_back(size_t(m * local + l));
      intra_in[size_t(l)] += in_splits[size_t(m * local + l)];
    }
  std::vector<int64_t> inter_out(size_t(nodes), 0);
  for (int64_t m = 0; m < nodes; ++m)
    for (int64_t s = 0; s < local; ++s) inter_out[size_t(m)] += out_splits[size_t(m * local + s)];
  // What the steps hand on to the next (each step is a separate copy of its lambda).
  struct State {
    Tensor by_local, gathered, by_node;
    std::vector<int64_t> received;  // counts_in as host values: [source local s][node m]
  };
  auto state = std::make_shared<State>();
  state->by_local = regroup(input, in_splits, by_local_order);
  Communicator *intra = intra_.get(), *inter = inter_.get();
  Tensor out = output.reshape({output.numel()});
  const DType dtype = input.dtype();
  const Device device = input.device();
  std::vector<Step> steps = {
      {intra, [=]() mutable { return intra->all_to_all(counts_out, counts_in); }},
      {intra,
       [=]() {
         state->received = counts_in.to_vector<int64_t>();
         std::vector<int64_t> intra_out(size_t(local), 0);
         for (int64_t s = 0; s < local; ++s)
           for (int64_t m = 0; m < nodes; ++m)
             intra_out[size_t(s)] += state->received[size_t(s * nodes + m)];
         int64_t total = 0;
         for (int64_t v : intra_out) total += v;
         state->gathered = Tensor::empty({total}, dtype, device);
         return intra->all_to_all(state->by_local, state->gathered, {intra_in, intra_out});
       }},
      {inter,
       [=]() mutable {
         // gathered holds pieces [s][m]; across nodes they go by destination node m, then s.
         std::vector<size_t> by_node_order;
         std::vector<int64_t> inter_in(size_t(nodes), 0);
         for (int64_t m = 0; m < nodes; ++m)
           for (int64_t s = 0; s < local; ++s) {
             by_node_order.push_back(size_t(s * nodes + m));
             inter_in[size_t(m)] += state->received[size_t(s * nodes + m)];
           }
         state->by_node = regroup(state->gathered, state->received, by_node_order);
         return inter->all_to_all(state->by_node, out, {inter_in, inter_out});
       }},
  };
  return chain("all_to_all", std::move(steps), nullptr, Checks::kEachStep);
}

}  // namespace loom::comm
