// loom-bench-collectives: bandwidth of loom's collectives in the manner of nccl-tests, next to the
// raw MPI call on the same buffers in the same run, so the cost of loom's layer (argument checks,
// Work objects, polling to a deadline, bf16/f16 conversion) reads directly as a ratio.
//
//   mpirun -np 4 build/bin/loom-bench-collectives -b 8 -e 64M -f 4 -n 20 -w 5 -c 1 -o allreduce
//
// Flags are nccl-tests' (-b -e -f -n -w -c) plus -o (the collective) and -d (the dtype). Per size:
// -w warm-up calls, then loom's calls (each waited on) and MPI's in alternating blocks, -n calls
// of each in all, more for small sizes (a block lasts at least a millisecond); each time
// reported is the median of its blocks' per-call times, the max over ranks (See
// alternating()). algbw = size / time and busbw = algbw x the op's factor from
// nccl-tests' doc/PERFORMANCE.md (allreduce 2(n-1)/n; allgather, reduce_scatter, all_to_all
// (n-1)/n; broadcast 1), so busbw is comparable across rank counts. `size` is the largest buffer
// of the call (allgather's output, reduce_scatter's and all_to_all's input) and `count` the
// element count each rank passes per chunk, as in nccl-tests. With -c 1, inputs are rank-derived
// so every output element has a closed-form value, and #wrong counts mismatches over all ranks.
//
// The raw MPI reference is the blocking call (MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Bcast, MPI_Alltoall) on MPI_COMM_WORLD. MPI has no bf16/f16
// type: their reductions use a user-defined MPI_Op that adds in f32 element by element.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/communicator.h"
#include "collectives/hierarchical.h"
#include "core/tensor.h"

namespace {

using loom::DType;
using loom::Tensor;
namespace comm = loom::comm;

// Every MPI call of the benchmark goes through this: a failure names the call and the line.
#define BENCH_MPI_CHECK(call)                                                      \
  do {                                                                             \
    int mpi_rc_ = (call);                                                          \
    LOOM_CHECK(mpi_rc_ == MPI_SUCCESS, #call, " failed with MPI error ", mpi_rc_); \
  } while (0)

// kPingPong: point-to-point, not a collective: ranks 2k and 2k + 1 send each other the buffer
// and back (one call = one round trip, as osu_latency's loop; its latency is half the time).
enum class Op { kAllreduce, kAllgather, kReduceScatter, kBroadcast, kAllToAll, kPingPong };

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllreduce:
      return "allreduce";
    case Op::kAllgather:
      return "allgather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kPingPong:
      return "pingpong";
  }
  return "?";
}

// nccl-tests' bus bandwidth factor: what each rank's link carries relative to the size.
double busbw_factor(Op op, int n) {
  switch (op) {
    case Op::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllgather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
      return double(n - 1) / n;
    case Op::kBroadcast:
    case Op::kPingPong:
      return 1.0;
  }
  return 1.0;
}

struct Options {
  size_t min_bytes = size_t(32) << 20;  // nccl-tests' defaults: one size, 32 MiB
  size_t max_bytes = size_t(32) << 20;
  int64_t step_factor = 2;
  int iters = 20;
  int warmup_iters = 5;
  bool check = true;
  Op op = Op::kAllreduce;
  DType dtype = DType::kF32;
  // -a: how loom's world communicator runs its collectives (Communicator::set_algorithm).
  comm::Algorithm algorithm = comm::Algorithm::kFlat;
};

constexpr const char* kUsage =
    "usage: mpirun -np N loom-bench-collectives [flags]\n"
    "  -b, --minbytes <size>       smallest size (default 32M); sizes take K, M, G (powers of "
    "1024)\n"
    "  -e, --maxbytes <size>       largest size (default 32M)\n"
    "  -f, --stepfactor <int>      multiply the size by this between steps (default 2, >= 2)\n"
    "  -n, --iters <int>           timed iterations per size and side, in min(n, 20) "
    "alternating blocks (default 20; more for small sizes: a block lasts >= 1 ms)\n"
    "  -w, --warmup_iters <int>    untimed iterations before timing (default 5)\n"
    "  -c, --check <0|1>           check every output element (default 1)\n"
    "  -o, --op <name>             allreduce | allgather | reduce_scatter | broadcast | "
    "all_to_all | pingpong (default allreduce; pingpong: ranks 2k, 2k+1 send and send back, "
    "an even rank count)\n"
    "  -d, --datatype <name>       f32 | bf16 | f16 | i32 | i64 (default f32)\n"
    "  -a, --algo <flat|hier|auto> loom's algorithm (Communicator::set_algorithm; default flat; "
    "hier: two levels over the nodes, collectives/hierarchical.h; auto: per call by the cost "
    "table measured at start-up; for allreduce, allgather, reduce_scatter and all_to_all)\n"
    "  -h, --help                  this text\n";

// "64", "64K", "1M", "2G" (powers of 1024) -> bytes.
size_t parse_size(const std::string& flag, const std::string& text) {
  size_t pos = 0;
  unsigned long long value = 0;
  bool ok = !text.empty() && text[0] >= '0' && text[0] <= '9';
  if (ok) {
    try {
      value = std::stoull(text, &pos);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  size_t multiplier = 1;
  if (ok && pos + 1 == text.size()) {
    switch (text[pos]) {
      case 'K':
      case 'k':
        multiplier = size_t(1) << 10;
        break;
      case 'M':
      case 'm':
        multiplier = size_t(1) << 20;
        break;
      case 'G':
      case 'g':
        multiplier = size_t(1) << 30;
        break;
      default:
        ok = false;
    }
  } else if (ok && pos != text.size()) {
    ok = false;
  }
  LOOM_CHECK(ok, flag, ": expected a size in bytes like 8, 64K, 1M or 1G, got '", text, "'");
  LOOM_CHECK(value <= (size_t(1) << 40) / multiplier, flag, ": size '", text,
             "' is too large (limit 1T)");
  return size_t(value) * multiplier;
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value) {
  size_t pos = 0;
  long long value = 0;
  bool ok = !text.empty();
  try {
    value = std::stoll(text, &pos);
  } catch (const std::exception&) {
    ok = false;
  }
  LOOM_CHECK(ok && pos == text.size(), flag, ": expected an integer, got '", text, "'");
  LOOM_CHECK(value >= min_value, flag, ": must be >= ", min_value, ", got ", value);
  return value;
}

Op parse_op(const std::string& text) {
  for (Op op : {Op::kAllreduce, Op::kAllgather, Op::kReduceScatter, Op::kBroadcast, Op::kAllToAll,
                Op::kPingPong})
    if (text == op_name(op)) return op;
  LOOM_FAIL("-o: unknown op '", text,
            "' (expected allreduce, allgather, reduce_scatter, broadcast, all_to_all or "
            "pingpong)");
}

DType parse_dtype_flag(const std::string& text) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64})
    if (text == loom::dtype_name(t)) return t;
  LOOM_FAIL("-d: unknown dtype '", text, "' (expected f32, bf16, f16, i32 or i64)");
}

// Returns false when --help was asked for.
bool parse_options(int argc, char** argv, Options& o) {
  struct Flag {
    const char* short_name;
    const char* long_name;
  };
  static const Flag kFlags[] = {
      {"-b", "--minbytes"}, {"-e", "--maxbytes"},     {"-f", "--stepfactor"},
      {"-n", "--iters"},    {"-w", "--warmup_iters"}, {"-c", "--check"},
      {"-o", "--op"},       {"-d", "--datatype"},     {"-a", "--algo"}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    // "-b 8", "-b8", "--minbytes 8" and "--minbytes=8" all work.
    std::string flag, value;
    bool have_value = false;
    for (const Flag& f : kFlags) {
      std::string s = f.short_name, l = f.long_name;
      if (arg == s || arg == l) {
        flag = s;
      } else if (arg.size() > 2 && arg.compare(0, 2, s) == 0 && arg[1] != '-') {
        flag = s, value = arg.substr(2), have_value = true;
      } else if (arg.compare(0, l.size() + 1, l + "=") == 0) {
        flag = s, value = arg.substr(l.size() + 1), have_value = true;
      }
      if (!flag.empty()) break;
    }
    LOOM_CHECK(!flag.empty(), "unknown flag '", arg, "' (run with -h for the flags)");
    if (!have_value) {
      LOOM_CHECK(i + 1 < argc, flag, ": missing value (run with -h for the flags)");
      value = argv[++i];
    }
    switch (flag[1]) {
      case 'b':
        o.min_bytes = parse_size(flag, value);
        break;
      case 'e':
        o.max_bytes = parse_size(flag, value);
        break;
      case 'f':
        o.step_factor = parse_int(flag, value, 2);
        break;
      case 'n':
        o.iters = int(std::min<int64_t>(parse_int(flag, value, 1), INT_MAX));
        break;
      case 'w':
        o.warmup_iters = int(std::min<int64_t>(parse_int(flag, value, 0), INT_MAX));
        break;
      case 'c': {
        LOOM_CHECK(value == "0" || value == "1", "-c: expected 0 or 1, got '", value, "'");
        o.check = value == "1";
        break;
      }
      case 'o':
        o.op = parse_op(value);
        break;
      case 'd':
        o.dtype = parse_dtype_flag(value);
        break;
      case 'a':
        LOOM_CHECK(value == "flat" || value == "hier" || value == "auto",
                   "-a: expected flat, hier or auto, got '", value, "'");
        o.algorithm = value == "flat"   ? comm::Algorithm::kFlat
                      : value == "hier" ? comm::Algorithm::kHierarchical
                                        : comm::Algorithm::kAuto;
        break;
    }
  }
  LOOM_CHECK(o.min_bytes <= o.max_bytes, "-b ", o.min_bytes, " is larger than -e ", o.max_bytes);
  return true;
}

// ---------------------------------------------------------------- rank-derived data
// Element i of rank r's input: a small integer, exact in every dtype (|v| <= 48), hashed from
// (rank, i) so that a chunk from the wrong rank or at the wrong offset shows.
double input_value(int rank, int64_t i) {
  uint64_t x = uint64_t(i) * 0x9E3779B97F4A7C15ull + uint64_t(rank + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return double(x % 97) - 48;
}

template <typename T>
T from_double(double v) {
  return T(v);
}
template <>
loom::BFloat16 from_double<loom::BFloat16>(double v) {
  return loom::float_to_bf16(float(v));
}
template <>
loom::Float16 from_double<loom::Float16>(double v) {
  return loom::float_to_f16(float(v));
}
double to_double(float v) { return v; }
double to_double(int32_t v) { return v; }
double to_double(int64_t v) { return double(v); }
double to_double(loom::BFloat16 v) { return loom::bf16_to_float(v); }
double to_double(loom::Float16 v) { return loom::f16_to_float(v); }

template <typename F>
void visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(loom::BFloat16{});
    case DType::kF16:
      return f(loom::Float16{});
    case DType::kI32:
      return f(int32_t{});
    case DType::kI64:
      return f(int64_t{});
    default:
      LOOM_FAIL("dtype ", loom::dtype_name(t), " is not benchmarked");
  }
}

// Fills `t` with value(i) for every element i.
template <typename V>
void fill(Tensor& t, V&& value) {
  visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = from_double<T>(value(i));
  });
}

// Elements of `t` that differ from expected(i) as stored in t's dtype (a reduction accumulates
// in f32 and rounds once, so the exact sum rounded to the dtype is the expected value).
template <typename V>
int64_t count_wrong(const Tensor& t, V&& expected) {
  int64_t wrong = 0;
  visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = static_cast<const T*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i)
      wrong += to_double(p[i]) != to_double(from_double<T>(expected(i)));
  });
  return wrong;
}

// ---------------------------------------------------------------- one size
struct Buffers {
  Tensor input;   // unused by broadcast
  Tensor output;  // broadcast's buffer
  int64_t chunk;  // elements each rank passes per chunk (nccl-tests' count column)
  size_t bytes;   // the size column: the largest buffer of the call
};

Buffers make_buffers(Op op, DType dtype, size_t bytes, int n) {
  const int64_t elements = int64_t(bytes / loom::dtype_size(dtype));
  Buffers b;
  switch (op) {
    case Op::kAllreduce:
    case Op::kPingPong:  // input sent, output received
      b.chunk = elements;
      b.input = Tensor::empty({elements}, dtype);
      b.output = Tensor::empty({elements}, dtype);
      break;
    case Op::kBroadcast:  // in place: one buffer
      b.chunk = elements;
      b.output = Tensor::empty({elements}, dtype);
      break;
    case Op::kAllgather:
      b.chunk = elements / n;
      b.input = Tensor::empty({b.chunk}, dtype);
      b.output = Tensor::empty({b.chunk * n}, dtype);
      break;
    case Op::kReduceScatter:
      b.chunk = elements / n;
      b.input = Tensor::empty({b.chunk * n}, dtype);
      b.output = Tensor::empty({b.chunk}, dtype);
      break;
    case Op::kAllToAll:
      b.chunk = elements / n;
      b.input = Tensor::empty({b.chunk * n}, dtype);
      b.output = Tensor::empty({b.chunk * n}, dtype);
      break;
  }
  b.bytes = b.input.defined() ? std::max(b.input.nbytes(), b.output.nbytes()) : b.output.nbytes();
  LOOM_CHECK(b.output.numel() <= INT_MAX && b.chunk * n <= INT_MAX, "size ", bytes,
             ": more than 2^31 - 1 elements, beyond what one MPI call takes");
  return b;
}

// The rank a ping-pong pairs this one with.
int pingpong_peer(int rank) { return rank % 2 == 0 ? rank + 1 : rank - 1; }

comm::WorkPtr run_loom(comm::Communicator& c, Op op, Buffers& b) {
  switch (op) {
    case Op::kPingPong: {  // the even rank sends first; the last step's work is returned
      const int peer = pingpong_peer(c.rank());
      if (c.rank() % 2 == 0) {
        c.send(b.input, peer)->wait();
        return c.recv(b.output, peer);
      }
      c.recv(b.output, peer)->wait();
      return c.send(b.input, peer);
    }
    case Op::kAllreduce:
      return c.allreduce(b.input, b.output);
    case Op::kAllgather:
      return c.allgather(b.input, b.output);
    case Op::kReduceScatter:
      return c.reduce_scatter(b.input, b.output);
    case Op::kBroadcast:
      return c.broadcast(b.output);
    case Op::kAllToAll:
      return c.all_to_all(b.input, b.output);
  }
  return nullptr;
}

// MPI's view of a dtype: bf16/f16 travel as 16-bit words, reduced by a user-defined op.
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const loom::BFloat16*>(in);
  auto* b = static_cast<loom::BFloat16*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = loom::float_to_bf16(loom::bf16_to_float(a[i]) + loom::bf16_to_float(b[i]));
}
void sum_f16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const loom::Float16*>(in);
  auto* b = static_cast<loom::Float16*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = loom::float_to_f16(loom::f16_to_float(a[i]) + loom::f16_to_float(b[i]));
}

struct MpiType {
  MPI_Datatype type;
  MPI_Op sum;
  bool user_op;
};

MpiType mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return {MPI_FLOAT, MPI_SUM, false};
    case DType::kI32:
      return {MPI_INT32_T, MPI_SUM, false};
    case DType::kI64:
      return {MPI_INT64_T, MPI_SUM, false};
    case DType::kBF16:
    case DType::kF16: {
      MPI_Op op;
      BENCH_MPI_CHECK(MPI_Op_create(t == DType::kBF16 ? sum_bf16 : sum_f16, 1, &op));
      return {MPI_UINT16_T, op, true};
    }
    default:
      LOOM_FAIL("dtype ", loom::dtype_name(t), " is not benchmarked");
  }
}

void run_mpi(Op op, const MpiType& t, Buffers& b) {
  const int chunk = int(b.chunk);
  void* in = b.input.defined() ? b.input.data_ptr() : nullptr;
  void* out = b.output.data_ptr();
  switch (op) {
    case Op::kPingPong: {
      int rank = 0;
      BENCH_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
      const int peer = pingpong_peer(rank);
      if (rank % 2 == 0) {
        BENCH_MPI_CHECK(MPI_Send(in, chunk, t.type, peer, 0, MPI_COMM_WORLD));
        BENCH_MPI_CHECK(MPI_Recv(out, chunk, t.type, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      } else {
        BENCH_MPI_CHECK(MPI_Recv(out, chunk, t.type, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        BENCH_MPI_CHECK(MPI_Send(in, chunk, t.type, peer, 0, MPI_COMM_WORLD));
      }
      break;
    }
    case Op::kAllreduce:
      BENCH_MPI_CHECK(MPI_Allreduce(in, out, chunk, t.type, t.sum, MPI_COMM_WORLD));
      break;
    case Op::kAllgather:
      BENCH_MPI_CHECK(MPI_Allgather(in, chunk, t.type, out, chunk, t.type, MPI_COMM_WORLD));
      break;
    case Op::kReduceScatter:
      BENCH_MPI_CHECK(MPI_Reduce_scatter_block(in, out, chunk, t.type, t.sum, MPI_COMM_WORLD));
      break;
    case Op::kBroadcast:
      BENCH_MPI_CHECK(MPI_Bcast(out, chunk, t.type, 0, MPI_COMM_WORLD));
      break;
    case Op::kAllToAll:
      BENCH_MPI_CHECK(MPI_Alltoall(in, chunk, t.type, out, chunk, t.type, MPI_COMM_WORLD));
      break;
  }
}

// Fills the inputs from the rank, runs loom's op once, and returns this rank's wrong elements.
int64_t check_loom(comm::Communicator& c, Op op, Buffers& b) {
  const int r = c.rank(), n = c.size();
  const int64_t m = b.chunk;
  if (op == Op::kBroadcast) {
    fill(b.output, [&](int64_t i) { return input_value(r, i); });
  } else {
    fill(b.input, [&](int64_t i) { return input_value(r, i); });
    fill(b.output, [](int64_t) { return -1000.0; });  // nothing valid is left from before
  }
  run_loom(c, op, b)->wait();
  auto sum_over_ranks = [n](int64_t i) {
    double s = 0;
    for (int q = 0; q < n; ++q) s += input_value(q, i);
    return s;
  };
  switch (op) {
    case Op::kPingPong:  // the peer's input
      return count_wrong(b.output, [&](int64_t i) { return input_value(pingpong_peer(r), i); });
    case Op::kAllreduce:
      return count_wrong(b.output, sum_over_ranks);
    case Op::kReduceScatter:
      return count_wrong(b.output, [&](int64_t k) { return sum_over_ranks(r * m + k); });
    case Op::kAllgather:
      return count_wrong(b.output, [&](int64_t i) { return input_value(int(i / m), i % m); });
    case Op::kBroadcast:
      return count_wrong(b.output, [](int64_t i) { return input_value(0, i); });
    case Op::kAllToAll:
      // Chunk s of the output is chunk r of rank s's input.
      return count_wrong(b.output,
                         [&](int64_t i) { return input_value(int(i / m), r * m + i % m); });
  }
  return 0;
}

using Clock = std::chrono::steady_clock;

// Measures two ways of doing something side by side (loom and raw MPI; the check on and off):
// blocks of calls alternate (a, b, b, a, ...: a linear drift of the machine hits both alike), and
// each side's time is the median of its blocks' per-call times, the max over ranks. Separate
// loops, as before, left the ratio at the mercy of this VM's loop-to-loop drift (the raw MPI
// time of a 1 KiB allreduce moved 1.6 -> 2.9 us between two runs minutes apart).
struct AB {
  double a, b;
};
constexpr int kMaxBlocks = 20;             // of each side: -n when fewer
constexpr double kMinBlockSeconds = 1e-3;  // see calls_per_block
constexpr int kMaxCallsPerBlock = 100000;

int blocks_per_side(const Options& o) { return std::min(o.iters, kMaxBlocks); }

// Calls per block: -n spread over the blocks (at most kMaxBlocks a side), raised so that a block
// lasts at least kMinBlockSeconds (a few microseconds per call would drown in the clock's and the
// barrier's noise otherwise, as OSU's benchmarks raise their iterations for small messages); the
// same on every rank. Runs the -w warm-up calls (at least one).
template <typename F>
int calls_per_block(const Options& o, F&& call) {
  const int warmup = std::max(1, o.warmup_iters);
  BENCH_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const auto start = Clock::now();
  for (int i = 0; i < warmup; ++i) call();
  const double per_call = std::chrono::duration<double>(Clock::now() - start).count() / warmup;
  int calls = std::max(1, o.iters / blocks_per_side(o));
  if (per_call * calls < kMinBlockSeconds)
    calls = int(std::min<double>(kMaxCallsPerBlock, std::ceil(kMinBlockSeconds / per_call)));
  BENCH_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &calls, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return calls;
}

// `side(true)` before each block of `a`, `side(false)` before each of `b`.
template <typename Side, typename A, typename B>
AB alternating(const Options& o, int per_block, Side&& side, A&& a, B&& b) {
  std::vector<double> times[2];
  for (int block = 0; block < 2 * blocks_per_side(o); ++block) {
    const bool is_a = (block % 4 == 0) || (block % 4 == 3);
    side(is_a);
    for (int i = 0; i < std::min(per_block, o.warmup_iters); ++i) is_a ? a() : b();
    BENCH_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const auto start = Clock::now();
    for (int i = 0; i < per_block; ++i) is_a ? a() : b();
    times[is_a ? 0 : 1].push_back(std::chrono::duration<double>(Clock::now() - start).count() /
                                  per_block);
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  double out[2] = {median(times[0]), median(times[1])};
  BENCH_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, out, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return {out[0], out[1]};
}

constexpr size_t kSummaryMinBytes = size_t(1) << 20;  // the closing averages: sizes >= 1 MiB

int run(const Options& o) {
  auto world = comm::world("mpi");
  comm::Communicator& c = *world;
  const int n = c.size();
  const bool root = c.rank() == 0;
  LOOM_CHECK(o.op != Op::kPingPong || n % 2 == 0,
             "-o pingpong pairs ranks 2k and 2k + 1: it "
             "needs an even number of ranks, got ",
             n);
  const MpiType mpi = mpi_type(o.dtype);
  const double factor = busbw_factor(o.op, n);
  if (o.algorithm != comm::Algorithm::kFlat) {
    LOOM_CHECK(o.op == Op::kAllreduce || o.op == Op::kAllgather || o.op == Op::kReduceScatter ||
                   o.op == Op::kAllToAll,
               "-a ", comm::algorithm_name(o.algorithm),
               ": only allreduce, allgather, reduce_scatter and all_to_all have a hierarchical "
               "form");
    c.set_algorithm(o.algorithm);
    LOOM_CHECK(c.hierarchy()->applies(), "-a ", comm::algorithm_name(o.algorithm),
               ": the ranks are ", c.hierarchy()->str(),
               "; launch on several nodes with the same number of ranks on each");
  }
  const std::string algorithm = c.algorithm_str();

  if (root) {
    std::printf(
        "# loom-bench-collectives: %s, %s, %d ranks (loom backend %s), minBytes %zu "
        "maxBytes %zu step: %lld(factor) warmup iters: %d iters: %d validation: %d, algorithm: "
        "%s\n",
        op_name(o.op), loom::dtype_name(o.dtype), n, c.backend(), o.min_bytes, o.max_bytes,
        (long long)o.step_factor, o.warmup_iters, o.iters, int(o.check), algorithm.c_str());
    std::printf(
        "# time, mpi_time: per call, medians over %d alternating blocks each of loom's call "
        "and MPI's (max over ranks); busbw = algbw x %.4f; ratio = loom busbw / MPI busbw; "
        "unchecked, check: the same over alternating blocks of loom's calls with the collective "
        "signature check (on by default) off (set_debug(false)) and on: the time without it, "
        "and on minus off, same buffers\n",
        blocks_per_side(o), factor);
    std::printf("#\n");
    std::printf("# %10s  %12s  %6s  %9s  %7s  %7s  %6s  %9s  %9s  %6s  %9s  %9s\n", "size", "count",
                "type", "time", "algbw", "busbw", "#wrong", "mpi_time", "mpi_busbw", "ratio",
                "unchecked", "check");
    std::printf("# %10s  %12s  %6s  %9s  %7s  %7s  %6s  %9s  %9s  %6s  %9s  %9s\n", "(B)",
                "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "", "(us)",
                "(us)");
    std::fflush(stdout);
  }

  int64_t total_wrong = 0;
  double sum_busbw = 0, sum_mpi_busbw = 0, sum_ratio = 0;
  int summary_sizes = 0;
  size_t last_bytes = SIZE_MAX;
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = bytes == 0 ? 1 : bytes * size_t(o.step_factor)) {
    Buffers b = make_buffers(o.op, o.dtype, bytes, n);
    if (b.bytes == last_bytes) continue;  // rounded to the same buffer as the previous size
    last_bytes = b.bytes;
    long long wrong = -1;
    if (o.check) {
      wrong = check_loom(c, o.op, b);
      BENCH_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
      total_wrong += wrong;
    } else {
      fill(b.input.defined() ? b.input : b.output, [&](int64_t i) { return input_value(0, i); });
    }
    auto loom_call = [&] { run_loom(c, o.op, b)->wait(); };
    const int per_block = calls_per_block(o, loom_call);
    const AB vs_mpi = alternating(
        o, per_block, [](bool) {}, loom_call, [&] { run_mpi(o.op, mpi, b); });
    const double t = vs_mpi.a, mpi_t = vs_mpi.b;
    // The signature check's cost: the same calls with it on (a) and off (b).
    const bool checked = c.debug();
    const AB ab = alternating(
        o, per_block, [&](bool on) { c.set_debug(on); }, loom_call, loom_call);
    c.set_debug(checked);
    const double unchecked_t = ab.b;

    const double algbw = double(b.bytes) / t / 1e9, busbw = algbw * factor;
    const double mpi_busbw = double(b.bytes) / mpi_t / 1e9 * factor;
    const double ratio = mpi_t / t;  // = busbw / mpi_busbw, and defined at size 0 too
    if (b.bytes >= kSummaryMinBytes) {
      sum_busbw += busbw, sum_mpi_busbw += mpi_busbw, sum_ratio += ratio;
      ++summary_sizes;
    }
    if (root) {
      char wrong_text[32];
      if (o.check)
        std::snprintf(wrong_text, sizeof wrong_text, "%lld", wrong);
      else
        std::snprintf(wrong_text, sizeof wrong_text, "N/A");
      std::printf(
          "  %10zu  %12lld  %6s  %9.2f  %7.2f  %7.2f  %6s  %9.2f  %9.2f  %6.3f  %9.2f  %9.2f\n",
          b.bytes, (long long)b.chunk, loom::dtype_name(o.dtype), t * 1e6, algbw, busbw, wrong_text,
          mpi_t * 1e6, mpi_busbw, ratio, unchecked_t * 1e6, (ab.a - ab.b) * 1e6);
      std::fflush(stdout);
    }
    if (bytes > o.max_bytes / size_t(o.step_factor)) break;  // the next step would pass -e
  }

  if (root) {
    if (o.check)
      std::printf("# Out of bounds values : %lld %s\n", (long long)total_wrong,
                  total_wrong == 0 ? "OK" : "FAILED");
    if (summary_sizes > 0)
      std::printf(
          "# Avg bus bandwidth (sizes >= 1 MiB, %d sizes): loom %.3f GB/s, MPI %.3f GB/s, "
          "avg ratio %.3f\n",
          summary_sizes, sum_busbw / summary_sizes, sum_mpi_busbw / summary_sizes,
          sum_ratio / summary_sizes);
    else
      std::printf("# Avg bus bandwidth: no size >= 1 MiB was run\n");
    std::printf("#\n");
    std::fflush(stdout);
  }
  if (mpi.user_op) {
    MPI_Op op = mpi.sum;
    BENCH_MPI_CHECK(MPI_Op_free(&op));
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    if (!parse_options(argc, argv, options)) {
      if (loom::error_rank() == 0) std::fputs(kUsage, stdout);
      return 0;
    }
  } catch (const loom::Error& e) {
    // Every rank parses the same flags; one message is enough.
    if (loom::error_rank() == 0) std::fprintf(stderr, "loom-bench-collectives: %s\n", e.what());
    return 1;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {
    // A failure after MPI started may leave the other ranks inside a collective: abort them all.
    std::fprintf(stderr, "loom-bench-collectives: %s\n", e.what());
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
