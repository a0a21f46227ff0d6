#include "core/device.h"

#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace loom {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string num = text.substr(5);
    LOOM_CHECK(!num.empty() && num.find_first_not_of("0123456789") == std::string::npos,
               "device: cannot parse '", text, "' (expected cpu, cuda or cuda:N)");
    return cuda(std::stoi(num));
  }
  LOOM_FAIL("device: cannot parse '", text, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

int cuda_device_count() { return cuda_rt::device_count(); }
bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace loom
