// Counters of the quantized GEMV's residual add + RMSNorm epilogue (ops/norm_epi_args.h).
#include <atomic>

#include "ops/norm_epi_args.h"

namespace gk {
namespace {
std::atomic<int64_t> g_fused{0}, g_separate{0};
}  // namespace
void norm_epi_count(bool fused) { (fused ? g_fused : g_separate).fetch_add(1, std::memory_order_relaxed); }
int64_t norm_epi_calls(bool fused) { return (fused ? g_fused : g_separate).load(std::memory_order_relaxed); }
}  // namespace gk
