// gk::jit::Kernel: per-device loading (cudaLibraryLoadData), argument checking and
// packing, stream-ordered launches that mark the device failed on sticky faults.
#include <cstring>
#include <limits>
#include <map>

#include "core/cuda_util.h"
#include "gpukit/numeric.h"
#include "jit/internal.h"
#include "ops/common.h"

namespace gk::jit {

namespace {
constexpr int kMaxDev = 64;
constexpr size_t kDefaultSmem = 48 * 1024;

#if GPUKIT_WITH_CUDA
// Loaded libraries live for the whole process (one per compiled program).
std::mutex g_lib_mu;
std::map<std::string, cudaLibrary_t>& libraries() {
  static auto* m = new std::map<std::string, cudaLibrary_t>();
  return *m;
}
#endif
}  // namespace

Device pointer_device(const void* p) {
#if GPUKIT_WITH_CUDA
  if (!p || !cuda_available()) return Device::cpu();
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return Device::cpu();
  }
  if ((a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) && a.device >= 0)
    return Device::cuda(a.device);
#else
  (void)p;
#endif
  return Device::cpu();
}

struct Kernel::State {
  std::string source, name;
  std::vector<std::string> options;
  std::string arch;  // explicit target, or "" for each device's own
  bool use_cache = true;
  std::optional<Device> home;  // default launch device
  std::optional<Signature> sig;
  std::string sig_error;
  std::shared_ptr<const Program> first;
  std::mutex mu;
  struct PerDevice {
    std::atomic<void*> kernel{nullptr};
    std::shared_ptr<const Program> prog;
    int max_threads = 1024;
    size_t static_smem = 0, optin = kDefaultSmem;
    std::atomic<size_t> smem_set{kDefaultSmem};
    std::string mismatch;  // parsed signature disagrees with the compiled code
  };
  std::array<PerDevice, kMaxDev> dev;

  std::string label(size_t i) const {
    std::string n = sig && i < sig->names.size() ? sig->names[i] : std::string();
    return cat("argument ", i, n.empty() ? "" : " ('" + n + "')", " of kernel '", name, "'");
  }
  PerDevice& load(Device d);
  void pack_slots(const std::vector<Arg>& args, std::optional<Device> d, std::vector<uint64_t>& slots) const;
};

Kernel Kernel::create(std::string source, std::string name_expr, std::vector<std::string> options, std::string arch,
                      std::optional<std::vector<std::string>> types, std::optional<Device> device, bool use_cache) {
  Kernel k;
  k.s_ = std::make_shared<State>();
  State& s = *k.s_;
  s.source = std::move(source);
  s.name = std::move(name_expr);
  s.options = std::move(options);
  s.use_cache = use_cache;
  if (device && !device->is_cuda()) throw ValueError(cat("device: kernels run on CUDA devices, got ", device->str()));
  if (device && device->index >= cuda_device_count())
    throw ValueError(cat("device: ", device->str(), " does not exist"));
  if (!arch.empty()) s.arch = normalize_arch(arch);
  if (device) s.home = *device;
  else if (cuda_available()) s.home = Device::cuda(0);
  // Parameter types: explicit ones are checked before compiling; else parsed from the source.
  if (types) {
    Signature sig;
    for (size_t i = 0; i < types->size(); ++i) {
      sig.params.push_back(parse_type((*types)[i], cat("types[", i, "]")));
      sig.names.emplace_back();
    }
    s.sig = std::move(sig);
  }
  std::string target = !s.arch.empty() ? s.arch : arch_for_device(s.home ? *s.home : Device::cpu());
  s.first = compile(s.source, s.name, s.options, target, use_cache);
  if (!types) {
    try {
      s.sig = find_signature(s.source, s.name);
      if (!s.sig)
        s.sig_error = cat("kernel '", s.name, "': could not find its __global__ parameter list in the source; "
                          "pass types=[...] (e.g. types=['float*', 'int'])");
    } catch (const ValueError& e) {
      s.sig_error = cat("kernel '", s.name, "': ", e.what());
    }
  }
#if GPUKIT_WITH_CUDA
  // Load now rather than during a later graph capture. An explicit arch may not run on this
  // device (compile-only use): then the error is raised by the first launch instead.
  if (s.home && cuda_available()) {
    if (s.arch.empty()) {
      s.load(*s.home);
    } else {
      try {
        s.load(*s.home);
      } catch (const CudaError& e) {
        if (e.sticky) throw;
      }
    }
  }
#endif
  return k;
}

const Signature& Kernel::signature() const {
  if (!s_->sig) throw TypeError(s_->sig_error);
  return *s_->sig;
}
bool Kernel::has_signature() const { return s_->sig.has_value(); }
std::shared_ptr<const Program> Kernel::program() const { return s_->first; }
const std::string& Kernel::name() const { return s_->name; }

Kernel::State::PerDevice& Kernel::State::load(Device d) {
  PerDevice& pd = dev[size_t(d.index)];
  if (pd.kernel.load(std::memory_order_acquire)) return pd;
#if GPUKIT_WITH_CUDA
  std::lock_guard<std::mutex> lk(mu);
  if (pd.kernel.load()) return pd;
  check_device_usable(d);
  std::string target = !arch.empty() ? arch : arch_for_device(d);
  auto prog = first && first->arch == target ? first : compile(source, name, options, target, use_cache);
  cudaLibrary_t lib = nullptr;
  {
    std::lock_guard<std::mutex> lk2(g_lib_mu);
    auto it = libraries().find(prog->key);
    if (it != libraries().end()) {
      lib = it->second;
    } else {
      gk::detail::set_device(d.index);
      detail::count_library_load();
      GK_CUDA_CHECK(cudaLibraryLoadData(&lib, prog->binary.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
      libraries().emplace(prog->key, lib);
    }
  }
  gk::detail::set_device(d.index);
  cudaKernel_t kern = nullptr;
  GK_CUDA_CHECK(cudaLibraryGetKernel(&kern, lib, prog->lowered_name.c_str()));
  cudaFuncAttributes attr{};
  GK_CUDA_CHECK(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kern)));  // also loads it now
  pd.max_threads = attr.maxThreadsPerBlock;
  pd.static_smem = attr.sharedSizeBytes;
  // Without the opt-in attribute, static + dynamic shared memory may not exceed 48 KiB.
  pd.smem_set.store(kDefaultSmem > pd.static_smem ? kDefaultSmem - pd.static_smem : 0);
  pd.optin = device_properties(d).shared_per_block_optin;
  pd.prog = prog;
  // Cross-check the parsed parameter list against the compiled code.
  if (sig) {
    size_t n = 0;
    for (; n <= sig->params.size(); ++n) {
      size_t off = 0, size = 0;
      if (cudaFuncGetParamInfo(reinterpret_cast<const void*>(kern), n, &off, &size) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      if (n < sig->params.size() && size != size_t(sig->params[n].size))
        pd.mismatch = cat(label(n), ": declared as '", sig->params[n].spelling, "' (", sig->params[n].size,
                          " bytes) but the compiled kernel's parameter has ", size, " bytes; pass types=[...]");
    }
    // n == 0 with a non-empty list: the driver may predate cudaFuncGetParamInfo (12.4); no check.
    if (pd.mismatch.empty() && n != sig->params.size() && n > 0)
      pd.mismatch = cat("kernel '", name, "': the parsed parameter list has ", sig->params.size(),
                        " parameters but the compiled kernel has ", n, "; pass types=[...]");
  }
  pd.kernel.store(reinterpret_cast<void*>(kern), std::memory_order_release);
#else
  (void)d;
  throw ValueError("gk.jit: gpukit was built without CUDA; kernels can be compiled but not launched");
#endif
  return pd;
}

void Kernel::State::pack_slots(const std::vector<Arg>& args, std::optional<Device> d,
                               std::vector<uint64_t>& slots) const {
  if (!sig) throw TypeError(sig_error);
  const auto& params = sig->params;
  if (args.size() != params.size()) {
    std::string names;
    for (size_t i = 0; i < params.size(); ++i)
      names += cat(i ? ", " : "", params[i].spelling, sig->names[i].empty() ? "" : " " + sig->names[i]);
    throw TypeError(cat("kernel '", name, "' takes ", params.size(), " argument(s) (", names, "), got ", args.size()));
  }
  slots.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamType& p = params[i];
    const Arg& a = args[i];
    uint64_t& out = slots[i];
    auto bad = [&](const char* expected) {
      throw TypeError(cat(label(i), " expects ", expected, " ('", p.spelling, "'), got ", a.what));
    };
    switch (p.kind) {
      case ParamKind::Pointer: {
        if (a.kind == Arg::Null || (a.kind == Arg::Int && a.i == 0 && !a.big_unsigned)) {
          out = 0;
          break;
        }
        if (a.kind != Arg::Pointer) bad("an array or tensor on a CUDA device (or None)");
        if (a.dtype && !p.any_elem) {
          DType t = *a.dtype;
          // Unsigned pointees without a gpukit dtype (unsigned*, uint64_t*) take the signed
          // integer of their size; uint8_t* also takes bool.
          bool ok = (p.elem && *p.elem == t) || (p.elem == DType::u8 && t == DType::b8) ||
                    (p.unsigned_elem && !p.elem && is_integral(t) && int(itemsize(t)) == p.elem_size);
          if (!ok)
            throw TypeError(cat(label(i), " expects '", p.spelling, "'",
                                p.elem ? cat(" (", dtype_name(*p.elem), ")") : std::string(), ", got a ",
                                dtype_name(t), " ", a.what));
        }
        if (a.device) {
          if (!a.device->is_cuda())
            throw ValueError(cat(label(i), ": the ", a.what, " is on ", a.device->str(),
                                 "; kernel arguments must be on a CUDA device"));
          if (d && *a.device != *d)
            throw ValueError(cat(label(i), ": the ", a.what, " is on ", a.device->str(), " but the kernel runs on ",
                                 d->str()));
        }
        out = reinterpret_cast<uintptr_t>(a.ptr);
        break;
      }
      case ParamKind::Int:
      case ParamKind::UInt: {
        if (a.kind != Arg::Int && a.kind != Arg::Bool) bad("an integer");
        bool is_unsigned = p.kind == ParamKind::UInt;
        int bits = p.size * 8;
        if (a.kind == Arg::Bool) {
          out = a.b ? 1 : 0;
        } else if (a.big_unsigned) {
          if (!is_unsigned || bits < 64)
            throw ValueError(cat(label(i), ": ", a.u, " does not fit in '", p.spelling, "'"));
          out = a.u;
        } else {
          int64_t lo = is_unsigned ? 0 : (bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t(1) << (bits - 1)));
          int64_t hi = bits == 64 ? std::numeric_limits<int64_t>::max()
                                  : (is_unsigned ? (int64_t(1) << bits) - 1 : (int64_t(1) << (bits - 1)) - 1);
          if (a.i < lo || a.i > hi) throw ValueError(cat(label(i), ": ", a.i, " does not fit in '", p.spelling, "'"));
          out = uint64_t(a.i) & (bits == 64 ? ~uint64_t(0) : ((uint64_t(1) << bits) - 1));
        }
        break;
      }
      case ParamKind::Float: {
        double v;
        if (a.kind == Arg::Float) v = a.f;
        else if (a.kind == Arg::Int) v = a.big_unsigned ? double(a.u) : double(a.i);
        else bad("a number");
        if (p.size == 8) {
          std::memcpy(&out, &v, 8);
        } else if (p.size == 4) {
          float f = float(v);
          uint32_t b;
          std::memcpy(&b, &f, 4);
          out = b;
        } else if (p.elem == DType::bf16) {
          out = bf16(float(v)).bits;
        } else {
          out = f16(float(v)).bits;
        }
        break;
      }
      case ParamKind::Bool: {
        if (a.kind == Arg::Bool) out = a.b ? 1 : 0;
        else if (a.kind == Arg::Int && !a.big_unsigned && (a.i == 0 || a.i == 1)) out = uint64_t(a.i);
        else bad("a bool");
        break;
      }
    }
  }
}

std::string Kernel::pack(const std::vector<Arg>& args) const {
  std::vector<uint64_t> slots;
  s_->pack_slots(args, std::nullopt, slots);
  std::string out;
  const auto& params = s_->sig->params;
  for (size_t i = 0; i < params.size(); ++i) {
    size_t sz = size_t(params[i].size);
    while (out.size() % sz) out.push_back('\0');
    for (size_t b = 0; b < sz; ++b) out.push_back(char((slots[i] >> (8 * b)) & 0xff));
  }
  return out;
}

void Kernel::launch(Dim3 grid, Dim3 block, const std::vector<Arg>& args, size_t shared_mem,
                    const Stream* stream) const {
  State& s = *s_;
  // The launch device: the stream's, else the first array's, else the kernel's home.
  std::optional<Device> d;
  if (stream && stream->valid()) d = stream->device();
  for (const auto& a : args)
    if (!d && a.kind == Arg::Pointer && a.device && a.device->is_cuda()) d = *a.device;
  if (!d) d = s.home;
  std::vector<uint64_t> slots;
  s.pack_slots(args, d, slots);  // all type/count errors before anything touches the device
  auto check_dims = [](const Dim3& v, const char* what, int64_t maxx, int64_t maxyz) {
    if (v.x < 1 || v.y < 1 || v.z < 1 || v.x > maxx || v.y > maxyz || v.z > maxyz)
      throw ValueError(cat(what, ": (", v.x, ", ", v.y, ", ", v.z, ") is out of range (each at least 1, x at most ",
                           maxx, ", y and z at most ", maxyz, ")"));
  };
  check_dims(grid, "grid", (int64_t(1) << 31) - 1, 65535);
  check_dims(block, "block", 1024, 1024);
  if (block.z > 64) throw ValueError(cat("block: z = ", block.z, " exceeds 64"));
  if (!d) throw ValueError(cat("kernel '", s.name, "': no CUDA device to launch on"));
#if GPUKIT_WITH_CUDA
  check_device_usable(*d);
  auto& pd = s.load(*d);
  if (!pd.mismatch.empty()) throw TypeError(pd.mismatch);
  if (block.x * block.y * block.z > pd.max_threads)
    throw ValueError(cat("block: ", block.x * block.y * block.z, " threads exceed the kernel's limit of ",
                         pd.max_threads, " (registers or __launch_bounds__)"));
  if (shared_mem + pd.static_smem > pd.optin)
    throw ValueError(cat("shared_mem: ", shared_mem, " bytes of dynamic shared memory (plus ", pd.static_smem,
                         " static) exceed the device's limit of ", pd.optin, " bytes per block"));
  const void* fn = pd.kernel.load(std::memory_order_acquire);
  gk::detail::set_device(d->index);
  if (shared_mem > pd.smem_set.load()) {
    std::lock_guard<std::mutex> lk(s.mu);
    if (shared_mem > pd.smem_set.load()) {
      GK_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_mem)));
      pd.smem_set.store(shared_mem);
    }
  }
  Stream st = resolve_stream(stream, *d);
  for (const auto& a : args)
    if (a.array) gk::detail::mark_used(*a.array, st);
  void* ptrs[256];
  std::vector<void*> big;
  void** argv = ptrs;
  if (slots.size() > 256) {
    big.resize(slots.size());
    argv = big.data();
  }
  for (size_t i = 0; i < slots.size(); ++i) argv[i] = &slots[i];
  detail::count_launch();
  GK_CUDA_CHECK(cudaLaunchKernel(fn, dim3(unsigned(grid.x), unsigned(grid.y), unsigned(grid.z)),
                                 dim3(unsigned(block.x), unsigned(block.y), unsigned(block.z)), argv, shared_mem,
                                 static_cast<cudaStream_t>(st.handle())));
#else
  (void)shared_mem;
  (void)stream;
  throw ValueError(cat("kernel '", s.name, "': gpukit was built without CUDA; kernels cannot be launched"));
#endif
}

}  // namespace gk::jit
