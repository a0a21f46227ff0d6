// See parallel/checkpoint/checkpoint.h.
#include "parallel/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/io/detail/file.h"
#include "core/io/safetensors.h"
#include "parallel/checkpoint/durable.h"
#include "parallel/checkpoint/region.h"

namespace loom::parallel::checkpoint {

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return buf;
}

// The step of a committed-looking directory name ("step-00000100"), or -1.
int64_t step_of_dir_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// What an interrupted save leaves in a checkpoint root: a staging or set-aside step directory
// (step-N.tmp, step-N.old), or the temporary of a `latest` being replaced (latest.tmp.<pid>).
bool is_leftover(const std::string& name) {
  const auto ends_with = [&](const std::string& end) {
    return name.size() > end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0;
  };
  return (name.compare(0, 5, "step-") == 0 && (ends_with(".tmp") || ends_with(".old"))) ||
         name.compare(0, 11, "latest.tmp.") == 0;
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// Every rank's string, in rank order. Collective.
std::vector<std::string> allgather_strings(comm::Communicator& group, const std::string& mine) {
  const int n = group.size();
  Tensor size = Tensor::full({1}, double(mine.size()), DType::kI64);
  Tensor sizes = Tensor::empty({n}, DType::kI64);
  group.allgather(size, sizes)->wait();
  const std::vector<int64_t> s = sizes.to_vector<int64_t>();
  const int64_t most = std::max<int64_t>(1, *std::max_element(s.begin(), s.end()));
  Tensor padded = Tensor::zeros({most}, DType::kU8);
  std::copy(mine.begin(), mine.end(), static_cast<char*>(padded.data_ptr()));
  Tensor all = Tensor::empty({n * most}, DType::kU8);
  group.allgather(padded, all)->wait();
  std::vector<std::string> out;
  const char* bytes = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) out.emplace_back(bytes + r * most, size_t(s[size_t(r)]));
  return out;
}

// Every rank says whether its part of `phase` failed; a failure anywhere is raised everywhere,
// naming each failing rank and its reason. Collective.
void agree(comm::Communicator& group, const std::string& what, const std::string& error) {
  std::vector<std::string> errors;
  try {
    errors = allgather_strings(group, error);
  } catch (const std::exception& e) {  // a rank died or hangs: say which save and phase
    LOOM_FAIL(what, " failed: ", e.what());
  }
  std::string message;
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty())
      message += detail::str_cat(message.empty() ? "" : "; ", "rank ", r, ": ", errors[r]);
  LOOM_CHECK(message.empty(), what, " failed: ", message);
}

// Runs fn, returning its error message ("" when it succeeded).
template <typename Fn>
std::string capture(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

nlohmann::json region_json(const io::Region& r) {
  return {{"box_offset", r.offset}, {"box_shape", r.shape}, {"range", {r.begin, r.end}}};
}

io::Region region_from_json(const nlohmann::json& j) {
  io::Region r;
  r.offset = j.at("box_offset").get<Shape>();
  r.shape = j.at("box_shape").get<Shape>();
  r.begin = j.at("range")[0].get<int64_t>();
  r.end = j.at("range")[1].get<int64_t>();
  return r;
}

// Merges `from` into `into`, objects key by key. Throws naming the key when leaves differ.
void merge_state(nlohmann::json& into, const nlohmann::json& from, const std::string& path) {
  for (const auto& [key, value] : from.items()) {
    const std::string at = path.empty() ? key : path + "." + key;
    if (!into.contains(key)) {
      into[key] = value;
    } else if (into[key].is_object() && value.is_object()) {
      merge_state(into[key], value, at);
    } else {
      LOOM_CHECK(into[key] == value, "the ranks disagree on state '", at, "': ", into[key].dump(),
                 " vs ", value.dump());
    }
  }
}

// What one rank writes of a piece: its share of the piece's elements.
struct Share {
  const StatePiece* piece;
  DType dtype;
  int64_t first;  // of the piece's elements
  io::Region region;
};

// The shares this rank writes: pieces several ranks hold identically are split evenly between
// them in rank order, so each element is written once. Checks that the ranks agree on each
// tensor's shape and dtype and that, together, they hold every element of it.
std::vector<Share> plan_shares(const std::vector<StatePiece>& pieces, comm::Communicator& group,
                               std::map<std::string, io::TensorEntry>& tensors) {
  nlohmann::json mine = nlohmann::json::array();
  for (const StatePiece& p : pieces) {
    LOOM_CHECK(p.data.defined() && p.data.numel() == p.region.numel(), "checkpoint: piece ", p.name,
               " ", p.region.str(), " has ", p.data.defined() ? p.data.numel() : 0,
               " elements of data for ", p.region.numel());
    p.region.check_inside(p.global_shape, "checkpoint: piece " + p.name);
    if (p.region.numel() == 0) continue;
    mine.push_back({{"name", p.name},
                    {"shape", p.global_shape},
                    {"dtype", io::safetensors_dtype_code(p.data.dtype())},
                    {"region", region_json(p.region)}});
  }
  const std::vector<std::string> all = allgather_strings(group, mine.dump());
  // key (name + region) -> ranks holding it, in rank order
  std::map<std::string, std::vector<int>> holders;
  std::map<std::string, int64_t> held;  // per tensor: elements over distinct keys
  for (size_t r = 0; r < all.size(); ++r) {
    for (const nlohmann::json& e : nlohmann::json::parse(all[r])) {
      const std::string name = e["name"];
      const Shape shape = e["shape"].get<Shape>();
      const DType dtype = io::dtype_from_safetensors_code(e["dtype"], name);
      auto [it, fresh] = tensors.try_emplace(name);
      if (fresh) {
        it->second.shape = shape;
        it->second.dtype = dtype;
      }
      LOOM_CHECK(it->second.shape == shape && it->second.dtype == dtype, "checkpoint: tensor ",
                 name, " is ", shape_str(shape), " ", dtype_name(dtype), " on rank ", r, " but ",
                 shape_str(it->second.shape), " ", dtype_name(it->second.dtype),
                 " on a lower rank");
      const std::string key = name + " " + e["region"].dump();
      std::vector<int>& h = holders[key];
      if (h.empty()) held[name] += region_from_json(e["region"]).numel();
      // A rank holding the piece twice is one holder: shares are split between ranks.
      if (h.empty() || h.back() != int(r)) h.push_back(int(r));
    }
  }
  for (const auto& [name, t] : tensors)
    LOOM_CHECK(held[name] == shape_numel(t.shape), "checkpoint: the ranks' pieces of tensor ", name,
               " ", shape_str(t.shape), " hold ", held[name], " of its ", shape_numel(t.shape),
               " elements; a layout must describe every element once (identical pieces may "
               "repeat)");
  std::vector<Share> shares;
  std::set<std::string> taken;
  for (const StatePiece& p : pieces) {
    if (p.region.numel() == 0) continue;
    const std::string key = p.name + " " + region_json(p.region).dump();
    // Identical pieces may appear twice on one rank; the first takes the share.
    if (!taken.insert(key).second) continue;
    const std::vector<int>& h = holders.at(key);
    const int64_t k = int64_t(h.size());
    const int64_t j = std::find(h.begin(), h.end(), group.rank()) - h.begin();
    const int64_t n = p.region.numel();
    const int64_t lo = n * j / k, hi = n * (j + 1) / k;
    if (lo == hi) continue;
    io::Region r = p.region;
    r.begin = p.region.begin + lo;
    r.end = p.region.begin + hi;
    shares.push_back({&p, p.data.dtype(), lo, r});
  }
  return shares;
}

// Writes this rank's data file; returns its report for the manifest.
nlohmann::json write_data_file(const std::string& dir, const std::string& file, int64_t step,
                               int rank, std::vector<Share> shares, uint64_t chunk_bytes) {
  std::stable_sort(shares.begin(), shares.end(), [](const Share& a, const Share& b) {
    return dtype_size(a.dtype) > dtype_size(b.dtype);
  });
  std::vector<io::SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata{{"format", "loom-checkpoint"},
                                              {"step", std::to_string(step)},
                                              {"rank", std::to_string(rank)}};
  std::map<std::string, int> per_name;
  std::vector<std::string> keys;
  for (const Share& s : shares) {
    const std::string key = s.piece->name + "#" + std::to_string(per_name[s.piece->name]++);
    entries.push_back({key, s.dtype, {s.region.numel()}});
    nlohmann::json place = region_json(s.region);
    place["tensor"] = s.piece->name;
    place["shape"] = s.piece->global_shape;
    metadata[key] = place.dump();
    keys.push_back(key);
  }
  const io::SafetensorsLayout layout = io::safetensors_layout(entries, metadata);
  DurableFile out(join(dir, file), WriteMode::kDirect);  // Note [Direct data writes]
  out.write(layout.header.data(), layout.header.size());
  nlohmann::json pieces = nlohmann::json::array();
  for (size_t i = 0; i < shares.size(); ++i) {
    const Share& s = shares[i];
    const Tensor cpu =
        s.piece->data.detach().to(Device::cpu()).contiguous().reshape({s.piece->region.numel()});
    const Tensor part = cpu.narrow(0, s.first, s.region.numel());
    const char* bytes = static_cast<const char*>(part.data_ptr());
    const uint64_t nbytes = part.nbytes();
    LOOM_ASSERT(out.written() == layout.data_offset[i], "data file offset ", out.written(), " for ",
                keys[i], ", the header says ", layout.data_offset[i]);
    // Each chunk's checksum as it is staged for the disk (DurableFile::write_checksummed).
    std::vector<uint32_t> crcs;
    for (uint64_t at = 0; at < nbytes; at += chunk_bytes)
      crcs.push_back(out.write_checksummed(bytes + at, size_t(std::min(chunk_bytes, nbytes - at))));
    nlohmann::json pj = region_json(s.region);
    pj["tensor"] = s.piece->name;
    pj["key"] = keys[i];
    pj["offset"] = layout.data_offset[i];
    pj["nbytes"] = nbytes;
    pj["chunk_bytes"] = chunk_bytes;
    pj["crc32c"] = crcs;
    pieces.push_back(pj);
  }
  out.commit();
  return {{"file", file}, {"bytes", layout.file_bytes}, {"rank", rank}, {"pieces", pieces}};
}

// Deletes a committed step directory. It leaves the committed names first (step-N.old is never
// loaded, and the next save removes it), so a crash halfway through the deletion cannot leave a
// partial directory that still looks committed.
void discard_step_dir(const std::string& step_dir) {
  const std::string old = step_dir + ".old";
  remove_tree(old);
  LOOM_CHECK(std::rename(step_dir.c_str(), old.c_str()) == 0, "cannot move ", step_dir,
             " aside to delete it");
  remove_tree(old);
}

// Rank 0's part of the commit: the manifest into the staging directory, the directory to its
// final name, then `latest`, then old checkpoints. See Note [Durable commit].
void commit(const std::string& dir, const std::string& staging, const std::string& final_dir,
            io::CheckpointManifest manifest, const std::vector<std::string>& reports,
            int keep_last) {
  for (const std::string& text : reports) {
    const nlohmann::json report = nlohmann::json::parse(text);
    merge_state(manifest.state, report["state"], "");
    const nlohmann::json& file = report["file"];
    manifest.files.push_back(
        {file["file"], file["bytes"].get<uint64_t>(), file["rank"].get<int>()});
    for (const nlohmann::json& pj : file["pieces"]) {
      io::StoredPiece p;
      p.region = region_from_json(pj);
      p.file = file["file"];
      p.key = pj["key"];
      p.offset = pj["offset"];
      p.nbytes = pj["nbytes"];
      p.chunk_bytes = pj["chunk_bytes"];
      p.crc32c = pj["crc32c"].get<std::vector<uint32_t>>();
      manifest.tensors.at(pj["tensor"].get<std::string>()).pieces.push_back(std::move(p));
    }
  }
  // Parse what we are about to write: a manifest that would not load is never committed.
  const std::string text = manifest.to_json();
  io::parse_checkpoint_manifest(text, join(staging, kManifest));
  write_file_durably(join(staging, kManifest), text);
  // The same step saved before (a run resumed from earlier).
  if (path_exists(final_dir)) discard_step_dir(final_dir);
  LOOM_CHECK(std::rename(staging.c_str(), final_dir.c_str()) == 0, "cannot rename ", staging,
             " to ", final_dir);
  fsync_directory(dir);
  write_file_durably(join(dir, kLatest), step_dir_name(manifest.step) + "\n");
  if (keep_last > 0) {
    std::vector<int64_t> steps;
    for (const std::string& name : list_directory(dir))
      if (step_of_dir_name(name) >= 0 && path_exists(join(join(dir, name), kManifest)))
        steps.push_back(step_of_dir_name(name));
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + size_t(keep_last) < steps.size(); ++i)
      if (steps[i] != manifest.step) discard_step_dir(join(dir, step_dir_name(steps[i])));
  }
}

}  // namespace

// One save, in the three parts an asynchronous save runs at different times: begin (collective:
// plan who writes what, prepare the staging directory), write (local: this rank's data file, no
// communication, so it may run on another thread) and finish (collective: gather the reports,
// rank 0 commits).
struct SaveJob {
  std::string what, dir, final_dir, staging, file;
  int64_t step = 0;
  SaveOptions options;
  nlohmann::json state;
  std::vector<StatePiece> pieces;  // kept alive: the shares point into them
  std::map<std::string, io::TensorEntry> tensors;
  std::vector<Share> shares;
  int rank = 0;
  nlohmann::json report;
  std::string error;  // of write()
  std::chrono::steady_clock::time_point start;

  void write() {
    error = capture([&] {
      report["file"] = write_data_file(staging, file, step, rank, shares, options.chunk_bytes);
      report["state"] = state;
    });
  }
};

namespace {

std::unique_ptr<SaveJob> begin_save(const std::string& dir, int64_t step,
                                    std::vector<StatePiece> pieces, const nlohmann::json& state,
                                    comm::Communicator& group, const SaveOptions& options) {
  auto job = std::make_unique<SaveJob>();
  job->start = std::chrono::steady_clock::now();
  LOOM_CHECK(step >= 0, "checkpoint save: step must be >= 0, got ", step);
  LOOM_CHECK(options.chunk_bytes > 0, "checkpoint save: chunk_bytes must be positive");
  LOOM_CHECK(state.is_object(), "checkpoint save: the state must be a JSON object");
  job->what = detail::str_cat("checkpoint save of step ", step, " to ", dir);
  job->dir = dir;
  job->step = step;
  job->options = options;
  job->state = state;
  job->pieces = std::move(pieces);
  job->final_dir = join(dir, step_dir_name(step));
  job->staging = job->final_dir + ".tmp";
  job->rank = group.rank();
  char file[32];
  std::snprintf(file, sizeof file, "rank-%05d.safetensors", job->rank);
  job->file = file;

  SaveJob& j = *job;
  agree(group, j.what + " (planning)",
        capture([&] { j.shares = plan_shares(j.pieces, group, j.tensors); }));
  // Rank 0 clears what an interrupted save left and makes the staging directory.
  agree(group, j.what + " (preparing " + j.staging + ")", capture([&] {
          if (j.rank != 0) return;
          make_directories(dir);
          for (const std::string& name : list_directory(dir))
            if (is_leftover(name)) remove_tree(join(dir, name));
          make_directories(j.staging);
        }));
  return job;
}

SaveResult finish_save(SaveJob& j, comm::Communicator& group) {
  agree(group, j.what + " (writing data files)", j.error);
  const std::vector<std::string> reports = allgather_strings(group, j.report.dump());
  SaveResult result;
  result.path = j.final_dir;
  result.bytes = j.report["file"]["bytes"];
  for (const std::string& r : reports)
    result.total_bytes += nlohmann::json::parse(r)["file"]["bytes"].get<uint64_t>();
  agree(group, j.what + " (committing)", capture([&] {
          if (j.rank != 0) return;
          io::CheckpointManifest manifest;
          manifest.step = j.step;
          manifest.tensors = j.tensors;
          commit(j.dir, j.staging, j.final_dir, std::move(manifest), reports, j.options.keep_last);
        }));
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - j.start).count();
  return result;
}

}  // namespace

SaveResult save(const std::string& dir, int64_t step, const std::vector<StatePiece>& pieces,
                const nlohmann::json& state, comm::Communicator& group,
                const SaveOptions& options) {
  std::unique_ptr<SaveJob> job = begin_save(dir, step, pieces, state, group, options);
  job->write();
  return finish_save(*job, group);
}

AsyncCheckpointer::AsyncCheckpointer(std::shared_ptr<comm::Communicator> group)
    : group_(std::move(group)) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  // Not committed: the staging directory stays, is never loaded, and the next save removes it.
  if (writer_.joinable()) writer_.join();
}

namespace {

// Copies n bytes from src to dst with up to `threads` threads (the snapshot of an asynchronous
// save is memory-bound; one thread does not use all of a socket's bandwidth).
void parallel_copy(std::vector<std::tuple<char*, const char*, uint64_t>> copies, int threads) {
  uint64_t total = 0;
  for (const auto& c : copies) total += std::get<2>(c);
  constexpr uint64_t kMinPerThread = uint64_t(32) << 20;
  threads =
      int(std::max<uint64_t>(1, std::min<uint64_t>(uint64_t(threads), total / kMinPerThread)));
  // Thread t copies bytes [total * t / threads, total * (t + 1) / threads) of the concatenation.
  auto part = [&](int t) {
    const uint64_t lo = total * uint64_t(t) / uint64_t(threads);
    const uint64_t hi = total * uint64_t(t + 1) / uint64_t(threads);
    uint64_t at = 0;
    for (const auto& [dst, src, n] : copies) {
      const uint64_t a = std::max(lo, at), b = std::min(hi, at + n);
      if (a < b) std::memcpy(dst + (a - at), src + (a - at), size_t(b - a));
      at += n;
      if (at >= hi) break;
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(part, t);
  part(0);
  for (std::thread& h : helpers) h.join();
}

}  // namespace

double AsyncCheckpointer::start(const std::string& dir, int64_t step,
                                const std::vector<StatePiece>& pieces, const nlohmann::json& state,
                                const SaveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (job_) wait();  // at most one save in flight: the buffers are free again
  // The snapshot in host memory, in the buffers of the previous save where they fit.
  std::vector<StatePiece> snapshot;
  std::vector<std::tuple<char*, const char*, uint64_t>> copies;
  std::vector<Tensor> sources;  // host copies of device (or strided) pieces, alive until copied
  snapshot_bytes_ = 0;
  buffers_.resize(std::max(buffers_.size(), pieces.size()));
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StatePiece& p = pieces[i];
    Tensor& buf = buffers_[i];
    const uint64_t nbytes = uint64_t(p.data.numel()) * dtype_size(p.data.dtype());
    if (!buf.defined() || buf.dtype() != p.data.dtype() || buf.numel() != p.data.numel())
      buf = Tensor::empty({p.data.numel()}, p.data.dtype());
    Tensor src = p.data.detach();
    if (!src.device().is_cpu()) {
      src.contiguous().copy_to_host(buf.data_ptr(), size_t(nbytes));
    } else {
      if (!src.is_contiguous()) sources.push_back(src = src.contiguous());
      copies.emplace_back(static_cast<char*>(buf.data_ptr()),
                          static_cast<const char*>(src.data_ptr()), nbytes);
    }
    StatePiece c = p;
    c.data = buf.reshape(p.data.shape());
    snapshot_bytes_ += nbytes;
    snapshot.push_back(std::move(c));
  }
  parallel_copy(std::move(copies),
                int(std::min(4u, std::max(1u, std::thread::hardware_concurrency()))));
  job_ = begin_save(dir, step, std::move(snapshot), state, *group_, options);
  done_ = false;
  writer_ = std::thread([this] {
    job_->write();
    done_ = true;
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::optional<SaveResult> AsyncCheckpointer::poll() {
  if (!job_) return std::nullopt;
  Tensor all_done = Tensor::full({1}, done_ ? 1.0 : 0.0, DType::kI64);
  comm::AllreduceOptions o;
  o.op = comm::ReduceOp::kMin;
  group_->allreduce(all_done, o)->wait();
  if (all_done.to_vector<int64_t>()[0] == 0) return std::nullopt;
  return wait();
}

std::optional<SaveResult> AsyncCheckpointer::wait() {
  if (!job_) return std::nullopt;
  writer_.join();
  std::unique_ptr<SaveJob> job = std::move(job_);
  snapshot_bytes_ = 0;
  return finish_save(*job, *group_);
}

std::string latest_pointer(const std::string& dir) {
  const std::string pointer = join(dir, kLatest);
  if (!path_exists(pointer)) return "";
  std::string name = io::detail::read_all(pointer, "checkpoint pointer");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

std::string latest_checkpoint(const std::string& dir) {
  const std::string name = latest_pointer(dir);
  if (step_of_dir_name(name) >= 0 && path_exists(join(join(dir, name), kManifest)))
    return join(dir, name);
  if (!path_exists(dir)) return "";
  int64_t best = -1;
  for (const std::string& name : list_directory(dir)) {
    const int64_t s = step_of_dir_name(name);
    if (s > best && path_exists(join(join(dir, name), kManifest))) best = s;
  }
  return best < 0 ? "" : join(dir, step_dir_name(best));
}

bool has_checkpoint(const std::string& dir, int64_t step) {
  return path_exists(join(join(dir, step_dir_name(step)), kManifest));
}

io::CheckpointManifest read_manifest(const std::string& path) {
  std::string name = path;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') + 1);
  LOOM_CHECK(step_of_dir_name(name) >= 0 || name.compare(0, 5, "step-") != 0, "checkpoint ", path,
             " is a save that was never committed (staging or discarded); load a step-N "
             "directory");
  const std::string manifest = join(path, kManifest);
  LOOM_CHECK(path_exists(manifest), "no committed checkpoint at ", path, ": it has no ", kManifest,
             " (a step directory without one is an unfinished save and is never loaded",
             path_exists(join(path, kLatest)) ? "; this looks like a checkpoint root: use it with "
                                                "--resume, or name a step directory in it"
                                              : "",
             ")");
  return io::parse_checkpoint_manifest(io::detail::read_all(manifest, "checkpoint manifest"),
                                       manifest);
}

namespace {

// Opened data files, checked once against the manifest's sizes. Reads are pread()s, so the
// reader thread of a load and its caller may both use a file.
class Files {
 public:
  Files(const std::string& dir, const io::CheckpointManifest& m) : dir_(dir) {
    for (const io::CheckpointFile& f : m.files) sizes_[f.name] = f.bytes;
  }
  ~Files() {
    for (const auto& [name, fd] : open_) ::close(fd);
  }
  Files(const Files&) = delete;
  Files& operator=(const Files&) = delete;

  // Opens `name` (once), checking that it exists and has the manifest's size.
  int open(const std::string& name) {
    auto it = open_.find(name);
    if (it != open_.end()) return it->second;
    const std::string path = join(dir_, name);
    LOOM_CHECK(path_exists(path), "checkpoint ", dir_, ": data file ", name,
               " is missing (the manifest lists it)");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LOOM_CHECK(fd >= 0, "cannot open checkpoint data file ", path, ": ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      LOOM_FAIL("cannot read checkpoint data file ", path, ": not a regular file");
    }
    const uint64_t size = uint64_t(st.st_size);
    if (size != sizes_.at(name)) {
      ::close(fd);
      LOOM_FAIL("checkpoint ", dir_, ": data file ", name, " is ", size,
                " bytes but the manifest says ", sizes_.at(name),
                size < sizes_.at(name) ? " (truncated)" : "");
    }
    return open_.emplace(name, fd).first->second;
  }
  // Reads exactly n bytes at `offset` of an opened file.
  void read_at(const std::string& name, uint64_t offset, char* dst, uint64_t n) const {
    const int fd = open_.at(name);
    while (n > 0) {
      const ssize_t r =
          ::pread(fd, dst, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      LOOM_CHECK(r > 0, "checkpoint ", dir_, ": cannot read data file ", name, " at offset ",
                 offset, ": ", r < 0 ? std::strerror(errno) : "it ended early (truncated?)");
      dst += r;
      offset += uint64_t(r);
      n -= uint64_t(r);
    }
  }

 private:
  std::string dir_;
  std::map<std::string, uint64_t> sizes_;
  std::map<std::string, int> open_;
};

// Throws unless chunk c of a stored piece (its bytes at `bytes`) matches its checksum.
void check_chunk(const std::string& dir, const std::string& tensor, const io::StoredPiece& p,
                 uint64_t c, const char* bytes) {
  const uint64_t at = c * p.chunk_bytes, n = std::min(p.chunk_bytes, p.nbytes - at);
  const uint32_t crc = crc32c(bytes, n);
  LOOM_CHECK(crc == p.crc32c[c], "checkpoint ", dir, ": data file ", p.file, ", tensor ", tensor,
             " (piece ", p.key, "), bytes [", p.offset + at, ", ", p.offset + at + n,
             ") fail their checksum (crc32c ", crc, ", the manifest says ", p.crc32c[c],
             "): the file is damaged");
}

// Note [Parallel load]
// A load reads its plan's chunk runs in blocks of whole chunks (1 MiB) on kLoadWorkers threads
// (the caller and the others): each worker takes the next block in plan order, pread()s it into
// its own bounce buffer and copies it out into every destination run it overlaps, checking its
// chunks' crc32c on the way (Note [Checked while copied]). The kernel's copy out of the page cache
// (or the disk) and the checksums of different blocks run side by side; a single reader thread
// feeding a single checker (the first design) left the checker reading every byte back from memory.
//
// Why every block goes through the bounce buffer, though a block inside one destination run
// could be read straight into it (the design until 2026-12-04): a resume loads into tensors that
// the model and optimizer have just made and initialised, pages that the kernel has never
// written. On the development VM (a PVM guest: the guest kernel and its processes run on separate
// shadow page tables) the kernel's first write to each such page costs a trip to the hypervisor:
// pread() straight into a fresh 768 MB destination ran at 0.8-1.2 GB/s with its crc32c, on one
// and two threads, against 8.8-14 GB/s through a 1 MiB bounce buffer and a memcpy (the bounce
// buffer stays in the L2, and the process's own stores into its pages need no trip). Only a
// second load into the same tensors is faster straight (7.1 against 5.2 GB/s on one thread):
// that is a benchmark loop, not a resume. Elsewhere the two move the same bytes through memory:
// the kernel's store to the destination becomes a memcpy's.
//
// Blocks write disjoint destination bytes (each wanted element comes from one stored element), so
// workers need no lock but the block counter. An error stops the blocks after it, and the load
// raises the error of the earliest failing block: the same one a sequential load would meet first.
struct Block {
  size_t source;         // index into the plan's sources
  uint64_t first, last;  // chunks, of the stored piece
  uint64_t begin, end;   // bytes, of the stored piece
};

constexpr uint64_t kBlockBytes = uint64_t(1) << 20;
// Note [Checked while copied]
// A chunk goes from the bounce buffer to its destination runs through crc32c_copy, which
// checksums the bytes as it copies them (durable.h): one pass over the bounce buffer instead of
// two. On the development VM (Zen 5), a 768 MB file read in 1 MiB blocks from the page cache,
// checked and copied into fresh memory ran at 9.7-10.8 GB/s on one thread this way against
// 8.0-9.1 checking first, and 16-19 against 13-16 GB/s on two; GPT-2 124M's training state
// (1.49 GB) loaded warm in 0.103-0.107 s against 0.114-0.122 s on one rank
// (benchmarks/README.md, "A load's checksum on the way out"). The cost: a damaged chunk is copied
// before its checksum fails, so the tensors a failed load leaves hold its bytes, where before
// they held the state that was there. Neither is a state to train from, and a failed load raises
// on every rank (load()): the caller must not use the tensors. A chunk whose runs take the same
// bytes twice (two requests of one element) or that is cut into more than kCheckedRuns runs (a
// box's rows, resharded: the fold would reach few of their bytes, and the rest goes through the
// crc32 instruction one stream at a time) is checked first and copied after, as before.
constexpr size_t kCheckedRuns = 4;
// Two: the threads a load used before (a rank per core is the usual launch); enough to overlap
// the kernel's copy with the checksums on the development VM's two cores.
constexpr size_t kLoadWorkers = 2;

class BlockWorkers {
 public:
  BlockWorkers(const std::string& path, const Files& files, const io::CheckpointManifest& manifest,
               const ReadPlan& plan, const std::vector<Block>& blocks,
               std::function<char*(const ReadPlan::Copy&, uint64_t)> dst_of)
      : path_(path),
        files_(files),
        manifest_(manifest),
        plan_(plan),
        blocks_(blocks),
        dst_of_(std::move(dst_of)) {}

  // Reads, checks and copies out every block; throws the earliest failing block's error.
  void run() {
    uint64_t bounce = 0;  // the largest block
    for (const Block& b : blocks_) bounce = std::max(bounce, b.end - b.begin);
    const size_t workers = std::min(kLoadWorkers, blocks_.size());
    std::vector<std::thread> threads;
    try {
      for (size_t w = 1; w < workers; ++w) threads.emplace_back([this, bounce] { work(bounce); });
    } catch (const std::system_error&) {  // no thread to be had: fewer workers do the blocks
    }
    work(bounce);
    for (std::thread& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // A destination run of a block: the stored piece's bytes [lo, hi) go to dst.
  struct Run {
    uint64_t lo, hi;
    char* dst;
  };

  void work(uint64_t bounce_bytes) {
    std::unique_ptr<char[]> bounce;  // made at this worker's first block
    std::vector<Run> runs;           // of the block in hand
    for (;;) {
      const size_t i = next_.fetch_add(1);
      if (i >= blocks_.size() || i > first_error_.load()) return;
      try {  // everything that can throw on a worker thread is raised on the caller's
        if (!bounce) bounce.reset(new char[bounce_bytes]);
        one_block(blocks_[i], bounce.get(), runs);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (i < first_error_.load()) {
          first_error_ = i;
          error_ = std::current_exception();
        }
        return;
      }
    }
  }

  void one_block(const Block& b, char* bytes, std::vector<Run>& runs) {
    const ReadPlan::Source& src = plan_.sources[b.source];
    const io::TensorEntry& t = manifest_.tensors.at(src.tensor);
    const io::StoredPiece& sp = t.pieces[src.piece];
    const uint64_t es = dtype_size(t.dtype);
    // `bytes` receives the stored piece's bytes [b.begin, b.end).
    files_.read_at(sp.file, sp.offset + b.begin, bytes, b.end - b.begin);
    // The destination runs the block overlaps, by their first byte.
    runs.clear();
    for (const ReadPlan::Copy& c : src.copies) {
      const uint64_t lo = std::max(b.begin, uint64_t(c.src_index) * es);
      const uint64_t hi = std::min(b.end, uint64_t(c.src_index + c.n) * es);
      if (lo < hi) runs.push_back({lo, hi, dst_of_(c, es) + (lo - uint64_t(c.src_index) * es)});
    }
    std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.lo < y.lo; });
    size_t first_run = 0;  // the first run that may overlap the next chunk
    for (uint64_t c = b.first; c <= b.last; ++c) {
      const uint64_t lo = c * sp.chunk_bytes, hi = std::min(lo + sp.chunk_bytes, sp.nbytes);
      while (first_run < runs.size() && runs[first_run].hi <= lo) ++first_run;
      const char* chunk = bytes + (lo - b.begin);
      if (!copy_checked(src.tensor, sp, c, chunk, lo, hi, runs, first_run)) {
        check_chunk(path_, src.tensor, sp, c, chunk);
        for (size_t r = first_run; r < runs.size() && runs[r].lo < hi; ++r) {
          const uint64_t from = std::max(lo, runs[r].lo), to = std::min(hi, runs[r].hi);
          if (from < to)
            std::memcpy(runs[r].dst + (from - runs[r].lo), bytes + (from - b.begin),
                        size_t(to - from));
        }
      }
    }
  }

  // See Note [Checked while copied]. Copies chunk c (the piece's bytes [lo, hi), at `chunk`) into
  // the runs from runs[first] on that overlap it, checksumming it on the way, and throws unless
  // it matches; false, with nothing copied, where the runs call for a check first.
  bool copy_checked(const std::string& tensor, const io::StoredPiece& sp, uint64_t c,
                    const char* chunk, uint64_t lo, uint64_t hi, const std::vector<Run>& runs,
                    size_t first) const {
    size_t end = first;
    for (uint64_t covered = 0; end < runs.size() && runs[end].lo < hi; ++end) {
      if (runs[end].lo < covered) return false;  // two runs take the same bytes
      covered = runs[end].hi;
    }
    if (end == first || end - first > kCheckedRuns) return false;
    uint32_t crc = 0;
    uint64_t at = lo;  // checksummed up to here
    for (size_t r = first; r < end; ++r) {
      const uint64_t from = std::max(lo, runs[r].lo), to = std::min(hi, runs[r].hi);
      crc = crc32c(chunk + (at - lo), size_t(from - at), crc);  // bytes no run takes
      crc = crc32c_copy(runs[r].dst + (from - runs[r].lo), chunk + (from - lo), size_t(to - from),
                        crc);
      at = to;
    }
    crc = crc32c(chunk + (at - lo), size_t(hi - at), crc);
    if (crc != sp.crc32c[c]) check_chunk(path_, tensor, sp, c, chunk);  // throws, naming it
    return true;
  }

  const std::string& path_;
  const Files& files_;
  const io::CheckpointManifest& manifest_;
  const ReadPlan& plan_;
  const std::vector<Block>& blocks_;
  const std::function<char*(const ReadPlan::Copy&, uint64_t)> dst_of_;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> first_error_{std::numeric_limits<size_t>::max()};
  std::mutex mu_;  // guards error_ (and first_error_'s decrease)
  std::exception_ptr error_;
};

uint64_t load_local(const std::string& path, const io::CheckpointManifest& manifest,
                    const std::vector<StatePiece>& pieces) {
  const ReadPlan plan = plan_load(path, manifest, requests_of(pieces));
  // Destination staging: CPU, the stored dtype; pieces already so are written in place.
  std::vector<Tensor> staging(pieces.size());
  std::vector<char> in_place(pieces.size(), 0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const StatePiece& p = pieces[i];
    const DType stored = manifest.tensors.at(p.name).dtype;
    in_place[i] = p.data.device().is_cpu() && p.data.is_contiguous() && p.data.dtype() == stored;
    staging[i] = in_place[i] ? p.data : Tensor::empty({p.region.numel()}, stored);
  }
  auto dst_of = [&](const ReadPlan::Copy& c, uint64_t es) {
    return static_cast<char*>(staging[c.request].data_ptr()) + uint64_t(c.dst_index) * es;
  };
  // The blocks, in plan order (Note [Parallel load]); every file is opened (and its size
  // checked) before the first read.
  Files files(path, manifest);
  std::vector<Block> blocks;
  for (size_t s = 0; s < plan.sources.size(); ++s) {
    const ReadPlan::Source& src = plan.sources[s];
    const io::TensorEntry& t = manifest.tensors.at(src.tensor);
    const io::StoredPiece& sp = t.pieces[src.piece];
    files.open(sp.file);
    const uint64_t per_block = std::max<uint64_t>(1, kBlockBytes / sp.chunk_bytes);
    for (const auto& [first, last] : src.chunk_runs) {
      for (uint64_t k = first; k <= last; k += per_block) {
        Block b{s, k, std::min(last, k + per_block - 1), 0, 0};
        std::tie(b.begin, b.end) = ReadPlan::chunk_span(sp, b.first, b.last);
        blocks.push_back(b);
      }
    }
  }
  BlockWorkers(path, files, manifest, plan, blocks, dst_of).run();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!in_place[i])
      Tensor(pieces[i].data)
          .copy_(staging[i]
                     .to(pieces[i].data.dtype())
                     .to(pieces[i].data.device())
                     .reshape(pieces[i].data.shape()));
    else if (pieces[i].data.numel() > 0)
      pieces[i].data.storage()->bump_version();  // written in place: See Note [Version counter]
  }
  return plan.bytes();
}

}  // namespace

std::vector<PieceRequest> requests_of(const std::vector<StatePiece>& pieces) {
  std::vector<PieceRequest> out;
  out.reserve(pieces.size());
  for (const StatePiece& p : pieces) {
    LOOM_CHECK(p.data.numel() == p.region.numel(), "checkpoint load: piece ", p.name, " ",
               p.region.str(), " has ", p.data.numel(), " elements of room for ", p.region.numel());
    out.push_back({p.name, p.global_shape, p.region, p.data.dtype()});
  }
  return out;
}

std::pair<uint64_t, uint64_t> ReadPlan::chunk_span(const io::StoredPiece& sp, uint64_t first,
                                                   uint64_t last) {
  return {first * sp.chunk_bytes, std::min(sp.nbytes, (last + 1) * sp.chunk_bytes)};
}

uint64_t ReadPlan::bytes() const {
  uint64_t n = 0;
  for (const Source& s : sources) n += s.bytes;
  return n;
}

std::map<std::string, uint64_t> ReadPlan::bytes_per_file(
    const io::CheckpointManifest& manifest) const {
  std::map<std::string, uint64_t> out;
  for (const Source& s : sources)
    out[manifest.tensors.at(s.tensor).pieces[s.piece].file] += s.bytes;
  return out;
}

ReadPlan plan_load(const std::string& path, const io::CheckpointManifest& manifest,
                   const std::vector<PieceRequest>& requests) {
  // Per (tensor, stored piece): the copies out of it.
  std::map<std::pair<std::string, size_t>, std::vector<ReadPlan::Copy>> copies;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PieceRequest& p = requests[i];
    auto it = manifest.tensors.find(p.name);
    LOOM_CHECK(it != manifest.tensors.end(), "checkpoint ", path, " has no tensor ", p.name,
               " (saved from a different model or optimizer?)");
    const io::TensorEntry& t = it->second;
    LOOM_CHECK(t.shape == p.global_shape, "checkpoint ", path, ": tensor ", p.name, " is ",
               shape_str(t.shape), " but this model's is ", shape_str(p.global_shape),
               " (a different model?)");
    LOOM_CHECK(t.dtype == p.dtype || (is_floating(t.dtype) && is_floating(p.dtype)), "checkpoint ",
               path, ": tensor ", p.name, " is ", dtype_name(t.dtype),
               " and cannot be loaded into ", dtype_name(p.dtype));
    // Each wanted element must come from exactly one stored piece: the manifest's element
    // count alone would not notice two overlapping pieces hiding a gap. The runs, sorted, must
    // tile [0, numel) with neither gap nor overlap.
    std::vector<std::pair<int64_t, int64_t>> runs;  // (first dst index, length)
    for (size_t s = 0; s < t.pieces.size(); ++s) {
      for_each_overlap(t.shape, t.pieces[s].region, p.region,
                       [&](int64_t src_index, int64_t dst_index, int64_t n) {
                         copies[{p.name, s}].push_back({i, src_index, dst_index, n});
                         runs.emplace_back(dst_index, n);
                       });
    }
    std::sort(runs.begin(), runs.end());
    int64_t next = 0;  // the first element no run has covered yet
    for (const auto& [first, n] : runs) {
      LOOM_CHECK(first >= next, "checkpoint ", path, ": tensor ", p.name, " stores element ",
                 p.region.begin + first, " of box ", p.region.str(),
                 " twice (a damaged manifest?)");
      LOOM_CHECK(first == next, "checkpoint ", path, ": tensor ", p.name, " region ",
                 p.region.str(), ": elements from ", p.region.begin + next,
                 " are in no stored piece (a damaged manifest?)");
      next = first + n;
    }
    LOOM_CHECK(next == p.region.numel(), "checkpoint ", path, ": tensor ", p.name, " region ",
               p.region.str(), ": ", p.region.numel() - next,
               " of its elements are in no stored piece (a damaged manifest?)");
  }
  ReadPlan plan;
  for (auto& [key, cs] : copies) {
    const io::TensorEntry& t = manifest.tensors.at(key.first);
    const io::StoredPiece& sp = t.pieces[key.second];
    const uint64_t es = dtype_size(t.dtype);
    std::vector<char> needed((sp.nbytes + sp.chunk_bytes - 1) / sp.chunk_bytes, 0);
    for (const ReadPlan::Copy& c : cs)
      for (uint64_t k = uint64_t(c.src_index) * es / sp.chunk_bytes;
           k <= (uint64_t(c.src_index + c.n) * es - 1) / sp.chunk_bytes; ++k)
        needed[k] = 1;
    ReadPlan::Source src{key.first, key.second, std::move(cs), {}, 0};
    for (uint64_t k = 0; k < needed.size();) {
      if (!needed[k]) {
        ++k;
        continue;
      }
      uint64_t last = k;
      while (last + 1 < needed.size() && needed[last + 1]) ++last;
      src.chunk_runs.emplace_back(k, last);
      const auto [begin, end] = ReadPlan::chunk_span(sp, k, last);
      src.bytes += end - begin;
      k = last + 1;
    }
    plan.sources.push_back(std::move(src));
  }
  return plan;
}

LoadStats load(const std::string& path, const io::CheckpointManifest& manifest,
               const std::vector<StatePiece>& pieces, comm::Communicator& group) {
  const auto start = std::chrono::steady_clock::now();
  LoadStats stats;
  agree(group, "checkpoint load from " + path,
        capture([&] { stats.bytes_read = load_local(path, manifest, pieces); }));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

void verify(const std::string& path, const io::CheckpointManifest& manifest) {
  Files files(path, manifest);
  for (const io::CheckpointFile& f : manifest.files) files.open(f.name);
  std::vector<char> buf;
  for (const auto& [name, t] : manifest.tensors) {
    for (const io::StoredPiece& p : t.pieces) {
      buf.resize(std::min(p.nbytes, p.chunk_bytes));
      for (uint64_t at = 0; at < p.nbytes; at += p.chunk_bytes) {
        const uint64_t n = std::min(p.chunk_bytes, p.nbytes - at);
        files.read_at(p.file, p.offset + at, buf.data(), n);
        check_chunk(path, name, p, at / p.chunk_bytes, buf.data());
      }
    }
  }
}

}  // namespace loom::parallel::checkpoint
