// Whether a load's bytes sit in this machine's page cache: mincore() over each data file's
// mapping. TrainingState::load uses it to choose how ZeRO's parameters come in (Note [ZeRO's
// parameters read whole when cached] in training_state.cpp).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "parallel/checkpoint/checkpoint.h"

namespace loom::parallel::checkpoint {

namespace {

// Whether bytes [begin, end) of the file at `path` are all resident. False where the file does
// not open or map: the load itself reports a missing or damaged file.
bool resident(const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    ::close(fd);
    return false;
  }
  const uint64_t size = uint64_t(st.st_size);
  // A read-only shared mapping touches no page: mincore reports the page cache's state.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return false;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core;
  bool all = true;
  for (const auto& [begin, end] : ranges) {
    if (end > size) {  // a truncated file: the load names it
      all = false;
      break;
    }
    const uint64_t first = begin / page * page;
    if (end <= first) continue;
    in_core.resize((end - first + page - 1) / page);
    if (::mincore(static_cast<char*>(map) + first, end - first, in_core.data()) != 0) {
      all = false;
      break;
    }
    for (unsigned char c : in_core) all = all && (c & 1);
    if (!all) break;
  }
  ::munmap(map, size);
  return all;
}

}  // namespace

bool in_page_cache(const std::string& path, const io::CheckpointManifest& manifest,
                   const std::vector<StatePiece>& pieces) {
  try {
    const ReadPlan plan = plan_load(path, manifest, requests_of(pieces));
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ranges;  // per data file
    for (const ReadPlan::Source& src : plan.sources) {
      const io::StoredPiece& sp = manifest.tensors.at(src.tensor).pieces[src.piece];
      for (const auto& [first, last] : src.chunk_runs) {
        const auto [begin, end] = ReadPlan::chunk_span(sp, first, last);
        ranges[sp.file].emplace_back(sp.offset + begin, sp.offset + end);
      }
    }
    for (const auto& [file, r] : ranges) {
      if (!resident((std::filesystem::path(path) / file).string(), r)) return false;
    }
    return true;
  } catch (const std::exception&) {  // a plan the load will refuse, naming why
    return false;
  }
}

}  // namespace loom::parallel::checkpoint
