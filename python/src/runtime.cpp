// Devices, streams, events, graphs and the allocator.
#include <nanobind/stl/pair.h>

#include "bind.h"
#include "core/internal.h"
#include "gpukit/allocator.h"
#include "gpukit/errors.h"

namespace gkpy {
using namespace gk;

GK_BINDING(5, runtime) {
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("cuda_is_available", &cuda_available);
  m.def("devices", &devices);
  m.def("device_failed", [](nb::handle d) { return device_failed(to_device(d)); }, nb::arg("device"));
  m.def("synchronize", [](nb::handle d) {
    Device dev = d.is_none() ? (cuda_available() ? Device::cuda(0) : Device::cpu()) : to_device(d);
    nb::gil_scoped_release rel;
    synchronize(dev);
  }, nb::arg("device") = nb::none());
  m.def("device_properties", [](nb::handle d) {
    DeviceProperties p = device_properties(to_device(d));
    nb::dict r;
    r["name"] = p.name;
    r["multiprocessors"] = p.multiprocessors;
    r["total_memory"] = p.total_memory;
    r["compute_capability"] = nb::make_tuple(p.major, p.minor);
    r["l2_cache"] = p.l2_cache;
    r["shared_memory_per_block_optin"] = p.shared_per_block_optin;
    return r;
  }, nb::arg("device"));

  nb::class_<Stream>(m, "Stream", "A CUDA stream (non-blocking with respect to the legacy default stream).")
      .def("__init__", [](Stream* s, nb::handle device, int priority, nb::handle handle) {
        Device d = device.is_none() ? Device::cuda(0) : to_device(device);
        if (!d.is_cuda()) throw ValueError("device: streams exist only on CUDA devices");
        d = Device::parse(d.str());
        if (!handle.is_none()) new (s) Stream(Stream::external(d, reinterpret_cast<void*>(nb::cast<uintptr_t>(handle))));
        else new (s) Stream(Stream::create(d, priority));
      }, nb::arg("device") = nb::none(), nb::arg("priority") = 0, nb::arg("handle") = nb::none(),
           "A new stream on device, or (handle=...) a wrapper of a stream made elsewhere (torch, CuPy).")
      .def_static("current", [](nb::handle d) {
        Device dev = d.is_none() ? Device::cuda(0) : to_device(d);
        if (!dev.is_cuda()) throw ValueError("device: streams exist only on CUDA devices");
        return Stream::current(Device::parse(dev.str()));
      }, nb::arg("device") = nb::none())
      .def_static("set_current", &Stream::set_current, nb::arg("stream"))
      .def_prop_ro("device", &Stream::device)
      .def_prop_ro("handle", [](const Stream& s) { return reinterpret_cast<uintptr_t>(s.handle()); })
      .def("synchronize", [](const Stream& s) {
        nb::gil_scoped_release rel;
        s.synchronize();
      })
      .def("query", &Stream::query)
      .def("wait_event", &Stream::wait, nb::arg("event"))
      .def("wait_stream", [](const Stream& s, const Stream& other) {
        Event e = Event::create(other.device(), false);
        e.record(other);
        s.wait(e);
      }, nb::arg("other"))
      .def("record_event", [](const Stream& s, nb::handle timing) {
        Event e = Event::create(s.device(), timing.is_none() ? true : nb::cast<bool>(timing));
        e.record(s);
        return e;
      }, nb::arg("timing") = nb::none())
      .def("__eq__", [](const Stream& a, const Stream& b) { return a == b; })
      .def("__hash__", [](const Stream& s) { return reinterpret_cast<uintptr_t>(s.handle()); })
      .def("__repr__", [](const Stream& s) {
        char buf[32];
        auto r = std::to_chars(buf, buf + sizeof(buf), reinterpret_cast<uintptr_t>(s.handle()), 16);
        return cat("gpukit.Stream(device='", s.device().str(), "', handle=0x", std::string_view(buf, r.ptr - buf), ")");
      });

  nb::class_<Event>(m, "Event", "A CUDA event, for ordering streams and timing.")
      .def("__init__", [](Event* e, nb::handle device, bool timing) {
        Device d = device.is_none() ? Device::cuda(0) : to_device(device);
        new (e) Event(Event::create(d, timing));
      }, nb::arg("device") = nb::none(), nb::arg("timing") = true)
      .def("record", [](Event& e, nb::handle stream) {
        if (stream.is_none()) e.record(Stream::current(e.device()));
        else e.record(nb::cast<Stream>(stream));
      }, nb::arg("stream") = nb::none())
      .def("synchronize", [](const Event& e) {
        nb::gil_scoped_release rel;
        e.synchronize();
      })
      .def("query", &Event::query)
      .def("wait", [](const Event& e, nb::handle stream) {
        Stream s = stream.is_none() ? Stream::current(e.device()) : nb::cast<Stream>(stream);
        s.wait(e);
      }, nb::arg("stream") = nb::none(), "Makes stream (default: current) wait for this event.")
      .def("elapsed_time", &Event::elapsed_ms, nb::arg("end"), "Milliseconds from this event to end.")
      .def_prop_ro("device", &Event::device);

  nb::class_<Graph>(m, "Graph", "Captures the ops issued on a stream and replays them.")
      .def("__init__", [](Graph* g, nb::handle stream) {
        Stream s = stream.is_none() ? Stream::create(Device::cuda(0)) : nb::cast<Stream>(stream);
        new (g) Graph(Graph::create(s));
      }, nb::arg("stream") = nb::none())
      .def("begin", &Graph::begin)
      .def("end", &Graph::end)
      .def("replay", [](Graph& g, nb::handle stream) {
        Stream st;
        g.replay(to_stream(stream, st));
      }, nb::arg("stream") = nb::none())
      .def_prop_ro("captured", &Graph::captured)
      .def_prop_ro("stream", &Graph::stream);

  m.def("memory_stats", [](nb::handle d) {
    AllocatorStats s = allocator_stats(to_device(d));
    nb::dict r;
    r["allocated"] = s.allocated;
    r["reserved"] = s.reserved;
    r["peak"] = s.peak_allocated;
    r["hits"] = s.hits;
    r["misses"] = s.misses;
    r["allocs"] = s.num_allocs;
    r["frees"] = s.num_frees;
    r["limit"] = s.limit;
    return r;
  }, nb::arg("device") = "cuda:0");
  m.def("reset_peak_memory_stats", [](nb::handle d) { reset_peak_stats(to_device(d)); }, nb::arg("device") = "cuda:0");
  m.def("set_memory_limit", [](nb::handle d, size_t b) { set_memory_limit(to_device(d), b); }, nb::arg("device"),
        nb::arg("nbytes"));
  m.def("_debug_alloc_poison", [](int byte) { detail::debug_set_alloc_poison(byte); }, nb::arg("byte"),
        "Test hook: fill every new allocation with `byte` and frame it with guard bytes (-1: off).");
  m.def("_debug_check_guards", [] {
    nb::gil_scoped_release rel;
    return detail::debug_check_guards();
  }, "Test hook: synchronizes the devices and returns (and clears) the guard violations seen.");
  m.def("empty_cache", [](nb::handle d) {
    if (d.is_none()) {
      for (int i = 0; i < cuda_device_count(); ++i) empty_cache(Device::cuda(i));
    } else {
      empty_cache(to_device(d));
    }
  }, nb::arg("device") = nb::none());
}

}  // namespace gkpy
