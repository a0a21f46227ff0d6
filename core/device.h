// Where a tensor lives: the host, or CUDA device n.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return Device{DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return Device{DeviceType::kCUDA, index}; }
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// True when loom was built with CUDA and at least one GPU is usable.
bool cuda_available();
int cuda_device_count();  // 0 without CUDA or without a GPU

}  // namespace loom
