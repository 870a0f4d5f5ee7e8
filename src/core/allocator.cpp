#include "gpukit/allocator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda_util.h"
#include "core/internal.h"
#include "gpukit/array.h"
#include "gpukit/errors.h"

namespace gk {

size_t round_size(size_t n) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSplit = size_t(1) << 20;
  if (n == 0) return kSmall;
  if (n < kSplit) return (n + kSmall - 1) / kSmall * kSmall;
  return (n + kLarge - 1) / kLarge * kLarge;
}

namespace {

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  void* stream = nullptr;  // cudaStream_t it belongs to
  GraphState* graph = nullptr;
  std::vector<void*> events;  // pending cross-stream uses
};

struct DeviceAllocator {
  int device = 0;
  std::mutex mu;
  // free blocks per stream, by size
  std::unordered_map<void*, std::multimap<size_t, Block*>> free_lists;
  std::vector<Block*> pending;  // freed, waiting for events on other streams
  std::unordered_map<GraphState*, std::multimap<size_t, Block*>> graph_free;  // graph-owned, free
  std::unordered_map<GraphState*, std::vector<Block*>> graph_all;
  std::unordered_map<void*, GraphState*> capturing;  // stream -> graph capturing on it
  AllocatorStats st;
};

struct CpuStats {
  std::mutex mu;
  AllocatorStats st;
};

DeviceAllocator& dev_alloc(int d) {
  static std::mutex m;
  static auto* v = new std::vector<DeviceAllocator*>();  // leaked on purpose: outlives static teardown
  std::lock_guard<std::mutex> lk(m);
  if (v->size() <= size_t(d)) v->resize(d + 1, nullptr);
  if (!(*v)[d]) {
    (*v)[d] = new DeviceAllocator();
    (*v)[d]->device = d;
  }
  return *(*v)[d];
}
CpuStats& cpu_stats() {
  static auto* s = new CpuStats();
  return *s;
}

// ---- debug poison and guards (detail::debug_set_alloc_poison) ----
std::atomic<int> g_poison{-1};
struct Guarded {
  char* base = nullptr;  // start of the front guard
  size_t nbytes = 0;     // user bytes, which start at base + kDebugGuard
  Device device;
  uint8_t fill = 0;
};
std::mutex g_dbg_mu;
std::unordered_map<void*, Guarded>& dbg_live() {
  static auto* m = new std::unordered_map<void*, Guarded>();
  return *m;
}
std::vector<std::string>& dbg_violations() {
  static auto* v = new std::vector<std::string>();
  return *v;
}
// Compares the two guards of g with its fill byte; appends a message on damage.
// CUDA memory is read back synchronously (the caller synchronized the device).
void check_guard(const Guarded& g, std::vector<std::string>& out) {
  std::vector<unsigned char> front(detail::kDebugGuard), back(detail::kDebugGuard);
  const char* after = g.base + detail::kDebugGuard + g.nbytes;
  if (g.device.is_cpu()) {
    std::memcpy(front.data(), g.base, front.size());
    std::memcpy(back.data(), after, back.size());
  } else {
#if GPUKIT_WITH_CUDA
    detail::set_device(g.device.index);
    if (cudaMemcpy(front.data(), g.base, front.size(), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(back.data(), after, back.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      cudaGetLastError();
      out.push_back(cat(g.device.str(), ": could not read the guards of a block of ", g.nbytes, " bytes"));
      return;
    }
#endif
  }
  size_t bad_front = 0, bad_back = 0;
  for (unsigned char c : front) bad_front += c != g.fill;
  for (unsigned char c : back) bad_back += c != g.fill;
  if (bad_front || bad_back)
    out.push_back(cat(g.device.str(), ": allocation of ", g.nbytes, " bytes: ", bad_front,
                      " guard bytes before it and ", bad_back, " guard bytes after it were overwritten"));
}
// Removes the guarded entry of `ptr` (if any), checks it, and returns its base
// (the pointer to free for CPU memory), or null.
char* dbg_release(void* ptr, bool check) {
  Guarded g;
  {
    std::lock_guard<std::mutex> lk(g_dbg_mu);
    auto it = dbg_live().find(ptr);
    if (it == dbg_live().end()) return nullptr;
    g = it->second;
    dbg_live().erase(it);
  }
  if (check) {
    std::vector<std::string> v;
    check_guard(g, v);
    std::lock_guard<std::mutex> lk(g_dbg_mu);
    for (auto& m : v) dbg_violations().push_back(std::move(m));
  }
  return g.base;
}
void dbg_register(char* base, void* user, size_t nbytes, Device d, uint8_t fill) {
  std::lock_guard<std::mutex> lk(g_dbg_mu);
  dbg_live()[user] = Guarded{base, nbytes, d, fill};
}

#if GPUKIT_WITH_CUDA
// Moves pending blocks whose events have all completed back to their free lists.
void process_pending(DeviceAllocator& a) {
  for (size_t i = 0; i < a.pending.size();) {
    Block* b = a.pending[i];
    bool done = true;
    for (void* e : b->events) {
      cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
      if (r == cudaErrorNotReady) { done = false; break; }
      if (r != cudaSuccess) GK_CUDA_CHECK(r);
    }
    if (!done) { ++i; continue; }
    for (void* e : b->events) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    b->events.clear();
    a.free_lists[b->stream].emplace(b->size, b);
    a.pending[i] = a.pending.back();
    a.pending.pop_back();
  }
}

// Releases all cached free blocks to the driver (caller holds the lock).
void release_cached(DeviceAllocator& a) {
  for (auto& [s, lst] : a.free_lists) {
    for (auto& [sz, b] : lst) {
      cudaFree(b->ptr);
      a.st.reserved -= b->size;
      delete b;
    }
    lst.clear();
  }
}

Block* take_free(std::multimap<size_t, Block*>& lst, size_t size) {
  auto it = lst.lower_bound(size);
  if (it == lst.end()) return nullptr;
  // Accept a larger block only when the waste is small.
  if (it->first > size + size / 4 && it->first - size > (size_t(2) << 20)) return nullptr;
  Block* b = it->second;
  lst.erase(it);
  return b;
}
#endif

}  // namespace

Storage::~Storage() {
  if (block) {
#if GPUKIT_WITH_CUDA
    auto* b = static_cast<Block*>(block);
    DeviceAllocator& a = dev_alloc(device.index);
    if (ptr != b->ptr) {  // a guarded debug allocation: check it unless a capture is running
      bool capturing;
      {
        std::lock_guard<std::mutex> lk(a.mu);
        capturing = !a.capturing.empty();
      }
      bool ok = !capturing && !device_failed(device);
      if (ok) {
        detail::set_device(device.index);
        ok = cudaDeviceSynchronize() == cudaSuccess;
        if (!ok) cudaGetLastError();
      }
      dbg_release(ptr, ok);
    }
    std::lock_guard<std::mutex> lk(a.mu);
    a.st.allocated -= b->size;
    a.st.num_frees++;
    if (device_failed(device)) return;  // the context is gone; leak rather than crash
    if (b->graph) {
      auto it = a.graph_free.find(b->graph);
      if (it != a.graph_free.end()) it->second.emplace(b->size, b);
      return;
    }
    if (!used_on.empty()) {
      int prev = -1;
      cudaGetDevice(&prev);
      cudaSetDevice(device.index);
      for (auto& s : used_on) {
        cudaEvent_t e;
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) continue;
        cudaEventRecord(e, static_cast<cudaStream_t>(s.handle()));
        b->events.push_back(e);
      }
      if (prev >= 0) cudaSetDevice(prev);
      a.pending.push_back(b);
      return;
    }
    a.free_lists[b->stream].emplace(b->size, b);
#endif
  } else if (cpu_owned) {
    char* base = dbg_release(ptr, true);
    std::free(base ? static_cast<void*>(base) : ptr);
    auto& c = cpu_stats();
    std::lock_guard<std::mutex> lk(c.mu);
    c.st.allocated -= nbytes;
    c.st.num_frees++;
  }
}

std::shared_ptr<Storage> allocate(Device d, size_t nbytes, const Stream& s) {
  auto st = std::make_shared<Storage>();
  st->device = d;
  st->nbytes = nbytes;
  const int poison = g_poison.load(std::memory_order_relaxed);
  if (d.is_cpu()) {
    if (nbytes > (size_t(1) << 62))
      throw OutOfMemoryError(cat("out of host memory: requested ", nbytes, " bytes"), nbytes, 0, 0);
    const size_t guard = poison >= 0 ? detail::kDebugGuard : 0;
    size_t sz = (std::max<size_t>(nbytes, 1) + 2 * guard + 63) / 64 * 64;
    st->ptr = std::aligned_alloc(64, sz);
    if (!st->ptr)
      throw OutOfMemoryError(cat("out of host memory: requested ", nbytes, " bytes"), nbytes, 0, 0);
    if (poison >= 0) {
      char* base = static_cast<char*>(st->ptr);
      std::memset(base, poison, nbytes + 2 * guard);
      st->ptr = base + guard;
      dbg_register(base, st->ptr, nbytes, d, uint8_t(poison));
    }
    st->cpu_owned = true;
    auto& c = cpu_stats();
    std::lock_guard<std::mutex> lk(c.mu);
    c.st.allocated += nbytes;
    c.st.num_allocs++;
    c.st.peak_allocated = std::max(c.st.peak_allocated, c.st.allocated);
    return st;
  }
#if GPUKIT_WITH_CUDA
  check_device_usable(d);
  if (nbytes > (size_t(1) << 62))
    throw OutOfMemoryError(cat("CUDA out of memory on ", d.str(), ": requested ", nbytes, " bytes"), nbytes, 0, 0);
  DeviceAllocator& a = dev_alloc(d.index);
  std::unique_lock<std::mutex> lk(a.mu);
  void* sh = s.handle();
  Block* b = nullptr;
  GraphState* g = nullptr;
  if (!a.capturing.empty()) {
    auto it = a.capturing.find(sh);
    if (it != a.capturing.end()) g = it->second;
  }
  const size_t guard = poison >= 0 && !g ? detail::kDebugGuard : 0;
  size_t size = round_size(nbytes + 2 * guard);
  if (g) {
    b = take_free(a.graph_free[g], size);
  } else {
    if (!a.pending.empty()) process_pending(a);
    b = take_free(a.free_lists[sh], size);
  }
  if (b) {
    a.st.hits++;
  } else {
    a.st.misses++;
    if (a.st.limit && a.st.reserved + size > a.st.limit) release_cached(a);
    if (a.st.limit && a.st.reserved + size > a.st.limit)
      throw OutOfMemoryError(
          cat("CUDA out of memory on ", d.str(), ": requested ", nbytes, " bytes; ", a.st.allocated,
              " bytes in use, ", a.st.reserved, " reserved, limit ", a.st.limit, " bytes"),
          nbytes, a.st.allocated, a.st.limit);
    detail::set_device(d.index);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached(a);
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw OutOfMemoryError(
          cat("CUDA out of memory on ", d.str(), ": requested ", nbytes, " bytes; ", a.st.allocated,
              " bytes in use by gpukit, ", free_b, " free of ", total_b, " on the device, limit ",
              a.st.limit ? std::to_string(a.st.limit) + " bytes" : std::string("none")),
          nbytes, a.st.allocated, a.st.limit ? a.st.limit : total_b);
    }
    GK_CUDA_CHECK(e);
    b = new Block();
    b->ptr = p;
    b->size = size;
    b->stream = sh;
    a.st.reserved += size;
    if (g) {
      b->graph = g;
      a.graph_all[g].push_back(b);
    }
  }
  if (g && !b->graph) {
    b->graph = g;
    a.graph_all[g].push_back(b);
  }
  a.st.allocated += b->size;
  a.st.num_allocs++;
  a.st.peak_allocated = std::max(a.st.peak_allocated, a.st.allocated);
  st->ptr = b->ptr;
  st->block = b;
  st->alloc_stream = sh;
  lk.unlock();
  if (guard) {
    detail::set_device(d.index);
    GK_CUDA_CHECK(cudaMemsetAsync(b->ptr, poison, nbytes + 2 * guard, static_cast<cudaStream_t>(sh)));
    st->ptr = static_cast<char*>(b->ptr) + guard;
    dbg_register(static_cast<char*>(b->ptr), st->ptr, nbytes, d, uint8_t(poison));
  }
  return st;
#else
  (void)s;
  throw ValueError(cat("device: ", d.str(), " is not available (built without CUDA)"));
#endif
}

void record_stream(Storage& st, const Stream& s) {
  if (!st.block || !s.valid() || s.handle() == st.alloc_stream) return;
  std::lock_guard<std::mutex> lk(st.mu);
  for (auto& u : st.used_on)
    if (u == s) return;
  st.used_on.push_back(s);
}

AllocatorStats allocator_stats(Device d) {
  if (d.is_cpu()) {
    auto& c = cpu_stats();
    std::lock_guard<std::mutex> lk(c.mu);
    return c.st;
  }
  DeviceAllocator& a = dev_alloc(d.index);
  std::lock_guard<std::mutex> lk(a.mu);
  return a.st;
}

void reset_peak_stats(Device d) {
  if (d.is_cpu()) {
    auto& c = cpu_stats();
    std::lock_guard<std::mutex> lk(c.mu);
    c.st.peak_allocated = c.st.allocated;
    return;
  }
  DeviceAllocator& a = dev_alloc(d.index);
  std::lock_guard<std::mutex> lk(a.mu);
  a.st.peak_allocated = a.st.allocated;
}

void set_memory_limit(Device d, size_t bytes) {
  if (!d.is_cuda()) throw ValueError("device: a memory limit applies to CUDA devices only");
  DeviceAllocator& a = dev_alloc(d.index);
  std::lock_guard<std::mutex> lk(a.mu);
  a.st.limit = bytes;
}

void empty_cache(Device d) {
  if (!d.is_cuda()) return;
#if GPUKIT_WITH_CUDA
  if (device_failed(d)) return;
  DeviceAllocator& a = dev_alloc(d.index);
  std::lock_guard<std::mutex> lk(a.mu);
  detail::set_device(d.index);
  if (!a.pending.empty()) process_pending(a);
  release_cached(a);
#endif
}

namespace detail {
void graph_capture_begin(GraphState* g, const Stream& s) {
  DeviceAllocator& a = dev_alloc(s.device().index);
  std::lock_guard<std::mutex> lk(a.mu);
  a.capturing[s.handle()] = g;
  a.graph_free[g];
}
void graph_capture_end(GraphState* g, const Stream& s) {
  DeviceAllocator& a = dev_alloc(s.device().index);
  std::lock_guard<std::mutex> lk(a.mu);
  auto it = a.capturing.find(s.handle());
  if (it != a.capturing.end() && it->second == g) a.capturing.erase(it);
}
void debug_set_alloc_poison(int byte) { g_poison.store(byte < 0 ? -1 : (byte & 0xff)); }
int debug_alloc_poison() { return g_poison.load(); }
std::vector<std::string> debug_check_guards() {
  std::vector<Guarded> live;
  {
    std::lock_guard<std::mutex> lk(g_dbg_mu);
    for (auto& [p, g] : dbg_live()) live.push_back(g);
  }
  std::vector<std::string> out;
#if GPUKIT_WITH_CUDA
  for (int i = 0; i < cuda_device_count(); ++i)
    if (!device_failed(Device::cuda(i))) {
      set_device(i);
      if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    }
#endif
  for (auto& g : live) check_guard(g, out);
  std::lock_guard<std::mutex> lk(g_dbg_mu);
  for (auto& m : dbg_violations()) out.push_back(std::move(m));
  dbg_violations().clear();
  return out;
}

void graph_release_memory(GraphState* g) {
#if GPUKIT_WITH_CUDA
  for (int d = 0; d < cuda_device_count(); ++d) {
    DeviceAllocator& a = dev_alloc(d);
    std::lock_guard<std::mutex> lk(a.mu);
    auto it = a.graph_all.find(g);
    if (it == a.graph_all.end()) continue;
    auto& fl = a.graph_free[g];
    for (Block* b : it->second) {
      b->graph = nullptr;
      // A block still held by a live array returns to the cache when that array dies.
      for (auto jt = fl.begin(); jt != fl.end(); ++jt) {
        if (jt->second == b) {
          a.free_lists[b->stream].emplace(b->size, b);
          break;
        }
      }
    }
    a.graph_all.erase(it);
    a.graph_free.erase(g);
  }
#else
  (void)g;
#endif
}
}  // namespace detail

// ---- pinned staging pool ----
namespace {
struct PinnedEntry {
  void* ptr;
  size_t size;
  void* event;  // cudaEvent_t recorded after the last copy that used it, or null
};
std::mutex g_pin_mu;
std::vector<PinnedEntry>& pin_pool() {
  static auto* v = new std::vector<PinnedEntry>();
  return *v;
}
std::unordered_map<void*, size_t>& pin_busy() {
  static auto* m = new std::unordered_map<void*, size_t>();
  return *m;
}
}  // namespace

PinnedBuffer pinned_acquire(size_t nbytes) {
#if GPUKIT_WITH_CUDA
  std::lock_guard<std::mutex> lk(g_pin_mu);
  auto& pool = pin_pool();
  for (size_t i = 0; i < pool.size(); ++i) {
    auto& e = pool[i];
    if (e.size < nbytes) continue;
    if (e.event) {
      cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e.event));
      if (r == cudaErrorNotReady) continue;
      cudaEventDestroy(static_cast<cudaEvent_t>(e.event));
    }
    PinnedBuffer b{e.ptr, e.size};
    pool.erase(pool.begin() + i);
    pin_busy()[b.ptr] = b.size;
    return b;
  }
  size_t sz = round_size(nbytes);
  void* p = nullptr;
  GK_CUDA_CHECK(cudaHostAlloc(&p, sz, cudaHostAllocDefault));
  pin_busy()[p] = sz;
  return {p, sz};
#else
  (void)nbytes;
  throw ValueError("pinned memory needs CUDA");
#endif
}

void pinned_release(PinnedBuffer b, const Stream& after) {
#if GPUKIT_WITH_CUDA
  void* ev = nullptr;
  if (after.valid()) {
    cudaEvent_t e;
    GK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    GK_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(after.handle())));
    ev = e;
  }
  std::lock_guard<std::mutex> lk(g_pin_mu);
  pin_busy().erase(b.ptr);
  pin_pool().push_back({b.ptr, b.size, ev});
#else
  (void)b;
  (void)after;
#endif
}

}  // namespace gk
