// Validation of collectives in the nccl-tests manner, shared by every backend's test
// (collectives_test.cpp, nccl_test.cpp): each rank fills its buffers from a formula of
// (rank, index), the expected output has a closed form, each rank counts its wrong elements, and
// the counts are summed over all ranks, so a wrong element anywhere fails the test everywhere.
//
// Exactness: reduced values are ±(r+1)(i%7+1), so every partial sum is an integer below 256 in
// magnitude, exact in every dtype, and sum, max and min compare bit for bit; avg is the f32 sum
// divided by the group size, rounded once to the dtype (integers: truncating division). Moved
// values are rounded to the dtype on both sides, so they too compare bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "core/dispatch.h"
#include "core/tensor.h"

namespace loom::comm::checks {

inline const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64};
inline const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
// 7, 1009, 3001 and 17011 divide by no group size tested; the small ones travel inside their
// signature checks (an f32 allreduce of 3001 as the allgather of its inputs on 2 ranks, in two
// phases on more), 17011 (more than a check carries, in every dtype) through MPI's own
// collectives, or for a reduce_scatter loom's direct one (Note [Direct reduce-scatter] in
// mpi_direct.cpp; Note [Small collectives in their check]).
inline const int64_t kSizes[] = {0, 1, 7, 1009, 3001, 17011};

// The value a rank holds for reductions: ±(r+1)(i%7+1), negative at odd i.
inline double reduce_value(int r, int64_t i) {
  return double(r + 1) * double(i % 7 + 1) * (i % 2 ? -1.0 : 1.0);
}
// The value a rank moves (allgather, broadcast, send/recv): distinct per rank.
inline double move_value(int r, int64_t i) { return double(r + 1) * 1000.0 + double(i % 1000); }
// Element j of the part rank `from` sends to rank `to` in all_to_all and batch_p2p.
inline double part_value(int from, int to, int64_t j) {
  return double(from) * 1000.0 + double(to) * 100.0 + double(j % 100);  // within f16 range
}
constexpr double kGarbage = -7777.0;  // what outputs hold before the op writes them

// v as element type T, rounded as loom rounds (to nearest even for bf16/f16).
template <typename T>
T as(double v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return float_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, Float16>)
    return float_to_f16(float(v));
  else
    return T(v);
}
template <typename T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return bf16_to_float(x);
  else if constexpr (std::is_same_v<T, Float16>)
    return f16_to_float(x);
  else
    return double(x);
}

// A [n] tensor of dtype dt on `device` whose element i is value(i).
inline Tensor make(DType dt, int64_t n, const std::function<double(int64_t)>& value,
                   Device device = Device::cpu()) {
  Tensor host = visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {  // no collective takes bool buffers in these tests
      ADD_FAILURE() << "collective_checks: make() of a bool tensor";
      return Tensor();
    } else {
      std::vector<T> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = as<T>(value(i));
      return Tensor::from_vector(v, {n});
    }
  });
  return host.to(device);
}
inline Tensor garbage(DType dt, int64_t n, Device device = Device::cpu()) {
  return make(
      dt, n, [](int64_t) { return kGarbage; }, device);
}

// Counts the elements of t (on any device) that are not expected(i) rounded to t's dtype: bit for
// bit when `tolerance` is 0 (-0 is not +0; bf16/f16 compare as their 16-bit words), else within
// that relative difference. The first few are reported on this rank (prefixed with it by
// mpi_main.cpp), naming `what`.
inline int64_t count_wrong(const std::string& what, const Tensor& t,
                           const std::function<double(int64_t)>& expected, double tolerance = 0) {
  return visit_dtype(t.dtype(), [&](auto tag) -> int64_t {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      ADD_FAILURE() << "collective_checks: count_wrong() of a bool tensor";
      return int64_t(1);
    } else {
      std::vector<T> got = t.to_vector<T>();
      int64_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        T want = as<T>(expected(int64_t(i)));
        // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison)
        if (std::memcmp(&got[i], &want, sizeof(T)) == 0) continue;
        const double g = to_double(got[i]), w = to_double(want);
        if (tolerance > 0 && std::fabs(g - w) <= tolerance * std::fabs(w)) continue;
        if (++wrong <= 3)
          ADD_FAILURE() << what << " (" << dtype_name(t.dtype()) << " on " << t.device().str()
                        << ", " << got.size() << " elements): element " << i << " is " << g
                        << ", expected " << w;
      }
      return wrong;
    }
  });
}

// The reduction over `members` (world ranks) of reduce_value(m, i), as the backends compute it:
// exact sum, max, min; avg = f32 sum / group size rounded once (integers: truncating division).
inline double reduced(ReduceOp op, DType dt, const std::vector<int>& members, int64_t i) {
  double sum = 0, max = -1e300, min = 1e300;
  for (int m : members) {
    double v = reduce_value(m, i);
    sum += v;
    max = std::max(max, v);
    min = std::min(min, v);
  }
  const int n = int(members.size());
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kMax:
      return max;
    case ReduceOp::kMin:
      return min;
    case ReduceOp::kAvg:
      return is_floating(dt)
                 ? double(float(sum) / float(n))
                 : double(int64_t(sum) / int64_t(n));  // NOLINT(bugprone-integer-division)
  }
  return 0;
}

inline std::vector<int> all_ranks(int size) {
  std::vector<int> r(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) r[size_t(i)] = i;
  return r;
}

inline std::string name_of(const char* op, DType dt, int64_t n, const std::string& extra = "") {
  std::ostringstream os;
  os << op << " " << dtype_name(dt) << " n=" << n << (extra.empty() ? "" : " ") << extra;
  return os.str();
}

// Sums the wrong-element counts of every rank over the world (a CPU allreduce): the test's
// verdict, the same on all ranks.
inline int64_t total_wrong(int64_t local) {
  Tensor t = Tensor::full({1}, double(local), DType::kI64);
  world()->allreduce_sync(t, ReduceOp::kSum);
  return int64_t(t.item());
}

// all_to_all where rank `from` sends count(from, to) elements to rank `to`, buffers on `device`.
inline int64_t check_all_to_all(Communicator& comm, DType dt, const std::string& what,
                                const std::function<int64_t(int, int)>& count, bool explicit_splits,
                                bool in_place, Device device) {
  const int r = comm.rank(), size = comm.size();
  std::vector<int64_t> in_splits, out_splits;
  std::vector<double> in_values, expected;
  for (int peer = 0; peer < size; ++peer) {
    in_splits.push_back(count(r, peer));
    out_splits.push_back(count(peer, r));
    for (int64_t j = 0; j < count(r, peer); ++j) in_values.push_back(part_value(r, peer, j));
    for (int64_t j = 0; j < count(peer, r); ++j) expected.push_back(part_value(peer, r, j));
  }
  Tensor in = make(
      dt, int64_t(in_values.size()), [&](int64_t i) { return in_values[size_t(i)]; }, device);
  Tensor out = in_place ? in : garbage(dt, int64_t(expected.size()), device);
  AllToAllOptions o;
  if (explicit_splits) o = AllToAllOptions{in_splits, out_splits};
  comm.all_to_all(in, out, o)->wait();
  return count_wrong(what + " " + dtype_name(dt), out,
                     [&](int64_t i) { return expected[size_t(i)]; });
}

// Every all_to_all case on `device`, every dtype: equal splits (implied and given, every size,
// in place), uneven splits with zero-length parts, and a rank that sends nothing. Returns this
// rank's wrong elements.
inline int64_t check_all_to_all_cases(Communicator& comm, Device device) {
  int64_t wrong = 0;
  for (DType dt : kDTypes) {
    for (int64_t n : kSizes) {
      auto equal = [n](int, int) { return n; };
      wrong += check_all_to_all(comm, dt, name_of("all_to_all equal", dt, n), equal, false, false,
                                device);
      wrong += check_all_to_all(comm, dt, name_of("all_to_all equal, splits given", dt, n), equal,
                                true, false, device);
    }
    wrong += check_all_to_all(
        comm, dt, "all_to_all equal in-place n=7", [](int, int) { return 7; }, false, true, device);
    // Uneven, zero-length parts included: 0, 3, 6 or 9 elements per pair.
    wrong += check_all_to_all(
        comm, dt, "all_to_all uneven", [](int from, int to) { return (from + 2 * to) % 4 * 3; },
        true, false, device);
    // Rank 0 sends nothing at all; the others send 0, 1 or 2 elements.
    wrong += check_all_to_all(
        comm, dt, "all_to_all rank 0 sends nothing",
        [](int from, int to) { return from == 0 ? 0 : (from + to) % 3; }, true, false, device);
  }
  return wrong;
}

}  // namespace loom::comm::checks
