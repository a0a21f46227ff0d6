// The machine a plan runs on: how many GPUs, how they are grouped into nodes, what one GPU
// computes and holds, and the two link levels collectives cross (inside a node: NVLink; between
// nodes: the network, per GPU). Presets come from vendor datasheets; a profile file (JSON, the
// fields below by name) carries measured rates instead (`loom-plan --calibrate` writes one).
//
// Rates are what the cost model divides by. A link level is alpha-beta: a message of n bytes
// costs latency + n / bandwidth on it; the bandwidth is one direction of one GPU's link.
#pragma once

#include <string>

namespace loom::planner {

struct LinkLevel {
  double latency_s = 0.0;
  double bandwidth = 0.0;  // bytes/s, one direction, per GPU
};

struct DeviceRates {
  std::string name;               // "h100-sxm"
  double peak_flops = 0.0;        // dense 16-bit tensor-core FLOP/s (the MFU denominator)
  double memory_bytes = 0.0;      // what a GPU holds
  double memory_bandwidth = 0.0;  // bytes/s of the GPU's own memory
  // The GEMM efficiency curve: a GEMM of f FLOPs runs at peak * gemm_efficiency * f /
  // (f + gemm_half_flops): large GEMMs approach gemm_efficiency of the peak, small ones are
  // latency-bound. (Calibrated; the defaults are fits to published cuBLAS figures.)
  double gemm_efficiency = 0.0;
  double gemm_half_flops = 0.0;
  // Memory the training state cannot use: the CUDA context, library workspaces, and the
  // allocator's fragmentation as a fraction of what is allocated.
  double reserved_bytes = 0.0;
  double fragmentation = 0.0;
  // Fixed time per micro-batch that no byte or FLOP explains (kernel launches, host work the
  // device waits for): per transformer block (forward + backward) and for the rest of the model
  // (embedding, head, loss). Calibrated (Note [Calibrating the block]); 0 in the presets.
  double block_overhead_s = 0.0;
  double rest_overhead_s = 0.0;
  // The rate a transformer block's element-wise traffic moves at, when calibrated on the block
  // (its attention and launches included); 0: memory_bandwidth. memory_bandwidth itself stays
  // the element-wise kernels' rate, for the optimizer, the loss and the embedding.
  double block_bandwidth = 0.0;
};

// The bandwidth a block's element-wise bytes are divided by (DeviceRates::block_bandwidth).
inline double block_bandwidth(const DeviceRates& d) {
  return d.block_bandwidth > 0 ? d.block_bandwidth : d.memory_bandwidth;
}

struct Cluster {
  int gpus = 0;
  int gpus_per_node = 0;
  DeviceRates device;
  LinkLevel intra;     // inside a node
  LinkLevel inter;     // between nodes
  void check() const;  // throws loom::Error naming what is missing or inconsistent
  std::string str() const;
};

// "a100-80gb", "h100-sxm", "h200"; an unknown name lists the choices.
DeviceRates device_preset(const std::string& name);
// This host's CPU as a "device" for `ranks_per_node` ranks: no datasheet, so its rates are left
// to calibration; each rank may use its share of the physical memory, nothing reserved and no
// fragmentation: the model counts tensor bytes, which is what loom's host allocator counts (its
// peak is the one loom-gpt prints; glibc's own overhead is not in it).
DeviceRates cpu_device(int ranks_per_node);
// The presets' link levels for a node of that GPU (NVLink, and one InfiniBand NIC per GPU).
LinkLevel intra_preset(const std::string& name);
LinkLevel inter_preset(const std::string& name);
Cluster cluster_preset(const std::string& name, int gpus, int gpus_per_node);

// A profile file: {"device": {...DeviceRates fields...}, "intra": {...}, "inter": {...}}; any
// field it leaves out keeps `base`'s value. Errors name the file and the field.
Cluster read_profile(const std::string& path, Cluster base);
void write_profile(const std::string& path, const Cluster& cluster);

}  // namespace loom::planner
