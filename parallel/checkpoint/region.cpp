// See parallel/checkpoint/region.h.
#include "parallel/checkpoint/region.h"

#include <algorithm>

#include "core/error.h"

namespace loom::parallel::checkpoint {

Placement Placement::whole(const Shape& shape) {
  Placement p;
  p.global_shape = shape;
  p.parts.push_back({io::Region::whole(shape), 0});
  return p;
}

// The view shape refines the full shape: each full dimension is a run of consecutive view
// dimensions whose product it is. Cutting view dimension d (in the run of full dimension g) at
// [start, start + length) cuts full dimension g, for each index of the view dimensions of that run
// before d, at one contiguous range; every other full dimension stays whole. In the local tensor
// (row-major over the local view) those boxes are consecutive exactly when no full dimension
// before g has more than one index, or there is only one box.
Placement Placement::of_shard(const nn::ShardSpec& spec) {
  const Shape& full = spec.full_shape;
  const Shape& view = spec.view_shape;
  LOOM_CHECK(
      shape_numel(full) == shape_numel(view) && spec.dim >= 0 && spec.dim < int64_t(view.size()),
      "checkpoint: shard ", spec.str(), " is not a view of ", shape_str(full));
  // run_of[v]: the full dimension view dimension v belongs to.
  std::vector<size_t> run_of(view.size());
  size_t g = 0;
  int64_t prod = 1;
  for (size_t v = 0; v < view.size(); ++v) {
    LOOM_CHECK(g < full.size(), "checkpoint: shard view ", shape_str(view),
               " does not refine the shape ", shape_str(full));
    run_of[v] = g;
    prod *= view[v];
    if (prod == full[g]) {
      ++g;
      prod = 1;
    }
  }
  LOOM_CHECK(g == full.size(), "checkpoint: shard view ", shape_str(view),
             " does not refine the shape ", shape_str(full));
  const size_t d = size_t(spec.dim);
  const size_t run = run_of[d];
  int64_t boxes = 1, inner = 1;
  for (size_t v = 0; v < d; ++v)
    if (run_of[v] == run) boxes *= view[v];
  for (size_t v = d + 1; v < view.size(); ++v)
    if (run_of[v] == run) inner *= view[v];
  int64_t before = 1;
  for (size_t f = 0; f < run; ++f) before *= full[f];
  LOOM_CHECK(boxes == 1 || before == 1, "checkpoint: shard ", spec.str(), " of ", shape_str(full),
             " is not contiguous in the local tensor");
  Placement p;
  p.global_shape = full;
  int64_t local = 0;
  for (int64_t b = 0; b < boxes; ++b) {
    Shape offset(full.size(), 0), extent = full;
    offset[run] = (b * view[d] + spec.start) * inner;
    extent[run] = spec.length * inner;
    io::Region r = io::Region::box(offset, extent);
    p.parts.push_back({r, local});
    local += r.numel();
  }
  return p;
}

Placement Placement::slice(int64_t begin, int64_t numel) const {
  LOOM_ASSERT(begin >= 0 && numel >= 0 && begin + numel <= this->numel(), "slice [", begin, ", ",
              begin + numel, ") of a placement of ", this->numel(), " elements");
  Placement out;
  out.global_shape = global_shape;
  const int64_t end = begin + numel;
  for (const Part& part : parts) {
    const int64_t lo = std::max(begin, part.local_offset);
    const int64_t hi = std::min(end, part.local_offset + part.region.numel());
    if (lo >= hi) continue;
    Part p = part;
    p.region.begin = part.region.begin + (lo - part.local_offset);
    p.region.end = p.region.begin + (hi - lo);
    p.local_offset = lo - begin;
    out.parts.push_back(p);
  }
  return out;
}

int64_t Placement::numel() const {
  int64_t n = 0;
  for (const Part& p : parts) n += p.region.numel();
  return n;
}

void for_each_overlap(const Shape& global_shape, const io::Region& src, const io::Region& dst,
                      const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  if (src.numel() == 0 || dst.numel() == 0) return;
  const size_t nd = global_shape.size();
  if (nd == 0) {  // a scalar: both regions are its one element
    fn(0, 0, 1);
    return;
  }
  // The boxes must meet in every dimension but the last before any row can overlap.
  for (size_t k = 0; k < nd; ++k)
    if (src.offset[k] >= dst.offset[k] + dst.shape[k] ||
        dst.offset[k] >= src.offset[k] + src.shape[k])
      return;
  // Rows are found one at a time, but a run that continues the previous one in both regions
  // extends it: a whole tensor, or whole rows of it, is one run and loads as one copy per block
  // (per-row runs of 3 KB had cost a GPT-2 load a memcpy per row; Note [Parallel load]).
  int64_t run_src = 0, run_dst = 0, run_n = 0;
  auto emit = [&](int64_t s, int64_t d, int64_t n) {
    if (run_n > 0 && s == run_src + run_n && d == run_dst + run_n) {
      run_n += n;
      return;
    }
    if (run_n > 0) fn(run_src, run_dst, run_n);
    run_src = s, run_dst = d, run_n = n;
  };
  const int64_t dst_row_len = dst.shape[nd - 1], src_row_len = src.shape[nd - 1];
  const int64_t first_row = dst.begin / dst_row_len, last_row = (dst.end - 1) / dst_row_len;
  std::vector<int64_t> coord(nd, 0);  // global coordinates of the row's first element
  for (int64_t row = first_row; row <= last_row; ++row) {
    // Unravel the dst row index over the box's leading dimensions; find the src row.
    int64_t rest = row, src_row = 0, stride = 1;
    bool inside = true;
    for (size_t k = nd - 1; k-- > 0;) {
      coord[k] = dst.offset[k] + rest % dst.shape[k];
      rest /= dst.shape[k];
    }
    for (size_t k = nd - 1; k-- > 0;) {
      const int64_t c = coord[k] - src.offset[k];
      if (c < 0 || c >= src.shape[k]) {
        inside = false;
        break;
      }
      src_row += c * stride;
      stride *= src.shape[k];
    }
    if (!inside) continue;
    // The dst row's columns (within its element range), then those the src box holds.
    const int64_t row_start = row * dst_row_len;
    const int64_t c0 = std::max<int64_t>(0, dst.begin - row_start);
    const int64_t c1 = std::min<int64_t>(dst_row_len, dst.end - row_start);
    int64_t g0 = std::max(dst.offset[nd - 1] + c0, src.offset[nd - 1]);
    int64_t g1 = std::min(dst.offset[nd - 1] + c1, src.offset[nd - 1] + src_row_len);
    if (g0 >= g1) continue;
    // And those within the src element range.
    const int64_t src_flat0 = src_row * src_row_len + (g0 - src.offset[nd - 1]);
    const int64_t f0 = std::max(src_flat0, src.begin);
    const int64_t f1 = std::min(src_flat0 + (g1 - g0), src.end);
    if (f0 >= f1) continue;
    g0 += f0 - src_flat0;
    const int64_t dst_flat = row_start + (g0 - dst.offset[nd - 1]);
    emit(f0 - src.begin, dst_flat - dst.begin, f1 - f0);
  }
  if (run_n > 0) fn(run_src, run_dst, run_n);
}

}  // namespace loom::parallel::checkpoint
