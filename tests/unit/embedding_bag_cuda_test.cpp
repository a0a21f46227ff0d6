// The CUDA table-batched embedding-bag kernels against their CPU twins
// (kernels/cpu/embedding_bag.h, themselves tested against a naive reference in
// embedding_bag_kernel_test.cpp): the same random batches (fixed seeds) through both, every output
// compared element by element. Skips without a GPU, and when loom was built without CUDA.
//
// Tolerance. Both sides read the same stored weights (bf16 / f16 converted exactly to f32) and
// differ only in the order of f32 additions, so every sum is compared with 1e-5 times the sum of
// |terms| that make it (the CPU kernel run on |inputs|), for every dtype. Weights updated in place
// are compared with 1e-5 (f32) or 1e-2 (bf16 / f16: a one-unit difference before the single
// rounding may move the stored value by one bf16 step) times (1 + |value|). Integers (error
// reports, counts, sparse ids) and bit-for-bit determinism are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "kernels/cpu/embedding_bag.h"
#include "kernels/cuda/runtime.h"
#include "kernels/numeric.h"
#include "testing/device_buffer.h"
#include "testing/embedding_bag_cases.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/embedding_bag.h"
#endif

namespace loom::kernels {
namespace {

#if !LOOM_WITH_CUDA

TEST(EmbeddingBagCuda, NeedsCuda) {
  GTEST_SKIP() << "loom was built without CUDA (LOOM_WITH_CUDA=0): no CUDA kernels to test";
}

#else

using Kind = EmbeddingBagErrorKind;
using namespace ::loom::kernels::testing;  // Case, random_case, ... (shared with the CPU test)
constexpr cuda::Stream kStream = nullptr;  // the legacy default stream: ordered with the copies
constexpr double kRtol = 1e-5;

// ---------------------------------------------------------------- device memory

using Buffer = ::loom::testing::DeviceBuffer;

// ---------------------------------------------------------------- batches

// Replaces about a quarter of the indices by negative or too-large ones; returns how many.
int64_t spoil_indices(Case& c, uint64_t seed) {
  std::mt19937_64 gen(seed);
  int64_t bad = 0;
  for (int64_t& idx : c.indices)
    if (gen() % 4 == 0) {
      idx = gen() % 2 ? -1 - int64_t(gen() % 5) : 1000 + int64_t(gen() % 5);
      ++bad;
    }
  return bad;
}

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// A case's tables and lookups in device memory (tables' arrays included).
template <typename I>
struct DeviceCase {
  Buffer rows, dims, weight_offsets, row_offsets, dim_offsets, weights, indices, offsets, psw;
  EmbeddingTables tables;
  EmbeddingBagIndices<I> view;
  cuda::EmbeddingTablesInfo info;

  explicit DeviceCase(const Case& c)
      : rows(c.rows),
        dims(c.dims),
        weight_offsets(c.weight_offsets),
        row_offsets(c.row_offsets),
        dim_offsets(c.dim_offsets),
        weights(c.weight_bytes()),
        indices(std::vector<I>(c.indices.begin(), c.indices.end())),
        offsets(std::vector<I>(c.offsets.begin(), c.offsets.end())),
        psw(c.psw) {
    tables.num_tables = c.num_tables;
    tables.rows = rows.as<int64_t>();
    tables.dims = dims.as<int64_t>();
    tables.weight_offsets = weight_offsets.as<int64_t>();
    tables.row_offsets = row_offsets.as<int64_t>();
    tables.dim_offsets = dim_offsets.as<int64_t>();
    tables.dtype = c.dtype;
    view.batch_size = c.batch;
    view.indices = indices.as<I>();
    view.num_indices = int64_t(c.indices.size());
    view.offsets = offsets.as<I>();
    view.num_offsets = int64_t(c.offsets.size());
    view.per_sample_weights = c.psw.empty() ? nullptr : psw.as<float>();
    view.num_per_sample_weights = int64_t(c.psw.size());
    info = cuda::embedding_tables_info(c.num_tables, c.rows.data(), c.dims.data());
  }
  void* weight_ptr() const { return weights.as<void>(); }
  template <typename T>
  std::vector<T> read_weights(size_t n) const {
    return weights.read<T>(n);
  }
  Buffer workspace() const {
    return Buffer(cuda::embedding_bag_backward_workspace_bytes(tables, info, view));
  }
};

// ---------------------------------------------------------------- running both sides

// Everything the forward and the gradient backwards produce for one batch and output gradient.
struct Results {
  std::vector<float> out;
  int64_t bad = 0;
  std::vector<float> grad;  // dense, the weights' layout (table blocks only are defined)
  std::vector<float> gpsw;  // kSum only
  int64_t unique = 0;
  std::vector<int64_t> sp_tables, sp_rows, sp_offsets;
  std::vector<float> sp_values;
};

bool pooled_sum(const Case& c) { return c.opt.pooling == EmbeddingPooling::kSum; }

// The lookups' rows laid end to end: the unpooled output's size, and the capacity the sparse
// gradient's values need under every pooling (one row per unique row at most).
size_t packed_size(const Case& c) {
  Lookups<int64_t> l(c);
  return size_t(cpu::embedding_bag_packed_size(c.tables(), l.view));
}

size_t out_size(const Case& c) {
  return c.opt.pooling == EmbeddingPooling::kNone ? packed_size(c)
                                                  : size_t(c.batch * c.dim_offsets.back());
}

template <typename I>
Results run_cpu(Case c, const std::vector<float>& dout) {
  Lookups<I> l(c);
  Results r;
  r.out.assign(out_size(c), 0.0f);
  r.bad = cpu::embedding_bag_forward(c.tables(), c.weight_ptr(), l.view, r.out.data(), c.opt);
  r.grad.assign(c.weights.size(), 0.0f);
  r.gpsw.assign(c.indices.size(), 0.0f);
  float* gpsw = pooled_sum(c) ? r.gpsw.data() : nullptr;
  cpu::embedding_bag_backward_dense(c.tables(), c.weight_ptr(), l.view, dout.data(), r.grad.data(),
                                    gpsw, c.opt);
  const size_t n = c.indices.size();
  r.sp_tables.assign(n, 0);
  r.sp_rows.assign(n, 0);
  r.sp_offsets.assign(n + 1, 0);
  r.sp_values.assign(packed_size(c), 0.0f);  // not out_size: a pooled output can be smaller
  EmbeddingSparseGrad sparse{r.sp_tables.data(), r.sp_rows.data(), r.sp_offsets.data(),
                             r.sp_values.data()};
  r.unique = cpu::embedding_bag_backward_sparse(c.tables(), c.weight_ptr(), l.view, dout.data(),
                                                sparse, nullptr, c.opt);
  return r;
}

// info_override: run with these table facts instead of the exact ones (e.g. unknown).
template <typename I>
Results run_gpu(const Case& c, const std::vector<float>& dout,
                const cuda::EmbeddingTablesInfo* info_override = nullptr) {
  DeviceCase<I> d(c);
  if (info_override) d.info = *info_override;
  const size_t n = c.indices.size(), outs = out_size(c);
  {
    Lookups<I> l(c);
    EXPECT_EQ(cuda::embedding_bag_packed_size(d.tables, d.view, kStream),
              cpu::embedding_bag_packed_size(c.tables(), l.view));
  }
  Results r;
  Buffer out(outs * sizeof(float)), count(sizeof(int64_t));
  out.poison();
  count.poison();
  cuda::embedding_bag_forward(d.tables, d.info, d.weight_ptr(), d.view, out.as<float>(),
                              count.as<int64_t>(), c.opt, kStream);
  r.out = out.read<float>(outs);
  r.bad = count.read<int64_t>(1)[0];

  Buffer workspace = d.workspace(), ddout(dout);
  Buffer grad(c.weights.size() * sizeof(float)), gpsw(n * sizeof(float));
  grad.poison();
  gpsw.poison();
  float* gpsw_ptr = pooled_sum(c) ? gpsw.as<float>() : nullptr;
  cuda::embedding_bag_backward_dense(d.tables, d.info, d.weight_ptr(), d.view, ddout.as<float>(),
                                     grad.as<float>(), gpsw_ptr, c.opt, workspace.as<void>(),
                                     workspace.bytes(), kStream);
  r.grad = grad.read<float>(c.weights.size());
  r.gpsw = pooled_sum(c) ? gpsw.read<float>(n) : std::vector<float>(n, 0.0f);

  const size_t capacity = packed_size(c);
  Buffer tables(n * 8), rows(n * 8), voff((n + 1) * 8), values(capacity * sizeof(float)), unique(8);
  tables.poison();
  rows.poison();
  voff.poison();
  values.poison();
  unique.poison();
  EmbeddingSparseGrad sparse{tables.as<int64_t>(), rows.as<int64_t>(), voff.as<int64_t>(),
                             values.as<float>()};
  cuda::embedding_bag_backward_sparse(d.tables, d.info, d.weight_ptr(), d.view, ddout.as<float>(),
                                      sparse, unique.as<int64_t>(), nullptr, c.opt,
                                      workspace.as<void>(), workspace.bytes(), kStream);
  r.unique = unique.read<int64_t>(1)[0];
  r.sp_tables = tables.read<int64_t>(n);
  r.sp_rows = rows.read<int64_t>(n);
  r.sp_offsets = voff.read<int64_t>(n + 1);
  r.sp_values = values.read<float>(capacity);
  cuda_rt::synchronize(0);
  return r;
}

// |got - want| <= tol * (scale + 1e-6) over [begin, end); reports the first few that are not.
int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<float>& scale, size_t begin, size_t end,
                         const std::string& what) {
  int64_t bad = 0;
  for (size_t i = begin; i < end; ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    if (!(diff <= kRtol * (double(scale[i]) + 1e-6)) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << got[i] << ", cpu " << want[i] << " (scale "
                    << scale[i] << ")";
  }
  return bad;
}
int64_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<float>& scale, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 1;
  return count_mismatches(got, want, scale, 0, got.size(), what);
}

// With LOOM_TEST_PROGRESS set, each case's label as it starts: a case that hangs on a GPU is
// then named by the last line (gtest prints a failing case's label only once it returns).
void announce(const std::string& label) {
  if (std::getenv("LOOM_TEST_PROGRESS")) std::fprintf(stderr, "[ case     ] %s\n", label.c_str());
}

// Every output of the CUDA kernels against the CPU's on batch c, index type I.
template <typename I>
void expect_matches_cpu(const Case& c, const std::string& label,
                        const cuda::EmbeddingTablesInfo* info_override = nullptr) {
  SCOPED_TRACE(label);
  announce(label);
  {
    Lookups<I> l(c);
    ASSERT_TRUE(cpu::validate_embedding_bag(c.tables(), l.view, c.opt).ok());
  }
  const std::vector<float> dout = random_floats(out_size(c), 99);
  const Results cpu = run_cpu<I>(c, dout);
  const Results mag = run_cpu<I>(c.absolute(), absolute(dout));
  const Results gpu = run_gpu<I>(c, dout, info_override);

  EXPECT_EQ(count_mismatches(gpu.out, cpu.out, mag.out, "out"), 0);
  EXPECT_EQ(gpu.bad, cpu.bad) << "bad indices met";
  for (const auto& [begin, end] : c.blocks())
    EXPECT_EQ(count_mismatches(gpu.grad, cpu.grad, mag.grad, begin, end, "dense grad"), 0);
  if (pooled_sum(c)) {
    EXPECT_EQ(count_mismatches(gpu.gpsw, cpu.gpsw, mag.gpsw, "psw grad"), 0);
  }

  ASSERT_EQ(gpu.unique, cpu.unique) << "unique rows";
  const size_t u = size_t(cpu.unique);
  for (size_t k = 0; k < u; ++k) {
    ASSERT_EQ(gpu.sp_tables[k], cpu.sp_tables[k]) << "sparse id " << k;
    ASSERT_EQ(gpu.sp_rows[k], cpu.sp_rows[k]) << "sparse id " << k;
  }
  for (size_t k = 0; k <= u; ++k) ASSERT_EQ(gpu.sp_offsets[k], cpu.sp_offsets[k]) << k;
  EXPECT_EQ(count_mismatches(gpu.sp_values, cpu.sp_values, mag.sp_values, 0,
                             size_t(cpu.sp_offsets[u]), "sparse values"),
            0);
}

// ---------------------------------------------------------------- forward and gradients

TEST(EmbeddingBagCuda, RandomConfigurationsMatchCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  // Widest dims of 4, 16, 32, 64 and 160 columns pick every group size (4..32 lanes) for f32 and
  // 16-bit rows; 680 needs more than one pass over a bag or a row.
  const int64_t widths[] = {1, 4, 8, 16, 40, 170};
  uint64_t seed = 1000;
  for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBF16, EmbeddingDType::kF16})
    for (EmbeddingPooling pooling :
         {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone})
      for (bool weighted : {false, true}) {
        if (weighted && pooling != EmbeddingPooling::kSum) continue;
        for (int64_t width : widths) {
          CaseSpec spec;
          spec.dtype = dtype;
          spec.pooling = pooling;
          spec.weighted = weighted;
          spec.max_dim4 = width;
          const Case c = random_case(spec, ++seed);
          const std::string label = std::string(dtype_name(dtype)) + " " + pooling_name(pooling) +
                                    (weighted ? " weighted" : "") +
                                    " dims<=" + std::to_string(4 * width) + " seed " +
                                    std::to_string(seed);
          if (seed % 2 == 0)
            expect_matches_cpu<int32_t>(c, label + " int32");
          else
            expect_matches_cpu<int64_t>(c, label + " int64");
        }
      }
}

TEST(EmbeddingBagCuda, LargeBatchWithLongSegments) {
  LOOM_SKIP_WITHOUT_CUDA();
  // 3 tables x 600 bags x up to 50 lookups into few rows: many segments longer than a group's
  // share (block-per-segment path) and grids of many blocks.
  CaseSpec spec;
  spec.min_tables = spec.max_tables = 3;
  spec.min_batch = spec.max_batch = 600;
  spec.max_bag = 50;
  spec.max_rows = 300;
  spec.max_dim4 = 40;
  spec.empty_bag = 0.05;
  spec.weighted = true;
  for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBF16}) {
    spec.dtype = dtype;
    const Case c = random_case(spec, 4242);
    expect_matches_cpu<int64_t>(c, std::string("large int64 ") + dtype_name(dtype));
    expect_matches_cpu<int32_t>(c, std::string("large int32 ") + dtype_name(dtype));
  }
  spec.pooling = EmbeddingPooling::kMean;
  spec.weighted = false;
  spec.max_dim4 = 170;
  expect_matches_cpu<int32_t>(random_case(spec, 4343), "large mean, wide");
}

TEST(EmbeddingBagCuda, UnknownTableInfoStillMatches) {
  LOOM_SKIP_WITHOUT_CUDA();
  // max_dim unknown: a warp per bag or row; total_rows unknown: all 64 key bits sorted.
  const cuda::EmbeddingTablesInfo unknown;
  uint64_t seed = 2000;
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kNone}) {
    CaseSpec spec;
    spec.pooling = pooling;
    spec.max_dim4 = 4;
    spec.weighted = pooling == EmbeddingPooling::kSum;
    expect_matches_cpu<int64_t>(random_case(spec, ++seed), "unknown info", &unknown);
  }
}

TEST(EmbeddingBagCuda, EmptyBatches) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (EmbeddingPooling pooling :
       {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone}) {
    CaseSpec spec;
    spec.pooling = pooling;
    spec.empty_bag = 1.0;  // every bag empty: no lookups at all
    Case c = random_case(spec, 77);
    ASSERT_TRUE(c.indices.empty());
    expect_matches_cpu<int32_t>(c, std::string("all bags empty, ") + pooling_name(pooling));
    c.batch = 0;  // no bags at all
    c.offsets = {0};
    expect_matches_cpu<int64_t>(c, std::string("no bags, ") + pooling_name(pooling));
  }
}

// ---------------------------------------------------------------- bounds-check modes

TEST(EmbeddingBagCuda, WarnAndSkipModesMatchCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  uint64_t seed = 3000;
  for (EmbeddingBoundsCheck mode : {EmbeddingBoundsCheck::kWarn, EmbeddingBoundsCheck::kSkip})
    for (EmbeddingPooling pooling :
         {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone})
      for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kF16}) {
        CaseSpec spec;
        spec.pooling = pooling;
        spec.dtype = dtype;
        spec.weighted = pooling == EmbeddingPooling::kSum;
        Case c = random_case(spec, ++seed);
        c.opt.bounds_check = mode;
        ASSERT_GT(spoil_indices(c, seed), 0);
        const std::string label =
            std::string(mode == EmbeddingBoundsCheck::kWarn ? "warn " : "skip ") +
            pooling_name(pooling) + " " + dtype_name(dtype);
        expect_matches_cpu<int32_t>(c, label + " int32");
        expect_matches_cpu<int64_t>(c, label + " int64");
        // A table without rows: warn has no row 0 to read, so its lookups are skipped too.
        Case z = c;
        const int64_t t = z.num_tables - 1;
        z.row_offsets.back() -= z.rows[size_t(t)];
        z.rows[size_t(t)] = 0;
        expect_matches_cpu<int64_t>(z, label + " with an empty table");
      }
}

// ---------------------------------------------------------------- validation

// A fixed shape for error positions (the CPU test's): 3 tables, B = 2, bags of 2 lookups.
std::string describe(const EmbeddingBagError& e) {
  return std::string(embedding_bag_error_name(e.kind)) + " table " + std::to_string(e.table) +
         " bag " + std::to_string(e.bag) + " position " + std::to_string(e.position) + " value " +
         std::to_string(e.value) + " expected " + std::to_string(e.expected);
}

// The device's report equals the CPU's, field by field; returns it.
template <typename I>
EmbeddingBagError expect_same_error(const Case& c, const std::string& label) {
  SCOPED_TRACE(label);
  Lookups<I> l(c);
  const EmbeddingBagError want = cpu::validate_embedding_bag(c.tables(), l.view, c.opt);
  DeviceCase<I> d(c);
  Buffer slot(sizeof(EmbeddingBagError));
  slot.poison();
  cuda::validate_embedding_bag(d.tables, d.view, c.opt, slot.as<EmbeddingBagError>(), kStream);
  EmbeddingBagError got;
  cuda_rt::copy_device_to_host(0, &got, slot.as<void>(), sizeof(got));
  EXPECT_EQ(int(got.kind), int(want.kind))
      << "cuda: " << describe(got) << "; cpu: " << describe(want);
  EXPECT_EQ(got.table, want.table) << describe(got);
  EXPECT_EQ(got.bag, want.bag) << describe(got);
  EXPECT_EQ(got.position, want.position) << describe(got);
  EXPECT_EQ(got.value, want.value) << describe(got);
  EXPECT_EQ(got.expected, want.expected) << describe(got);
  return got;
}

template <typename I>
void check_validation() {
  auto expect_kind = [](const Case& c, Kind kind, const std::string& label) {
    EXPECT_EQ(int(expect_same_error<I>(c, label).kind), int(kind)) << label;
  };
  expect_kind(small_case(), Kind::kNone, "valid");
  {
    Case c = small_case();
    c.indices[7] = -3;
    c.indices[9] = -1;  // a later one is not reported
    expect_kind(c, Kind::kNegativeIndex, "negative index");
  }
  {
    Case c = small_case();
    c.indices[10] = 7;
    c.indices[3] = 6;  // table 0 has 5 rows: the lower position wins
    expect_kind(c, Kind::kIndexOutOfRange, "index >= rows in two tables");
  }
  {
    Case c = small_case();
    c.indices[5] = 6;
    c.offsets = {0, 2, 4, 4, 8, 10, 12};  // the bag is found past an empty bag
    expect_kind(c, Kind::kIndexOutOfRange, "index past an empty bag");
  }
  {
    Case c = small_case();
    c.offsets[3] = 1;
    c.indices[0] = -1;  // offsets are checked before indices
    expect_kind(c, Kind::kDecreasingOffsets, "decreasing offsets");
  }
  {
    Case c = small_case();
    c.offsets = {0, 2, 1, 6, 5, 10, 12};  // the first decrease is reported
    expect_kind(c, Kind::kDecreasingOffsets, "two decreases");
  }
  {
    Case c = small_case();
    c.offsets.back() = 11;
    expect_kind(c, Kind::kLastOffsetMismatch, "last offset");
  }
  {
    Case c = small_case();
    c.offsets[0] = 1;
    expect_kind(c, Kind::kFirstOffsetNotZero, "first offset");
  }
  {
    Case c = small_case();
    c.offsets.pop_back();
    expect_kind(c, Kind::kWrongLength, "offsets length");
  }
  {
    Case c = small_case();
    c.psw.assign(11, 1.0f);
    expect_kind(c, Kind::kWrongLength, "weights length");
  }
  {
    Case c = small_case();
    c.psw.assign(12, 1.0f);
    c.opt.pooling = EmbeddingPooling::kMean;
    expect_kind(c, Kind::kWeightsNeedSum, "weights with mean");
  }
  {
    Case c = small_case();
    c.dims[2] = 6;
    c.rows[1] = -1;        // table 1 comes first
    c.offsets.pop_back();  // table configs are checked before lengths
    expect_kind(c, Kind::kBadTable, "bad tables");
  }
  {
    Case c = small_case();
    c.dims[1] = 0;
    expect_kind(c, Kind::kBadTable, "zero dim");
  }
  {
    Case c = small_case();
    c.indices[3] = 99;
    for (EmbeddingBoundsCheck mode : {EmbeddingBoundsCheck::kWarn, EmbeddingBoundsCheck::kSkip}) {
      c.opt.bounds_check = mode;
      expect_kind(c, Kind::kNone, "bad index in warn / skip");
      Case d = c;
      d.offsets[2] = 5;
      d.offsets[3] = 4;
      expect_kind(d, Kind::kDecreasingOffsets, "offsets in warn / skip");
    }
  }
  // Random batches with a few bad indices anywhere.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CaseSpec spec;
    spec.max_batch = 40;
    Case c = random_case(spec, 5000 + seed);
    std::mt19937_64 gen(seed);
    for (int i = 0; i < 3 && !c.indices.empty(); ++i)
      c.indices[size_t(gen() % c.indices.size())] = gen() % 2 ? -7 : 1 << 20;
    expect_same_error<I>(c, "random bad indices, seed " + std::to_string(seed));
  }
}

TEST(EmbeddingBagCuda, ValidationReportsTheCpusFirstBadEntry) {
  LOOM_SKIP_WITHOUT_CUDA();
  check_validation<int32_t>();
  check_validation<int64_t>();
}

// ---------------------------------------------------------------- fused optimizers

// Weights and state after one fused update.
struct Updated {
  std::vector<float> weights;  // as stored, in f32
  std::vector<float> m1, m2, gpsw;
};

Updated stored_weights(const Case& c) {
  Updated u;
  for (size_t e = 0; e < c.weights.size(); ++e) u.weights.push_back(c.stored(e));
  return u;
}

// The initial optimizer state of a case: Adagrad's >= 0 per row, Adam's m and v (v >= 0).
std::pair<std::vector<float>, std::vector<float> > initial_state(const Case& c, bool adam,
                                                                 uint64_t seed) {
  std::vector<float> m1 = random_floats(size_t(adam ? c.weight_elems() : c.total_rows()), seed);
  std::vector<float> m2 = random_floats(size_t(c.weight_elems()), seed + 1);
  for (float& x : m2) x = x * x;
  if (!adam)
    for (float& x : m1) x = std::fabs(x);
  return {m1, m2};
}

template <typename I>
Updated update_cpu(Case c, const std::vector<float>& dout, const EmbeddingOptimizerHyper& h,
                   uint64_t seed) {
  const bool adam = h.kind == EmbeddingOptimizer::kAdam;
  auto [m1, m2] = initial_state(c, adam, seed);
  Lookups<I> l(c);
  std::vector<float> gpsw(c.indices.size(), 0.0f);
  EmbeddingOptimizerState state{m1.data(), adam ? m2.data() : nullptr};
  cpu::embedding_bag_backward_fused(c.tables(), c.weight_ptr(), l.view, dout.data(), h, state,
                                    pooled_sum(c) ? gpsw.data() : nullptr, c.opt);
  Updated u = stored_weights(c);
  u.m1 = m1;
  u.m2 = adam ? m2 : std::vector<float>();
  u.gpsw = gpsw;
  return u;
}

template <typename I>
Updated update_gpu(const Case& c, const std::vector<float>& dout, const EmbeddingOptimizerHyper& h,
                   uint64_t seed) {
  const bool adam = h.kind == EmbeddingOptimizer::kAdam;
  auto [m1, m2] = initial_state(c, adam, seed);
  DeviceCase<I> d(c);
  Buffer workspace = d.workspace(), ddout(dout), dm1(m1), dm2(m2);
  Buffer gpsw(c.indices.size() * sizeof(float));
  gpsw.poison();
  EmbeddingOptimizerState state{dm1.as<float>(), adam ? dm2.as<float>() : nullptr};
  cuda::embedding_bag_backward_fused(d.tables, d.info, d.weight_ptr(), d.view, ddout.as<float>(), h,
                                     state, pooled_sum(c) ? gpsw.as<float>() : nullptr, c.opt,
                                     workspace.as<void>(), workspace.bytes(), kStream);
  Case after = c;
  if (c.half())
    after.weights16 = d.template read_weights<uint16_t>(c.weights.size());
  else
    after.weights = d.template read_weights<float>(c.weights.size());
  Updated u = stored_weights(after);
  u.m1 = dm1.read<float>(m1.size());
  u.m2 = adam ? dm2.read<float>(m2.size()) : std::vector<float>();
  u.gpsw = pooled_sum(c) ? gpsw.read<float>(c.indices.size()) : std::vector<float>();
  cuda_rt::synchronize(0);
  return u;
}

// |got - want| <= tol (1 + |want|) + slack[i] per element (slack may be empty: none).
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, double tol,
                     const std::vector<double>& slack, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed =
        tol * (1.0 + std::fabs(double(want[i]))) + (slack.empty() ? 0.0 : slack[i]);
    if (!(std::fabs(double(got[i]) - double(want[i])) <= allowed) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << got[i] << ", cpu " << want[i]
                    << " (allowed " << allowed << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

// What the reduced gradient's rounding may move in a fused update. Both sides reduce a row's
// lookups in different orders, so g differs by up to kRtol * mag (mag: the sum of |terms|, as
// the gradient comparisons allow). Carried to first order through the update of element e:
// - weights: |d w' / d g| kRtol mag. SGD: lr. Row-wise Adagrad: lr / (sqrt(state') + eps) for
//   the element's own term, once more for its share of the row's state (bounded by the same).
//   Adam: lr |d(m^ / (sqrt(v^) + eps)) / d g|, which is large where v^ is small next to m^ --
//   seen on an H100 with the duplicates case: a weight moved to -16.19 by Adam from a random
//   state with v near 0 differed by 2.9e-4 between devices, 1.7 times a fixed 1e-5 (1 + |w|).
// - Adam's m and v: (1 - beta1) and 2 (1 - beta2) |g| times the same error; Adagrad's state: 2
//   sum_row |g| err / D.
struct UpdateSlack {
  std::vector<double> weights, m1, m2;
};

UpdateSlack update_slack(const Case& c, const EmbeddingOptimizerHyper& h,
                         const std::vector<float>& g, const std::vector<float>& mag,
                         const std::vector<float>& m1_before, const std::vector<float>& m2_before,
                         const std::vector<float>& m1_after) {
  const bool adam = h.kind == EmbeddingOptimizer::kAdam;
  const bool adagrad = h.kind == EmbeddingOptimizer::kRowwiseAdagrad;
  const double lr = h.lr, eps = h.eps, b1 = h.beta1, b2 = h.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(h.step)), bc2 = 1.0 - std::pow(b2, double(h.step));
  UpdateSlack s;
  s.weights.assign(g.size(), 0.0);
  s.m1.assign(m1_before.size(), 0.0);
  s.m2.assign(m2_before.size(), 0.0);
  for (int64_t t = 0; t < c.num_tables; ++t) {
    const int64_t dim = c.dims[size_t(t)];
    for (int64_t r = 0; r < c.rows[size_t(t)]; ++r) {
      const size_t first = size_t(c.weight_offsets[size_t(t)] + r * dim);
      double row_err_g = 0.0;  // sum over the row of |g| err, for Adagrad's state
      for (int64_t col = 0; col < dim; ++col) {
        const size_t e = first + size_t(col);
        const double err = kRtol * (double(mag[e]) + 1e-6), ge = g[e];
        row_err_g += 2.0 * std::fabs(ge) * err;
        double gain = lr;
        if (adagrad) {
          const double state = m1_after[size_t(c.row_offsets[size_t(t)] + r)];
          gain = 2.0 * lr / (std::sqrt(std::max(state, 0.0)) + eps);
        } else if (adam) {
          const double m = b1 * m1_before[e] + (1.0 - b1) * ge;
          const double v = b2 * m2_before[e] + (1.0 - b2) * ge * ge;
          const double mh = m / bc1, root = std::sqrt(v / bc2), denom = root + eps;
          const double droot = root > 0.0 ? (1.0 - b2) * ge / bc2 / root : 0.0;
          gain = lr * std::fabs((1.0 - b1) / bc1 / denom - mh * droot / (denom * denom));
          s.m1[e] = (1.0 - b1) * err;
          s.m2[e] = 2.0 * (1.0 - b2) * std::fabs(ge) * err;
        }
        s.weights[e] = gain * err;
      }
      if (adagrad) s.m1[size_t(c.row_offsets[size_t(t)] + r)] = row_err_g / double(dim);
    }
  }
  return s;
}

template <typename I>
void check_fused(const Case& c, const EmbeddingOptimizerHyper& h, uint64_t seed,
                 const std::string& label) {
  SCOPED_TRACE(label);
  const std::vector<float> dout = random_floats(out_size(c), seed + 7);
  const Updated cpu = update_cpu<I>(c, dout, h, seed);
  const Updated gpu = update_gpu<I>(c, dout, h, seed);
  const Results grad = run_cpu<I>(c, dout), mag = run_cpu<I>(c.absolute(), absolute(dout));
  const auto [m1, m2] = initial_state(c, h.kind == EmbeddingOptimizer::kAdam, seed);
  const UpdateSlack slack = update_slack(c, h, grad.grad, mag.grad, m1, m2, cpu.m1);
  const double tol = c.half() ? 1e-2 : 1e-5;
  expect_near_all(gpu.weights, cpu.weights, tol, slack.weights, "weights");
  expect_near_all(gpu.m1, cpu.m1, 1e-5, slack.m1, "momentum1");
  expect_near_all(gpu.m2, cpu.m2, 1e-5, slack.m2, "momentum2");
  if (pooled_sum(c))  // from the weights before the update
    EXPECT_EQ(count_mismatches(gpu.gpsw, cpu.gpsw, mag.gpsw, "psw grad"), 0);
}

TEST(EmbeddingBagCuda, FusedOptimizersMatchCpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  uint64_t seed = 6000;
  for (EmbeddingOptimizer kind :
       {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingOptimizer::kAdam})
    for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBF16, EmbeddingDType::kF16})
      for (EmbeddingPooling pooling :
           {EmbeddingPooling::kSum, EmbeddingPooling::kMean, EmbeddingPooling::kNone})
        for (float wd : {0.0f, 0.01f})
          for (int64_t width : {int64_t(4), int64_t(170)}) {  // one pass; more than one
            CaseSpec spec;
            spec.dtype = dtype;
            spec.pooling = pooling;
            spec.weighted = pooling == EmbeddingPooling::kSum && seed % 2 == 0;
            spec.max_rows = 12;  // duplicates
            spec.max_dim4 = width;
            const Case c = random_case(spec, ++seed);
            const std::string label = std::string(optimizer_name(kind)) + " " + dtype_name(dtype) +
                                      " " + pooling_name(pooling) + " wd " + std::to_string(wd) +
                                      " seed " + std::to_string(seed);
            if (seed % 2 == 0)
              check_fused<int32_t>(c, hyper(kind, wd), seed, label);
            else
              check_fused<int64_t>(c, hyper(kind, wd), seed, label);
          }
}

// ---------------------------------------------------------------- determinism

// Heavy duplicates: 3 rows met 1000 times (segments for a block), 500 rows met 60000 times, and
// a 600-wide table (more than one pass per row) of 7 rows.
Case duplicate_case(EmbeddingPooling pooling, EmbeddingDType dtype) {
  Case c;
  c.num_tables = 3;
  c.batch = 50;
  c.rows = {3, 500, 7};
  c.dims = {36, 132, 600};
  c.weight_offsets = {0, 3 * 36, 3 * 36 + 500 * 132, 3 * 36 + 500 * 132 + 7 * 600};
  c.row_offsets = {0, 3, 503, 510};
  c.dim_offsets = {0, 36, 168, 768};
  c.dtype = dtype;
  c.weights = random_floats(size_t(c.weight_offsets.back()), 41);
  if (c.half()) c.round_weights();
  c.opt.pooling = pooling;
  std::mt19937_64 gen(42);
  c.offsets = {0};
  const int64_t per_bag[3] = {1000 / 50, 60000 / 50, 10};
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t j = 0; j < per_bag[t]; ++j)
        c.indices.push_back(int64_t(gen() % uint64_t(c.rows[size_t(t)])));
      c.offsets.push_back(int64_t(c.indices.size()));
    }
  if (pooling == EmbeddingPooling::kSum) c.psw = random_floats(c.indices.size(), 43);
  return c;
}

// Every backward output as bytes: dense and psw gradients, sparse values, Adagrad and Adam
// weights and state.
std::vector<uint8_t> backward_bits(const Case& c) {
  const std::vector<float> dout = random_floats(out_size(c), 44);
  const Results r = run_gpu<int32_t>(c, dout);
  std::vector<uint8_t> all;
  auto append = [&all](const auto& v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    all.insert(all.end(), p, p + v.size() * sizeof(v[0]));
  };
  append(r.grad);
  append(r.gpsw);
  append(r.sp_values);
  for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kRowwiseAdagrad, EmbeddingOptimizer::kAdam}) {
    const Updated u = update_gpu<int32_t>(c, dout, hyper(kind, 0.01f), 45);
    append(u.weights);
    append(u.m1);
    append(u.m2);
  }
  return all;
}

TEST(EmbeddingBagCuda, BackwardIsBitIdenticalOverRuns) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (EmbeddingPooling pooling : {EmbeddingPooling::kSum, EmbeddingPooling::kMean})
    for (EmbeddingDType dtype : {EmbeddingDType::kF32, EmbeddingDType::kBF16}) {
      SCOPED_TRACE(std::string(pooling_name(pooling)) + " " + dtype_name(dtype));
      const Case c = duplicate_case(pooling, dtype);
      const std::vector<uint8_t> first = backward_bits(c);
      for (int run = 1; run < 5; ++run) EXPECT_TRUE(backward_bits(c) == first) << "run " << run;
      // And the same numbers as the CPU, to f32 rounding.
      expect_matches_cpu<int32_t>(c, "duplicates against the cpu");
      for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kRowwiseAdagrad,
                                      EmbeddingOptimizer::kAdam})
        check_fused<int64_t>(c, hyper(kind, 0.01f), 46,
                             std::string("duplicates, fused ") + optimizer_name(kind));
    }
}

#endif  // LOOM_WITH_CUDA

}  // namespace
}  // namespace loom::kernels
