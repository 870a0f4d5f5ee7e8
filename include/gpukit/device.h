// Devices: "cpu" and "cuda:N". Querying works on machines with no GPU or driver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gk {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  constexpr Device() = default;
  constexpr Device(DeviceKind k, int i) : kind(k), index(k == DeviceKind::CPU ? 0 : i) {}
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceKind::CUDA, i}; }
  // "cpu", "cuda", "cuda:1"; throws ValueError naming `arg` for anything else or a
  // CUDA device that does not exist.
  static Device parse(std::string_view s, const char* arg = "device");
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.kind == b.kind && a.index == b.index; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

struct DeviceProperties {
  std::string name;
  int multiprocessors = 0;
  size_t total_memory = 0;
  int major = 0, minor = 0;
  size_t l2_cache = 0;
  size_t shared_per_block_optin = 0;
};

// Number of usable CUDA devices: 0 when gpukit was built without CUDA, or there
// is no driver or no GPU.
int cuda_device_count();
bool cuda_available();
// Whether gpukit was compiled with the CUDA backend.
bool built_with_cuda();
DeviceProperties device_properties(Device d);
std::vector<Device> devices();  // cpu first, then every CUDA device
// Throws CudaError if a sticky fault earlier marked the device as failed.
void check_device_usable(Device d);
bool device_failed(Device d);
// Blocks until all work on every stream of the device is done.
void synchronize(Device d);

}  // namespace gk
