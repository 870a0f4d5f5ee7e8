// Internal helpers for calling the CUDA runtime: every call is checked, and a
// sticky fault marks the device as failed.
#pragma once
#include "gpukit/device.h"
#include "gpukit/errors.h"

#if GPUKIT_WITH_CUDA
#include <cuda_runtime.h>

namespace gk::detail {
[[noreturn]] void throw_cuda(cudaError_t err, const char* what, const char* file, int line);
void mark_failed(int device);
bool is_sticky(cudaError_t err);
// Checks the launch of a kernel just issued (cudaGetLastError).
void check_launch(const char* kernel);
// Makes `d` the calling thread's current CUDA device (cheap when it already is).
void set_device(int d);
}  // namespace gk::detail

#define GK_CUDA_CHECK(expr)                                                      \
  do {                                                                           \
    cudaError_t gk_err_ = (expr);                                                \
    if (gk_err_ != cudaSuccess) ::gk::detail::throw_cuda(gk_err_, #expr, __FILE__, __LINE__); \
  } while (0)
#define GK_LAUNCH_CHECK(name) ::gk::detail::check_launch(name)
#endif
