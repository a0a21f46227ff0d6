#include "planner/cluster.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <unistd.h>

#include "core/error.h"

namespace loom::planner {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Preset {
  const char* name;
  DeviceRates device;
  LinkLevel intra, inter;
};

// Datasheet figures: dense bf16 tensor-core peak, memory and its bandwidth (A100 SXM4 80GB,
// H100 SXM5, H200 SXM); NVLink per direction (A100 600 GB/s, H100/H200 900 GB/s both ways); one
// InfiniBand NIC per GPU (HDR 200 Gb/s on DGX A100, NDR 400 Gb/s on DGX H100). Latencies are
// typical NCCL small-message figures. The GEMM curve: the A100's efficiency is calibrated on one
// published run (Korthikanti et al.'s 175B step, planner_test's PlannerPublished, which predicts
// their other seven steps from it); the H100/H200 figure is a first guess from cuBLAS's published
// large-GEMM rates, not calibrated yet. GEMMs of gemm_half_flops run at half the efficiency.
const Preset kPresets[] = {
    {"a100-80gb",
     {"a100-80gb", 312e12, 80 * kGiB, 2.039e12, 0.66, 0.5e9, 2.0 * kGiB, 0.05},
     {5e-6, 300e9},
     {10e-6, 25e9}},
    {"h100-sxm",
     {"h100-sxm", 989.4e12, 80 * kGiB, 3.35e12, 0.75, 1.5e9, 2.0 * kGiB, 0.05},
     {5e-6, 450e9},
     {10e-6, 50e9}},
    {"h200",
     {"h200", 989.4e12, 141e9, 4.8e12, 0.75, 1.5e9, 2.0 * kGiB, 0.05},
     {5e-6, 450e9},
     {10e-6, 50e9}},
};

const Preset& find_preset(const std::string& name) {
  std::string names;
  for (const Preset& p : kPresets) {
    if (name == p.name) return p;
    names += names.empty() ? "" : ", ";
    names += p.name;
  }
  LOOM_FAIL("planner: unknown GPU '", name, "' (presets: ", names,
            "; or give the rates with --peak-tflops --memory-gb --intra-gbps --inter-gbps)");
}

void read_field(const nlohmann::json& j, const char* key, double& out, const std::string& where) {
  if (!j.contains(key)) return;
  LOOM_CHECK(j[key].is_number(), where, ": '", key, "' must be a number, got ", j[key].dump());
  out = j[key].get<double>();
}

}  // namespace

DeviceRates device_preset(const std::string& name) { return find_preset(name).device; }

DeviceRates cpu_device(int ranks_per_node) {
  LOOM_CHECK(ranks_per_node > 0, "cpu_device: ", ranks_per_node, " ranks per node");
  DeviceRates d;
  d.name = "cpu";
  d.memory_bytes =
      double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / double(ranks_per_node);
  d.reserved_bytes = 0;
  d.fragmentation = 0;
  return d;
}
LinkLevel intra_preset(const std::string& name) { return find_preset(name).intra; }
LinkLevel inter_preset(const std::string& name) { return find_preset(name).inter; }

Cluster cluster_preset(const std::string& name, int gpus, int gpus_per_node) {
  const Preset& p = find_preset(name);
  Cluster c;
  c.gpus = gpus;
  c.gpus_per_node = gpus_per_node;
  c.device = p.device;
  c.intra = p.intra;
  c.inter = p.inter;
  c.check();
  return c;
}

void Cluster::check() const {
  LOOM_CHECK(gpus > 0 && gpus_per_node > 0, "planner: gpus (", gpus, ") and gpus per node (",
             gpus_per_node, ") must be positive");
  LOOM_CHECK(gpus <= gpus_per_node || gpus % gpus_per_node == 0, "planner: ", gpus,
             " GPUs do not fill whole nodes of ", gpus_per_node);
  LOOM_CHECK(device.peak_flops > 0 && device.memory_bytes > 0 && device.memory_bandwidth > 0,
             "planner: the GPU's peak FLOP/s, memory and memory bandwidth must be positive (",
             device.name, ")");
  LOOM_CHECK(
      device.gemm_efficiency > 0 && device.gemm_efficiency <= 1 && device.gemm_half_flops >= 0,
      "planner: gemm_efficiency must be in (0, 1] and gemm_half_flops >= 0");
  LOOM_CHECK(
      device.block_overhead_s >= 0 && device.rest_overhead_s >= 0 && device.block_bandwidth >= 0,
      "planner: block_overhead_s, rest_overhead_s and block_bandwidth must be >= 0");
  LOOM_CHECK(
      intra.bandwidth > 0 && inter.bandwidth > 0 && intra.latency_s >= 0 && inter.latency_s >= 0,
      "planner: link bandwidths must be positive and latencies >= 0");
}

std::string Cluster::str() const {
  char buf[384];
  int n = std::snprintf(buf, sizeof buf,
                        "%d x %s (%d per node): %.1f TFLOP/s (GEMMs at %.1f%% of it), %.1f GB, "
                        "links %.0f GB/s inside a node, %.1f GB/s between nodes",
                        gpus, device.name.c_str(), gpus_per_node, device.peak_flops / 1e12,
                        100 * device.gemm_efficiency, device.memory_bytes / 1e9,
                        intra.bandwidth / 1e9, inter.bandwidth / 1e9);
  // A calibrated or shipped profile's fixed times (DeviceRates::block_overhead_s).
  if (device.block_overhead_s > 0 && n > 0 && size_t(n) < sizeof buf)
    std::snprintf(buf + n, sizeof buf - size_t(n), ", %.2f ms fixed per layer and micro-batch",
                  1e3 * device.block_overhead_s);
  return buf;
}

Cluster read_profile(const std::string& path, Cluster base) {
  std::ifstream in(path);
  LOOM_CHECK(in.good(), "planner: cannot open the profile '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("planner: the profile '", path, "' is not JSON: ", e.what());
  }
  LOOM_CHECK(j.is_object(), "planner: the profile '", path, "' must be a JSON object");
  if (j.contains("device")) {
    const auto& d = j["device"];
    const std::string where = path + ": device";
    if (d.contains("name") && d["name"].is_string()) base.device.name = d["name"];
    read_field(d, "peak_flops", base.device.peak_flops, where);
    read_field(d, "memory_bytes", base.device.memory_bytes, where);
    read_field(d, "memory_bandwidth", base.device.memory_bandwidth, where);
    read_field(d, "gemm_efficiency", base.device.gemm_efficiency, where);
    read_field(d, "gemm_half_flops", base.device.gemm_half_flops, where);
    read_field(d, "block_overhead_s", base.device.block_overhead_s, where);
    read_field(d, "rest_overhead_s", base.device.rest_overhead_s, where);
    read_field(d, "block_bandwidth", base.device.block_bandwidth, where);
    read_field(d, "reserved_bytes", base.device.reserved_bytes, where);
    read_field(d, "fragmentation", base.device.fragmentation, where);
  }
  for (auto [key, level] : {std::pair{"intra", &base.intra}, std::pair{"inter", &base.inter}}) {
    if (!j.contains(key)) continue;
    read_field(j[key], "latency_s", level->latency_s, path + ": " + key);
    read_field(j[key], "bandwidth", level->bandwidth, path + ": " + key);
  }
  return base;
}

void write_profile(const std::string& path, const Cluster& c) {
  nlohmann::json j;
  j["device"] = {{"name", c.device.name},
                 {"peak_flops", c.device.peak_flops},
                 {"memory_bytes", c.device.memory_bytes},
                 {"memory_bandwidth", c.device.memory_bandwidth},
                 {"gemm_efficiency", c.device.gemm_efficiency},
                 {"gemm_half_flops", c.device.gemm_half_flops},
                 {"block_overhead_s", c.device.block_overhead_s},
                 {"rest_overhead_s", c.device.rest_overhead_s},
                 {"block_bandwidth", c.device.block_bandwidth},
                 {"reserved_bytes", c.device.reserved_bytes},
                 {"fragmentation", c.device.fragmentation}};
  // A level with no bandwidth was not measured (calibrating on one rank): left out, so reading
  // the profile keeps the preset's.
  if (c.intra.bandwidth > 0)
    j["intra"] = {{"latency_s", c.intra.latency_s}, {"bandwidth", c.intra.bandwidth}};
  if (c.inter.bandwidth > 0)
    j["inter"] = {{"latency_s", c.inter.latency_s}, {"bandwidth", c.inter.bandwidth}};
  std::ofstream out(path);
  LOOM_CHECK(out.good(), "planner: cannot write the profile '", path, "'");
  out << j.dump(2) << "\n";
  LOOM_CHECK(out.good(), "planner: writing the profile '", path, "' failed");
}

}  // namespace loom::planner
