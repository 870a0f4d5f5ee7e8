// Internal runtime hooks shared by the core files.
#pragma once
#include "gpukit/stream.h"

namespace gk {
struct GraphState;
namespace detail {
// While a graph captures on stream s, allocations on s belong to the graph.
void graph_capture_begin(GraphState* g, const Stream& s);
void graph_capture_end(GraphState* g, const Stream& s);
// Called when the graph is destroyed: its blocks return to the cache.
void graph_release_memory(GraphState* g);
}  // namespace detail
}  // namespace gk
