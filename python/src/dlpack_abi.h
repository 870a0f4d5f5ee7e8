// The DLPack ABI, declared here from the DLPack 1.1 specification (structs and
// codes only; the protocol logic lives in dlpack.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace gkpy {
namespace dl {
struct Version { uint32_t major, minor; };
enum DeviceType : int32_t {
  kCPU = 1, kCUDA = 2, kCUDAHost = 3, kOpenCL = 4, kVulkan = 7, kMetal = 8, kVPI = 9, kROCM = 10,
  kROCMHost = 11, kExtDev = 12, kCUDAManaged = 13, kOneAPI = 14, kWebGPU = 15, kHexagon = 16, kMAIA = 17,
};
struct Device { int32_t device_type, device_id; };
enum TypeCode : uint8_t {
  kInt = 0, kUInt = 1, kFloat = 2, kOpaqueHandle = 3, kBfloat = 4, kComplex = 5, kBool = 6,
  kFloat8_e3m4 = 7, kFloat8_e4m3 = 8, kFloat8_e4m3b11fnuz = 9, kFloat8_e4m3fn = 10, kFloat8_e4m3fnuz = 11,
  kFloat8_e5m2 = 12, kFloat8_e5m2fnuz = 13, kFloat8_e8m0fnu = 14,
};
struct DataType { uint8_t code, bits; uint16_t lanes; };
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; may be null (compact row-major) in legacy capsules
  uint64_t byte_offset;
};
struct ManagedTensor {  // legacy capsule "dltensor"
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
inline constexpr uint64_t kFlagReadOnly = 1ull << 0;
inline constexpr uint64_t kFlagIsCopied = 1ull << 1;
struct ManagedTensorVersioned {  // capsule "dltensor_versioned" (DLPack >= 1.0)
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};
static_assert(sizeof(void*) != 8 || sizeof(Tensor) == 48, "DLTensor layout");
static_assert(sizeof(void*) != 8 || sizeof(ManagedTensor) == 64, "DLManagedTensor layout");
static_assert(sizeof(void*) != 8 || offsetof(ManagedTensorVersioned, dl_tensor) == 32, "DLManagedTensorVersioned layout");
}  // namespace dl
}  // namespace gkpy
