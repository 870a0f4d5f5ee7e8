#include <algorithm>
#include <atomic>
#include <charconv>
#include <mutex>

#include "core/cuda_util.h"
#include "gpukit/device.h"
#include "gpukit/errors.h"

namespace gk {

namespace {
constexpr int kMaxDevices = 64;
std::atomic<bool> g_failed[kMaxDevices];
std::atomic<int> g_fail_code[kMaxDevices];
}  // namespace

bool built_with_cuda() { return GPUKIT_WITH_CUDA != 0; }

int cuda_device_count() {
#if GPUKIT_WITH_CUDA
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: clear the (non-sticky) error
      return 0;
    }
    return std::min(n, kMaxDevices);
  }();
  return count;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device Device::parse(std::string_view s, const char* arg) {
  if (s == "cpu") return Device::cpu();
  if (s.substr(0, 4) == "cuda") {
    int idx = 0;
    if (s.size() > 4) {
      if (s[4] != ':' || s.size() == 5)
        throw ValueError(cat(arg, ": invalid device string '", s, "' (expected 'cpu', 'cuda' or 'cuda:N')"));
      auto r = std::from_chars(s.data() + 5, s.data() + s.size(), idx);
      if (r.ec != std::errc() || r.ptr != s.data() + s.size() || idx < 0)
        throw ValueError(cat(arg, ": invalid device string '", s, "' (expected 'cpu', 'cuda' or 'cuda:N')"));
    }
    int n = cuda_device_count();
    if (idx >= n) {
      if (n == 0)
        throw ValueError(cat(arg, ": '", s, "' requested but no CUDA device is available",
                             built_with_cuda() ? " (no GPU or no driver found)" : " (gpukit was built without CUDA)"));
      throw ValueError(cat(arg, ": '", s, "' does not exist (", n, " CUDA device(s))"));
    }
    return Device::cuda(idx);
  }
  throw ValueError(cat(arg, ": invalid device string '", s, "' (expected 'cpu', 'cuda' or 'cuda:N')"));
}

std::vector<Device> devices() {
  std::vector<Device> v{Device::cpu()};
  for (int i = 0; i < cuda_device_count(); ++i) v.push_back(Device::cuda(i));
  return v;
}

bool device_failed(Device d) { return d.is_cuda() && g_failed[d.index].load(); }

void check_device_usable(Device d) {
  if (device_failed(d))
    throw CudaError(cat("device ", d.str(), " has failed after an earlier fatal CUDA error (code ",
                        g_fail_code[d.index].load(),
                        "); its context is unusable. Restart the process to use it again."),
                    g_fail_code[d.index].load(), true);
}

DeviceProperties device_properties(Device d) {
  DeviceProperties p;
  if (d.is_cpu()) {
    p.name = "cpu";
    return p;
  }
#if GPUKIT_WITH_CUDA
  if (d.index >= cuda_device_count()) throw ValueError(cat("device: ", d.str(), " does not exist"));
  cudaDeviceProp prop;
  GK_CUDA_CHECK(cudaGetDeviceProperties(&prop, d.index));
  p.name = prop.name;
  p.multiprocessors = prop.multiProcessorCount;
  p.total_memory = prop.totalGlobalMem;
  p.major = prop.major;
  p.minor = prop.minor;
  p.l2_cache = size_t(prop.l2CacheSize);
  p.shared_per_block_optin = prop.sharedMemPerBlockOptin;
#endif
  return p;
}

void synchronize(Device d) {
  if (d.is_cpu()) return;
#if GPUKIT_WITH_CUDA
  check_device_usable(d);
  detail::set_device(d.index);
  GK_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

#if GPUKIT_WITH_CUDA
namespace detail {

bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction: case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc: case cudaErrorAssert: case cudaErrorLaunchTimeout: case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

void mark_failed(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  g_fail_code[device].store(0);
  g_failed[device].store(true);
}

[[noreturn]] void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
  bool sticky = is_sticky(err);
  int dev = -1;
  if (sticky) {
    cudaGetDevice(&dev);
    if (dev >= 0 && dev < kMaxDevices) {
      g_fail_code[dev].store(int(err));
      g_failed[dev].store(true);
    }
  } else {
    cudaGetLastError();  // clear non-sticky errors so later calls are unaffected
  }
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  throw CudaError(cat("CUDA error ", int(err), " (", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
                      ") in ", what, " at ", base, ":", line,
                      sticky ? "; the device is now marked failed" : ""),
                  int(err), sticky);
}

void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(e, kernel, "kernel launch", 0);
}

void set_device(int d) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == d) return;
  GK_CUDA_CHECK(cudaSetDevice(d));
}

}  // namespace detail
#endif

}  // namespace gk
