// Streams, events and CUDA graphs. Every op runs on an explicit stream or on the
// device's current stream (thread-local, settable); gpukit never uses the legacy
// default stream.
#pragma once
#include <memory>

#include "gpukit/device.h"

namespace gk {

struct StreamState;
struct EventState;
struct GraphState;

class Stream {
 public:
  Stream() = default;                     // null: "the current stream" when passed to an op
  static Stream create(Device d, int priority = 0);  // a new non-blocking stream
  static Stream current(Device d);        // the thread's current stream of d
  static void set_current(const Stream& s);
  // Wraps a stream created elsewhere (torch, CuPy); gpukit does not destroy it.
  static Stream external(Device d, void* handle);
  bool valid() const { return bool(s_); }
  Device device() const;
  void* handle() const;                   // the cudaStream_t
  void synchronize() const;
  bool query() const;                     // true when all its work is done
  void wait(const class Event& e) const;  // later work on this stream waits for e
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle() == b.handle(); }
  friend bool operator!=(const Stream& a, const Stream& b) { return !(a == b); }

 private:
  std::shared_ptr<StreamState> s_;
};

// Resolves an optional stream argument for device d: the given one (checked to be
// on d) or the current one.
Stream resolve_stream(const Stream* s, Device d, const char* arg = "stream");

class Event {
 public:
  Event() = default;
  static Event create(Device d, bool timing = true);
  bool valid() const { return bool(e_); }
  void record(const Stream& s);
  void synchronize() const;
  bool query() const;
  float elapsed_ms(const Event& end) const;  // from this event to `end`
  void* handle() const;
  Device device() const;

 private:
  std::shared_ptr<EventState> e_;
};

// Captures the ops issued on one stream and replays them. Memory allocated while
// capturing belongs to the graph until it is destroyed, so replays write into the
// same arrays the capture returned.
class Graph {
 public:
  Graph() = default;
  static Graph create(const Stream& s);
  void begin();
  void end();
  void replay(const Stream* s = nullptr);
  bool captured() const;
  Stream stream() const;

 private:
  std::shared_ptr<GraphState> g_;
};

}  // namespace gk
