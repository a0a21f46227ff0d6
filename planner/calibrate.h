// Measures the rates the cost model divides by, on the machine it runs on: the GEMM efficiency
// curve (loom's matmul at a layer's shapes and transposes, at several sizes, fitted to
// t = (f + half) / rate), the element-wise bandwidth (what one of loom's transformer blocks spends
// beyond its GEMMs, per byte of the cost model's element-wise traffic; See CalibrationOptions) and,
// when the communicator has more than one rank, the ring all-reduce's latency and bandwidth (two
// sizes, fitted to cost_model.h's formula). All ranks take part (sharing the machine as a run
// would), each measurement the mean over the ranks; every rank returns the same figures.
//
// Across nodes (the communicator's ranks spread evenly over two or more nodes of two or more ranks
// each) both link levels are measured, inside a node and across nodes (Note [Calibrating two link
// levels]); from one node, or one rank per node, one level is: both `intra` and `inter` get it.
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "planner/cluster.h"
#include "planner/workload.h"

namespace loom::planner {

struct CalibrationOptions {
  Device device = Device::cpu();
  DType dtype = DType::kF32;
  int repeats = 5;  // timed runs per measurement (GEMMs keep the fastest, the rest the median)
  int64_t max_gemm = 1024;  // GEMMs of 4n x n by n x n for n = 64, 128, ... up to max_gemm / 2
  // The peak the GEMM rate is stated against (MFU's denominator): 0 takes the fitted large-GEMM
  // rate itself (efficiency 1), as on a CPU without a datasheet figure.
  double peak_flops = 0;
  // The element-wise term is fitted on loom's own transformer block at this shape (hidden, heads,
  // seq; vocab for the model around it) and micro-batch: one block's measured forward + backward,
  // less the GEMM curve's time for its GEMMs, is what its element-wise bytes cost. Calibrate at
  // the shape you plan for when you can.
  TransformerShape block{1, 256, 4, 128, 256, {}};  // layers: unused
  int block_batch = 4;
  // Each rank's node (comm::Hierarchy's node_of_rank); empty: the host names' (comm::node_map).
  // A test may split one host.
  std::vector<int> node_of_rank;
};

Cluster calibrate(Cluster base, const std::shared_ptr<comm::Communicator>& comm,
                  const CalibrationOptions& o = {});

}  // namespace loom::planner
