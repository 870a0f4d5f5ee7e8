// Internal runtime hooks shared by the core files.
#pragma once
#include <string>
#include <vector>

#include "gpukit/stream.h"

namespace gk {
struct GraphState;
namespace detail {
// While a graph captures on stream s, allocations on s belong to the graph.
void graph_capture_begin(GraphState* g, const Stream& s);
void graph_capture_end(GraphState* g, const Stream& s);
// Called when the graph is destroyed: its blocks return to the cache.
void graph_release_memory(GraphState* g);

// Test hook of the allocator (used by the op-test harness, off by default).
// With a poison byte set (0..255), every new allocation on any device (except
// while a graph captures) is filled with that byte and framed by kDebugGuard
// guard bytes of the same value just before its first and after its last byte.
// The guards are checked when the memory is freed and by debug_check_guards(),
// which synchronizes the devices and returns (and clears) every violation seen.
inline constexpr size_t kDebugGuard = 256;
void debug_set_alloc_poison(int byte);  // -1: off
int debug_alloc_poison();
std::vector<std::string> debug_check_guards();
}  // namespace detail
}  // namespace gk
