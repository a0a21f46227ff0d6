// Note [Flat or hierarchical]
// A group that spans nodes can run its collectives flat (one MPI/NCCL call over the whole group)
// or in two levels (collectives/hierarchical.h: inside each node, then across nodes over 1/L of
// the data or with L-times-larger messages). Which is faster depends on the links and the size:
// the two levels pay an extra step's latency and staging copies, and gain only where the
// network, not the node, is the bottleneck (on 2 nodes a flat reduce-scatter + all-gather
// already sends a node's minimum across its link: benchmarks/README.md, "Emulated cluster").
// So the choice is measured, not assumed: set_algorithm(kAuto) times each level's allreduce,
// reduce-scatter, all-gather and all-to-all at two sizes, fits time = alpha + beta x bytes per
// level (and a local copy), and every call then compares the two predictions:
//   allreduce(S)      flat: F_ar(S)
//                     two levels: reduce-scatter in the node, allreduce of S/L across, all-gather
//                     in the node, in K pieces of s = S/K (Note [Pipelined two-level
//                     allreduce] in hierarchical.cpp): with node = I_rs(s) + I_ag(s) and
//                     across = X_ar(s/L), node + across + (K - 1) max(node, across) + copy(2S)
//   reduce_scatter(S) flat: F_rs(S); two levels: N x I_rs(S/N) + X_rs(S/L), or in K pieces
//                     with node = I_rs(s) + copy(s) and across = X_rs(s/L), as the allreduce's
//   allgather(S)      flat: F_ag(S); two levels: X_ag(S/L) + N x I_ag(S/N), or in K pieces
//                     likewise
//   all_to_all(S)     flat: F_a2a(S); two levels: I_a2a(S) + X_a2a(S) + copy(2S)
// with F, I, X the flat group, the node and the across-nodes levels, N nodes of L ranks (a
// reduce-scatter or all-gather in the node is one call per node's slice: Note [Two levels
// without staging] in hierarchical.cpp; an allreduce's copies are those of a length that is no
// multiple of L, which is staged; a multiple runs in place, and the prediction keeps the copies
// for both, since the size alone decides; above one piece both allreduce forms are timed whole:
// Note [Pieced allreduces timed whole]). Each collective is timed as
// itself: a group across nodes runs MPI's own calls (Note [Direct collectives inside one node] in
// mpi_direct.cpp), and Open MPI's reduce-scatter and all-gather there are no halves of its
// allreduce. Taken as halves (the first table), they stayed flat on the emulated clusters with
// 1 Gbit/s links, where the two levels ran 1.5-3.2x faster: on 2 x 4 at 16 MiB a flat
// reduce-scatter took 325 ms and all-gather 447 ms, more than the allreduce, in two levels 118
// and 138 ms (benchmarks/README.md, "Reduce-scatter and all-gather across nodes, timed as
// themselves"). The table is the slowest rank's measurement of each entry,
// agreed by one allreduce, so every rank predicts alike and picks the same form: the two forms
// post different collectives, and ranks that disagreed would wait on each other until the
// deadline. For the same reason an all-to-all with splits (each rank's byte count its own) goes
// two-level under auto only when the table prefers that at every size from 1 KiB. A call that
// goes hierarchical is tallied as the group's (op_count, op_bytes) and
// checked by the levels' own signature checks.
//
// Note [A margin for two levels]
// The two-level prediction adds up levels measured one at a time; running them in one call adds
// what none of them showed alone: the levels' traffic and the ranks' own copies and reductions
// competing for the same cores and memory, and one more step to post between them. So two
// levels are chosen only when predicted at least 20% faster than flat. Measured on the emulated
// 4 x 2 cluster, unshaped (benchmarks/README.md, "Emulated cluster"): the table predicted the
// two-level allreduce 16% faster than flat at 4 MiB, and it ran 34% slower (22.6 against
// 16.9 ms); where the links across nodes are the bottleneck the two levels' predicted gain is
// L-fold (L ranks per node) and the margin does not change the choice.
//
// Note [Pieced allreduces timed whole]
// A pieced two-level allreduce (Note [Pipelined two-level allreduce] in hierarchical.cpp) runs
// its levels side by side, so its time is no sum of theirs, and how much of them overlaps
// depends on whether they share what bounds them: on shaped links the node's steps hide behind
// the network's, with every rank on the same two vCPUs they also compete for them. The table
// therefore times one such call whole, at its most pieces (kMaxAllreducePieces x piece_bytes:
// 16 MiB), beside the flat call at the same size, and above one piece predicts both forms from
// those two times, scaled by the bytes (both are bandwidth-bound there). Timed rather than
// composed, the forms need only a margin for the timings' spread (kTimedMargin, 5%), not the
// composition's 20%. On the emulated clusters with 1 Gbit/s links the two levels ran 0.69-0.92
// of the flat call's time at 16 MiB (benchmarks/README.md, "A two-level allreduce in pieces").
#include "collectives/algorithm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <vector>

#include "collectives/hierarchical.h"

namespace loom::comm {

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kFlat:
      return "flat";
    case Algorithm::kHierarchical:
      return "hier";
    case Algorithm::kAuto:
      return "auto";
  }
  return "?";
}

Algorithm algorithm_from_env(Algorithm fallback) {
  const char* v = std::getenv("LOOM_COLL_ALGO");
  if (v == nullptr || *v == '\0') return fallback;
  const std::string s = v;
  if (s == "flat") return Algorithm::kFlat;
  if (s == "hier" || s == "hierarchical") return Algorithm::kHierarchical;
  if (s == "auto") return Algorithm::kAuto;
  throw Error(detail::str_cat("LOOM_COLL_ALGO=", s, ": expected flat, hier or auto"));
}

AlphaBeta AlphaBeta::fit(double small, double t_small, double large, double t_large) {
  AlphaBeta ab;
  ab.beta_s_per_byte = std::max(0.0, (t_large - t_small) / (large - small));
  ab.alpha_s = std::max(0.0, t_small - ab.beta_s_per_byte * small);
  return ab;
}

namespace {

void check_op(const std::string& op) {
  LOOM_CHECK(op == "allreduce" || op == "reduce_scatter" || op == "allgather" || op == "all_to_all",
             "CollectiveCosts: unknown collective '", op,
             "' (allreduce, reduce_scatter, allgather, all_to_all)");
}

}  // namespace

bool CollectiveCosts::timed_whole(const std::string& op, double bytes) const {
  check_op(op);
  return op == "allreduce" && pieced_bytes > 0 && allreduce_pieces(size_t(bytes), piece_bytes) > 1;
}

double CollectiveCosts::flat(const std::string& op, double bytes) const {
  check_op(op);
  if (timed_whole(op, bytes)) return flat_allreduce_pieced * bytes / pieced_bytes;
  if (op == "allreduce") return flat_allreduce.at(bytes);
  if (op == "reduce_scatter") return flat_reduce_scatter.at(bytes);
  if (op == "allgather") return flat_allgather.at(bytes);
  return flat_all_to_all.at(bytes);
}

double CollectiveCosts::hierarchical(const std::string& op, double bytes) const {
  check_op(op);
  const double part = bytes / ranks_per_node;
  if (timed_whole(op, bytes)) return hier_allreduce_pieced * bytes / pieced_bytes;
  if (op == "allreduce") {
    // K pieces: the first crosses both levels alone, then the busier level sets the pace.
    const int k = allreduce_pieces(size_t(bytes), piece_bytes);
    const double node = intra_reduce_scatter.at(bytes / k) + intra_allgather.at(bytes / k);
    const double across = inter_allreduce.at(part / k);
    return node + across + (k - 1) * std::max(node, across) + copy.at(2 * bytes);
  }
  const int k = allreduce_pieces(size_t(bytes), piece_bytes);
  if (k > 1 && (op == "reduce_scatter" || op == "allgather")) {
    // In pieces (Note [Two-level reduce-scatters and all-gathers in pieces]): per piece one
    // call of each level and a staging copy of the node's, the levels side by side.
    const bool rs = op == "reduce_scatter";
    const double node =
        (rs ? intra_reduce_scatter : intra_allgather).at(bytes / k) + copy.at(bytes / k);
    const double across = (rs ? inter_reduce_scatter : inter_allgather).at(part / k);
    return node + across + (k - 1) * std::max(node, across);
  }
  const double node_slice = bytes / nodes;
  if (op == "reduce_scatter")
    return nodes * intra_reduce_scatter.at(node_slice) + inter_reduce_scatter.at(part);
  if (op == "allgather") return inter_allgather.at(part) + nodes * intra_allgather.at(node_slice);
  return intra_all_to_all.at(bytes) + inter_all_to_all.at(bytes) + copy.at(2 * bytes);
}

size_t CollectiveCosts::crossover(const std::string& op) const {
  size_t from = 0;
  for (size_t s = kSmallestCrossover; s <= size_t(1) << 30; s <<= 1) {
    if (!prefers_hierarchical(op, double(s)))
      from = 0;
    else if (from == 0)
      from = s;
  }
  return from;
}

namespace {

std::string size_str(size_t bytes) {
  if (bytes >= size_t(1) << 30) return detail::str_cat(bytes >> 30, " GiB");
  if (bytes >= size_t(1) << 20) return detail::str_cat(bytes >> 20, " MiB");
  return detail::str_cat(bytes >> 10, " KiB");
}

std::string level_str(const char* name, const AlphaBeta& ab) {
  const double gbps = ab.beta_s_per_byte > 0 ? 1e-9 / ab.beta_s_per_byte : 0;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s %.0f us + %.2f GB/s", name, ab.alpha_s * 1e6, gbps);
  return buf;
}

}  // namespace

std::string CollectiveCosts::str() const {
  std::string s;
  for (const char* op : {"allreduce", "reduce_scatter", "allgather", "all_to_all"}) {
    const size_t from = crossover(op);
    s += detail::str_cat(s.empty() ? "" : ", ", op, " ",
                         from == 0 ? std::string("flat") : "hierarchical from " + size_str(from));
  }
  auto levels = [](const char* op, const AlphaBeta& flat, const AlphaBeta& intra,
                   const AlphaBeta& inter) {
    return level_str(op, flat) + ", " + level_str("node", intra) + ", " +
           level_str("across", inter) + "; ";
  };
  s += "; measured: " + levels("allreduce flat", flat_allreduce, intra_allreduce, inter_allreduce) +
       levels("reduce_scatter flat", flat_reduce_scatter, intra_reduce_scatter,
              inter_reduce_scatter) +
       levels("allgather flat", flat_allgather, intra_allgather, inter_allgather) +
       levels("all_to_all flat", flat_all_to_all, intra_all_to_all, inter_all_to_all) +
       level_str("copy", copy);
  if (pieced_bytes > 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "; allreduce of %s timed whole: flat %.3g ms, two levels %.3g ms",
                  size_str(size_t(pieced_bytes)).c_str(), flat_allreduce_pieced * 1e3,
                  hier_allreduce_pieced * 1e3);
    s += buf;
  }
  return s;
}

namespace {

// Median seconds of one call of `repeats`, after one call to warm up.
double seconds_per_call(const std::function<void()>& call, int repeats = 5) {
  call();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + repeats / 2, times.end());
  return times[size_t(repeats / 2)];
}

}  // namespace

CollectiveCosts measure_costs(Communicator& group, Hierarchy& levels) {
  LOOM_CHECK(levels.applies(), "measure_costs: the two levels do not apply to group '",
             group.name(), "': ", levels.str());
  constexpr double kSmall = 4 << 10, kLarge = 1 << 20;
  // Every rank runs the same calls in the same order: the flat group's, then each node's (all
  // nodes at once, as in a real call), then across nodes.
  std::vector<double> seconds;  // [small, large] per measure
  for (double bytes : {kSmall, kLarge}) {
    Communicator* comms[] = {&group, &levels.intra(), &levels.inter()};
    for (Communicator* c : comms) {
      Tensor t = Tensor::zeros({int64_t(bytes) / 4});
      seconds.push_back(seconds_per_call([&] { c->allreduce(t)->wait(); }));
    }
    for (Communicator* c : comms) {  // `bytes` of input
      const int64_t block = std::max<int64_t>(1, int64_t(bytes) / 4 / c->size());
      Tensor in = Tensor::zeros({block * c->size()}), out = Tensor::empty({block});
      seconds.push_back(seconds_per_call([&] { c->reduce_scatter(in, out)->wait(); }));
    }
    for (Communicator* c : comms) {  // `bytes` of output
      const int64_t block = std::max<int64_t>(1, int64_t(bytes) / 4 / c->size());
      Tensor in = Tensor::zeros({block}), out = Tensor::empty({block * c->size()});
      seconds.push_back(seconds_per_call([&] { c->allgather(in, out)->wait(); }));
    }
    for (Communicator* c : comms) {
      const int64_t n = std::max<int64_t>(1, int64_t(bytes) / 4 / c->size()) * c->size();
      Tensor in = Tensor::zeros({n}), out = Tensor::empty({n});
      seconds.push_back(seconds_per_call([&] { c->all_to_all(in, out)->wait(); }));
    }
    Tensor from = Tensor::zeros({int64_t(bytes) / 4}), to = Tensor::empty({int64_t(bytes) / 4});
    seconds.push_back(seconds_per_call([&] { to.copy_(from); }));
  }
  const size_t per_size = seconds.size() / 2;
  // Note [Pieced allreduces timed whole]: flat, then in two levels; median of 3 (a 16 MiB
  // allreduce over 1 Gbit/s links takes 0.15-0.3 s).
  const double pieced = double(levels.piece_bytes()) * kMaxAllreducePieces;
  if (levels.piece_bytes() > 0) {
    Tensor t = Tensor::zeros({std::max<int64_t>(1, int64_t(pieced) / 4)});
    seconds.push_back(seconds_per_call([&] { group.allreduce(t)->wait(); }, 3));
    // Its steps unchecked, as a routed call's (Note [Two-level calls checked whole]); that
    // call's one check on the group is a round trip, well under the margin.
    seconds.push_back(seconds_per_call(
        [&] { levels.allreduce(t, t, ReduceOp::kSum, Hierarchy::Checks::kByCaller)->wait(); }, 3));
  }
  // The slowest rank's time of each, in nanoseconds, agreed by one allreduce.
  std::vector<int64_t> ns;
  for (double s : seconds) ns.push_back(int64_t(s * 1e9));
  Tensor agreed = Tensor::from_vector(ns, {int64_t(ns.size())});
  group.allreduce(agreed, {ReduceOp::kMax})->wait();
  ns = agreed.to_vector<int64_t>();
  auto fit = [&](size_t i) {
    return AlphaBeta::fit(kSmall, double(ns[i]) * 1e-9, kLarge, double(ns[per_size + i]) * 1e-9);
  };
  CollectiveCosts costs;
  costs.nodes = levels.nodes();
  costs.ranks_per_node = levels.ranks_per_node();
  costs.piece_bytes = levels.piece_bytes();
  AlphaBeta* measured[] = {&costs.flat_allreduce,
                           &costs.intra_allreduce,
                           &costs.inter_allreduce,
                           &costs.flat_reduce_scatter,
                           &costs.intra_reduce_scatter,
                           &costs.inter_reduce_scatter,
                           &costs.flat_allgather,
                           &costs.intra_allgather,
                           &costs.inter_allgather,
                           &costs.flat_all_to_all,
                           &costs.intra_all_to_all,
                           &costs.inter_all_to_all,
                           &costs.copy};
  LOOM_CHECK(per_size == std::size(measured), "measure_costs: ", per_size,
             " measures for a table of ", std::size(measured));
  for (size_t i = 0; i < per_size; ++i) *measured[i] = fit(i);
  if (levels.piece_bytes() > 0) {
    costs.pieced_bytes = pieced;
    costs.flat_allreduce_pieced = double(ns[2 * per_size]) * 1e-9;
    costs.hier_allreduce_pieced = double(ns[2 * per_size + 1]) * 1e-9;
  }
  return costs;
}

void Communicator::set_algorithm(Algorithm algorithm, std::vector<int> node_of_rank) {
  // Flat while this runs: its own collectives (the agreement, the splits, the measurements)
  // must not route to a hierarchy being replaced.
  algorithm_ = Algorithm::kFlat;
  costs_.reset();
  const int64_t code = int64_t(algorithm);
  Tensor agree = Tensor::from_vector(std::vector<int64_t>{code, -code}, {2});
  allreduce(agree, {ReduceOp::kMax})->wait();
  const std::vector<int64_t> most = agree.to_vector<int64_t>();
  if (most[0] != code || -most[1] != code)
    throw Error(detail::str_cat(
        "Communicator::set_algorithm: the ranks of group '", name_,
        "' disagree (this rank: ", algorithm_name(algorithm),
        ", others: ", algorithm_name(Algorithm(most[0] != code ? most[0] : -most[1])),
        "); give every rank the same LOOM_COLL_ALGO (mpirun -x LOOM_COLL_ALGO)"));
  if (algorithm == Algorithm::kFlat) {
    hierarchy_.reset();
    return;
  }
  hierarchy_ = std::make_shared<Hierarchy>(*this, std::move(node_of_rank));
  if (algorithm == Algorithm::kAuto && hierarchy_->applies())
    costs_ = std::make_shared<const CollectiveCosts>(measure_costs(*this, *hierarchy_));
  algorithm_ = algorithm;
}

bool Communicator::goes_hierarchical(const char* op, size_t bytes) const {
  if (hierarchy_ == nullptr || !hierarchy_->applies()) return false;
  switch (algorithm_) {
    case Algorithm::kFlat:
      return false;
    case Algorithm::kHierarchical:
      return true;
    case Algorithm::kAuto:
      if (costs_ == nullptr) return false;
      // Variable splits: each rank's bytes differ, so a per-size choice could differ between
      // ranks; two levels only where the table prefers them at every size.
      if (std::string(op) == "all_to_all(v)")
        return costs_->crossover("all_to_all") == kSmallestCrossover;
      return costs_->prefers_hierarchical(op, double(bytes));
  }
  return false;
}

std::shared_ptr<Hierarchy> Communicator::route(const char* op, size_t bytes) const {
  return goes_hierarchical(op, bytes) ? hierarchy_ : nullptr;
}

std::string Communicator::algorithm_str() const {
  if (algorithm_ == Algorithm::kFlat || hierarchy_ == nullptr) return "flat";
  std::string s = detail::str_cat(algorithm_name(algorithm_), " over ", hierarchy_->str());
  if (costs_ != nullptr) s += ": " + costs_->str();
  return s;
}

}  // namespace loom::comm
