// The manifest of a loom training checkpoint: one JSON file per saved step that says, for every
// tensor of the training state, its global name, shape and dtype, and for every stored piece of
// it which file and bytes hold it, which region of the global tensor those bytes are, and their
// checksums. Everything else about the run (step, model config, layout, data position, loss
// scaler, optimizer step counts) is free-form JSON under "state". The data files are safetensors
// files (core/io/safetensors.h), one per saving rank. The format is documented in the README
// ("Checkpoints"); parallel/checkpoint/ writes and reads it.
//
// Note [Checkpoint regions]
// A piece is a box of the global tensor (an origin and an extent per dimension) plus an element
// range [begin, end) of that box in row-major order. A tensor-parallel shard is one box (or a few:
// attention's q, k and v blocks); a ZeRO shard of a flat bucket is a range of the box its
// parameter occupies; a whole tensor is the full box. Any layout describes its pieces this way,
// so a checkpoint can be loaded by any other: a loading rank copies the intersection of each
// stored piece with each piece it wants (parallel/checkpoint/region.h).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace loom::io {

// See Note [Checkpoint regions].
struct Region {
  Shape offset;  // the box's origin in the global tensor
  Shape shape;   // the box's extent
  int64_t begin = 0;
  int64_t end = 0;  // elements [begin, end) of the box, row-major

  static Region whole(const Shape& global_shape);
  static Region box(Shape offset, Shape shape);  // all of the box
  int64_t numel() const { return end - begin; }
  int64_t box_numel() const { return shape_numel(shape); }
  // Throws loom::Error naming `what` unless the region lies inside a tensor of `global_shape`.
  void check_inside(const Shape& global_shape, const std::string& what) const;
  bool operator==(const Region& other) const = default;
  std::string str() const;  // "[0:4, 8:16] elements [0, 32)"
};

struct StoredPiece {
  Region region;
  std::string file;     // the data file, relative to the checkpoint directory
  std::string key;      // the piece's tensor name inside that safetensors file
  uint64_t offset = 0;  // of its first byte in the file
  uint64_t nbytes = 0;
  uint64_t chunk_bytes = 0;      // the checksums cover chunks of this many bytes (the last shorter)
  std::vector<uint32_t> crc32c;  // one per chunk
};

struct TensorEntry {
  Shape shape;
  DType dtype = DType::kF32;
  std::vector<StoredPiece> pieces;
};

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  int rank = 0;  // the rank that wrote it
};

struct CheckpointManifest {
  static constexpr int kFormatVersion = 1;
  int format_version = kFormatVersion;
  int64_t step = 0;
  nlohmann::json state = nlohmann::json::object();  // the run's non-tensor state
  std::vector<CheckpointFile> files;
  std::map<std::string, TensorEntry> tensors;  // by global name

  std::string to_json() const;
};

// Parses and checks a manifest: the format tag and version, every tensor's dtype and shape, every
// piece inside its tensor with bytes that match its region and checksums that cover its bytes,
// every piece's file listed, and the pieces of each tensor adding up to exactly its elements.
// Throws loom::Error naming `path` and the tensor at fault.
CheckpointManifest parse_checkpoint_manifest(const std::string& text, const std::string& path);

}  // namespace loom::io
