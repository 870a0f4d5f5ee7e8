#include "ops/registry.h"

#include <map>
#include <mutex>
#include <string>

#include "gpukit/ops.h"

namespace gk {
namespace {
std::mutex& reg_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, OpEntry>& reg() {
  static std::map<std::string, OpEntry> m;
  return m;
}
}  // namespace

detail::OpRegistrar::OpRegistrar(bool cuda, std::initializer_list<const char*> names) {
  std::lock_guard<std::mutex> lk(reg_mu());
  for (const char* n : names) {
    auto& e = reg()[n];
    e.name = n;
    (cuda ? e.cuda : e.cpu) = true;
  }
}

std::vector<OpEntry> registered_ops() {
  std::lock_guard<std::mutex> lk(reg_mu());
  std::vector<OpEntry> v;
  for (auto& [k, e] : reg()) v.push_back(e);
  return v;
}
}  // namespace gk
