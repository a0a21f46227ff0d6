// See ckpt/layout_check.h.
#include "ckpt/layout_check.h"

#include <algorithm>
#include <map>
#include <set>

#include "ckpt/hf_export.h"
#include "core/error.h"
#include "gpt/gpt_checkpoint.h"
#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/region.h"
#include "parallel/mesh.h"

namespace loom::ckpt {

namespace {

namespace checkpoint = parallel::checkpoint;

using Run = std::pair<int64_t, int64_t>;  // (first flattened element, count)

// Elements of [0, numel) that no run covers, as "[a, b)" of the first gap; "" when none.
std::string first_gap(std::vector<Run>& runs, int64_t numel) {
  std::sort(runs.begin(), runs.end());
  int64_t next = 0;
  for (const auto& [first, n] : runs) {
    if (first > next) break;
    next = std::max(next, first + n);
  }
  if (next >= numel) return "";
  int64_t end = numel;
  for (const auto& [first, n] : runs)
    if (first > next) {
      end = first;
      break;
    }
  return detail::str_cat("[", next, ", ", end, ")");
}

// The sum and the largest of one field of every rank's reads.
uint64_t total(const std::vector<RankRead>& ranks, uint64_t RankRead::*field) {
  uint64_t n = 0;
  for (const RankRead& r : ranks) n += r.*field;
  return n;
}

uint64_t most(const std::vector<RankRead>& ranks, uint64_t RankRead::*field) {
  uint64_t n = 0;
  for (const RankRead& r : ranks) n = std::max(n, r.*field);
  return n;
}

}  // namespace

uint64_t LayoutCheck::bytes() const { return total(ranks, &RankRead::bytes); }
uint64_t LayoutCheck::max_bytes() const { return most(ranks, &RankRead::bytes); }
uint64_t LayoutCheck::whole_bytes() const { return total(ranks, &RankRead::whole_bytes); }
uint64_t LayoutCheck::max_whole_bytes() const { return most(ranks, &RankRead::whole_bytes); }

LayoutCheck check_layout(const std::string& path, const io::CheckpointManifest& manifest,
                         const gpt::GptOptions& o) {
  const GptConfig config = checkpoint_gpt_config(manifest, path);
  const int world = int(o.pp * o.dp * o.tp);
  LayoutCheck out;
  std::map<std::string, std::vector<Run>> loaded;  // per tensor: the flattened runs ranks load
  for (int rank = 0; rank < world; ++rank) {
    const parallel::MeshCoords c =
        parallel::DeviceMesh::plan(rank, int(o.pp), int(o.dp), int(o.tp)).coords();
    std::vector<checkpoint::PieceRequest> requests;
    checkpoint::ReadPlan plan;
    try {
      requests = gpt::planned_load(config, o, rank, manifest);
      plan = checkpoint::plan_load(path, manifest, requests);
    } catch (const Error& e) {
      // This process's "[rank 0] " prefix would read as the target rank's.
      std::string why = e.what();
      if (why.rfind("[rank ", 0) == 0 && why.find("] ") != std::string::npos)
        why = why.substr(why.find("] ") + 2);
      throw Error(detail::str_cat("rank ", rank, " (pp ", c.pp, ", dp ", c.dp, ", tp ", c.tp,
                                  ") of the layout cannot load the checkpoint: ", why));
    }
    RankRead r{rank, c.pp, c.dp, c.tp};
    std::set<std::string> tensors;
    for (const checkpoint::PieceRequest& q : requests) {
      tensors.insert(q.name);
      r.elements += uint64_t(q.region.numel());
      const io::Region whole = io::Region::whole(q.global_shape);
      std::vector<Run>& runs = loaded[q.name];
      checkpoint::for_each_overlap(
          q.global_shape, q.region, whole,
          [&](int64_t, int64_t at, int64_t n) { runs.emplace_back(at, n); });
    }
    r.tensors = tensors.size();
    r.pieces = plan.sources.size();
    r.files = plan.bytes_per_file(manifest).size();
    r.bytes = plan.bytes();
    // The same stored parameters read whole: plans only if the ZeRO pieces' plan did.
    r.whole_bytes =
        checkpoint::plan_load(path, manifest, gpt::planned_load(config, o, rank, manifest, true))
            .bytes();
    out.ranks.push_back(r);
  }
  for (auto& [name, runs] : loaded) {
    const int64_t numel = shape_numel(manifest.tensors.at(name).shape);
    const std::string gap = first_gap(runs, numel);
    LOOM_CHECK(gap.empty(), "checkpoint ", path, ": no rank of the layout loads elements ", gap,
               " of tensor ", name, " (the layout would lose them)");
    ++out.tensors;
    out.elements += uint64_t(numel);
    for (const Run& run : runs) out.element_loads += uint64_t(run.second);
  }
  for (const auto& [name, t] : manifest.tensors)
    if (!loaded.count(name)) out.unused.push_back(name);
  return out;
}

}  // namespace loom::ckpt
