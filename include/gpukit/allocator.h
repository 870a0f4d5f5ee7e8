// The caching allocator (one per device) and the pinned host staging pool.
//
// Blocks are rounded to size classes (512 B steps below 1 MiB, 2 MiB steps above).
// A freed block goes back to the free list of the stream it was allocated on and
// is reused only by allocations on that stream; if the memory was also used on
// other streams, it waits until events recorded on those streams complete.
// A byte limit caps the reserved bytes; on cudaMalloc failure the cache is
// released and the allocation retried once, then OutOfMemoryError is thrown.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpukit/device.h"
#include "gpukit/stream.h"

namespace gk {

struct Storage;

struct AllocatorStats {
  size_t allocated = 0;       // bytes in live blocks
  size_t reserved = 0;        // bytes obtained from cudaMalloc and not yet released
  size_t peak_allocated = 0;
  uint64_t hits = 0, misses = 0;  // requests served from the cache / from cudaMalloc
  uint64_t num_allocs = 0, num_frees = 0;
  size_t limit = 0;           // 0: no limit
};

// Allocates `nbytes` on `d` for use on stream `s` (CPU: aligned host memory).
std::shared_ptr<Storage> allocate(Device d, size_t nbytes, const Stream& s);
AllocatorStats allocator_stats(Device d);
void reset_peak_stats(Device d);
void set_memory_limit(Device d, size_t bytes);  // 0 removes the limit
void empty_cache(Device d);
// Marks `st` as used on stream `s`: its block will not be reused before the work
// issued so far on `s` has finished.
void record_stream(Storage& st, const Stream& s);
size_t round_size(size_t nbytes);

// Pinned host memory for staging host<->device copies. The buffer is returned to
// the pool once `done` (recorded after the copy) has completed.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t size = 0;
};
PinnedBuffer pinned_acquire(size_t nbytes);
void pinned_release(PinnedBuffer b, const Stream& after);

}  // namespace gk
