#include "gpukit/stream.h"

#include <map>
#include <mutex>

#include "core/internal.h"
#include "core/cuda_util.h"
#include "gpukit/errors.h"

namespace gk {

struct StreamState {
  Device dev;
  void* h = nullptr;
  bool owned = false;
  ~StreamState() {
#if GPUKIT_WITH_CUDA
    if (owned && h && !device_failed(dev)) cudaStreamDestroy(static_cast<cudaStream_t>(h));
#endif
  }
};

struct EventState {
  Device dev;
  void* h = nullptr;
  bool timing = true;
  bool recorded = false;
  ~EventState() {
#if GPUKIT_WITH_CUDA
    if (h && !device_failed(dev)) cudaEventDestroy(static_cast<cudaEvent_t>(h));
#endif
  }
};

namespace {
std::mutex g_mu;
std::map<int, Stream>& default_streams() {
  static auto* m = new std::map<int, Stream>();  // never destroyed: streams outlive static teardown
  return *m;
}
thread_local std::map<int, Stream> t_current;

[[noreturn]] void no_cuda(const char* what) {
  throw ValueError(cat(what, ": CUDA is not available (", built_with_cuda() ? "no GPU or driver" : "built without CUDA", ")"));
}
// A CUDA device that exists: ValueError naming `what` otherwise (no GPU, no driver, bad index).
void require_cuda_device(Device d, const char* what) {
  if (!d.is_cuda()) throw ValueError(cat("device: ", what, " exist only on CUDA devices, got ", d.str()));
  if (cuda_device_count() == 0) no_cuda(what);
  if (d.index < 0 || d.index >= cuda_device_count())
    throw ValueError(cat("device: ", d.str(), " does not exist (", cuda_device_count(), " CUDA device(s))"));
}
}  // namespace

Stream Stream::create(Device d, int priority) {
  require_cuda_device(d, "streams");
#if GPUKIT_WITH_CUDA
  check_device_usable(d);
  detail::set_device(d.index);
  cudaStream_t h;
  GK_CUDA_CHECK(cudaStreamCreateWithPriority(&h, cudaStreamNonBlocking, priority));
  Stream s;
  s.s_ = std::make_shared<StreamState>();
  s.s_->dev = d;
  s.s_->h = h;
  s.s_->owned = true;
  return s;
#else
  (void)priority;
  no_cuda("Stream");
#endif
}

Stream Stream::external(Device d, void* handle) {
  if (!d.is_cuda()) throw ValueError("device: streams exist only on CUDA devices, got " + d.str());
  Stream s;
  s.s_ = std::make_shared<StreamState>();
  s.s_->dev = d;
  s.s_->h = handle;
  s.s_->owned = false;
  return s;
}

Stream Stream::current(Device d) {
  if (!d.is_cuda()) return Stream();
  auto it = t_current.find(d.index);
  if (it != t_current.end()) return it->second;
  std::lock_guard<std::mutex> lk(g_mu);
  auto& m = default_streams();
  auto jt = m.find(d.index);
  if (jt == m.end()) jt = m.emplace(d.index, Stream::create(d)).first;
  return jt->second;
}

void Stream::set_current(const Stream& s) {
  if (!s.valid()) throw ValueError("stream: cannot make a null stream current");
  t_current[s.device().index] = s;
}

Device Stream::device() const { return s_ ? s_->dev : Device{}; }
void* Stream::handle() const { return s_ ? s_->h : nullptr; }

void Stream::synchronize() const {
  if (!s_) return;
#if GPUKIT_WITH_CUDA
  check_device_usable(s_->dev);
  GK_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s_->h)));
#endif
}

bool Stream::query() const {
  if (!s_) return true;
#if GPUKIT_WITH_CUDA
  check_device_usable(s_->dev);
  cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(s_->h));
  if (e == cudaErrorNotReady) return false;
  GK_CUDA_CHECK(e);
#endif
  return true;
}

void Stream::wait(const Event& e) const {
  if (!s_ || !e.valid()) return;
#if GPUKIT_WITH_CUDA
  check_device_usable(s_->dev);
  GK_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s_->h), static_cast<cudaEvent_t>(e.handle()), 0));
#endif
}

Stream resolve_stream(const Stream* s, Device d, const char* arg) {
  if (!d.is_cuda()) return Stream();
  check_device_usable(d);
  if (s && s->valid()) {
    if (s->device() != d)
      throw ValueError(cat(arg, ": stream is on ", s->device().str(), " but the operands are on ", d.str()));
    return *s;
  }
  return Stream::current(d);
}

// ---- events ----
Event Event::create(Device d, bool timing) {
  require_cuda_device(d, "events");
#if GPUKIT_WITH_CUDA
  check_device_usable(d);
  detail::set_device(d.index);
  cudaEvent_t h;
  GK_CUDA_CHECK(cudaEventCreateWithFlags(&h, timing ? cudaEventDefault : cudaEventDisableTiming));
  Event e;
  e.e_ = std::make_shared<EventState>();
  e.e_->dev = d;
  e.e_->h = h;
  e.e_->timing = timing;
  return e;
#else
  (void)timing;
  no_cuda("Event");
#endif
}

void Event::record(const Stream& s) {
  if (!e_) throw ValueError("event: null event");
  if (!s.valid()) throw ValueError("stream: null stream");
  if (s.device() != e_->dev)
    throw ValueError(cat("stream: on ", s.device().str(), " but the event is on ", e_->dev.str()));
#if GPUKIT_WITH_CUDA
  check_device_usable(e_->dev);
  GK_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e_->h), static_cast<cudaStream_t>(s.handle())));
  e_->recorded = true;
#endif
}

void Event::synchronize() const {
  if (!e_) return;
#if GPUKIT_WITH_CUDA
  check_device_usable(e_->dev);
  GK_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e_->h)));
#endif
}

bool Event::query() const {
  if (!e_) return true;
#if GPUKIT_WITH_CUDA
  check_device_usable(e_->dev);
  cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e_->h));
  if (r == cudaErrorNotReady) return false;
  GK_CUDA_CHECK(r);
#endif
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  if (!e_ || !end.e_) throw ValueError("end: both events must be valid");
  if (!e_->timing || !end.e_->timing) throw ValueError("end: events were created without timing");
  if (!e_->recorded || !end.e_->recorded) throw ValueError("end: both events must have been recorded");
  float ms = 0;
#if GPUKIT_WITH_CUDA
  check_device_usable(e_->dev);
  GK_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(e_->h), static_cast<cudaEvent_t>(end.e_->h)));
#endif
  return ms;
}

void* Event::handle() const { return e_ ? e_->h : nullptr; }
Device Event::device() const { return e_ ? e_->dev : Device{}; }

// ---- graphs ----
struct GraphState {
  Stream s;
  bool capturing = false;
#if GPUKIT_WITH_CUDA
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
#endif
  ~GraphState() {
    detail::graph_release_memory(this);
#if GPUKIT_WITH_CUDA
    if (!device_failed(s.device())) {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
    }
#endif
  }
};

Graph Graph::create(const Stream& s) {
  if (!s.valid()) throw ValueError("stream: a graph needs a CUDA stream");
  Graph g;
  g.g_ = std::make_shared<GraphState>();
  g.g_->s = s;
  return g;
}

void Graph::begin() {
  if (!g_) throw ValueError("graph: null graph");
  if (g_->capturing) throw ValueError("graph: capture already in progress");
#if GPUKIT_WITH_CUDA
  if (g_->exec) throw ValueError("graph: already captured; create a new Graph to capture again");
  check_device_usable(g_->s.device());
  detail::set_device(g_->s.device().index);
  detail::graph_capture_begin(g_.get(), g_->s);
  cudaError_t e = cudaStreamBeginCapture(static_cast<cudaStream_t>(g_->s.handle()), cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    detail::graph_capture_end(g_.get(), g_->s);
    GK_CUDA_CHECK(e);
  }
  g_->capturing = true;
#endif
}

void Graph::end() {
  if (!g_ || !g_->capturing) throw ValueError("graph: end() without begin()");
#if GPUKIT_WITH_CUDA
  g_->capturing = false;
  detail::graph_capture_end(g_.get(), g_->s);
  cudaGraph_t graph = nullptr;
  GK_CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(g_->s.handle()), &graph));
  g_->graph = graph;
  GK_CUDA_CHECK(cudaGraphInstantiate(&g_->exec, graph, 0));
#endif
}

void Graph::replay(const Stream* s) {
  if (!g_ || g_->capturing) throw ValueError("graph: replay() during capture");
#if GPUKIT_WITH_CUDA
  if (!g_->exec) throw ValueError("graph: nothing captured yet");
  Stream st = s && s->valid() ? *s : g_->s;
  if (st.device() != g_->s.device()) throw ValueError("stream: replay stream is on another device");
  check_device_usable(st.device());
  GK_CUDA_CHECK(cudaGraphLaunch(g_->exec, static_cast<cudaStream_t>(st.handle())));
#endif
}

bool Graph::captured() const {
#if GPUKIT_WITH_CUDA
  return g_ && g_->exec;
#else
  return false;
#endif
}
Stream Graph::stream() const { return g_ ? g_->s : Stream(); }

}  // namespace gk
