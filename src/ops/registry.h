// Which ops each backend implements. Each backend file registers the ops it has;
// the test harness fails for an op that lacks either backend.
#pragma once
#include <initializer_list>

namespace gk::detail {
struct OpRegistrar {
  OpRegistrar(bool cuda, std::initializer_list<const char*> names);
};
}  // namespace gk::detail

#define GK_CONCAT_(a, b) a##b
#define GK_CONCAT(a, b) GK_CONCAT_(a, b)
#define GK_REGISTER_CPU_OPS(...) \
  static ::gk::detail::OpRegistrar GK_CONCAT(gk_cpu_ops_, __LINE__)(false, {__VA_ARGS__})
#define GK_REGISTER_CUDA_OPS(...) \
  static ::gk::detail::OpRegistrar GK_CONCAT(gk_cuda_ops_, __LINE__)(true, {__VA_ARGS__})
