// NVRTC, loaded at run time with dlopen: search, entry points, one compilation.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/dynlib.h"
#include "jit/internal.h"

namespace gk::jit {
namespace {

using nvrtcResult = int;
using nvrtcProgram = void*;

struct Api {
  const char* (*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int*, int*);
  nvrtcResult (*GetNumSupportedArchs)(int*);
  nvrtcResult (*GetSupportedArchs)(int*);
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  nvrtcResult (*DestroyProgram)(nvrtcProgram*);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetPTX)(nvrtcProgram, char*);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*AddNameExpression)(nvrtcProgram, const char*);
  nvrtcResult (*GetLoweredName)(nvrtcProgram, const char*, const char**);
};

struct Loader {
  std::mutex mu;
  bool tried = false;
  void* handle = nullptr;
  Api api{};
  std::string path, reason;
  int major = 0, minor = 0;
  std::vector<int> archs;
  std::vector<std::string> extra_libs, extra_includes;
};
Loader& L() {
  static auto* l = new Loader();  // never destroyed: kernels may outlive static teardown
  return *l;
}

using dynlib::env;
using dynlib::is_dir;
using dynlib::is_file;

// Candidates: a name for the loader ("libnvrtc.so.13") or a path.
std::vector<std::string> candidates(const Loader& l) {
  return dynlib::candidates("GPUKIT_NVRTC_PATH", {"libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12"}, l.extra_libs,
                            "GPUKIT_NVRTC_NO_SEARCH");
}

using dynlib::sym;

bool try_open(Loader& l, const std::string& cand) {
  void* h = dynlib::open_lib(cand, l.reason);
  if (!h) return false;
  Api a{};
  std::string missing;
  bool ok = sym(h, "nvrtcGetErrorString", a.GetErrorString, missing) && sym(h, "nvrtcVersion", a.Version, missing) &&
            sym(h, "nvrtcGetNumSupportedArchs", a.GetNumSupportedArchs, missing) &&
            sym(h, "nvrtcGetSupportedArchs", a.GetSupportedArchs, missing) &&
            sym(h, "nvrtcCreateProgram", a.CreateProgram, missing) &&
            sym(h, "nvrtcDestroyProgram", a.DestroyProgram, missing) &&
            sym(h, "nvrtcCompileProgram", a.CompileProgram, missing) && sym(h, "nvrtcGetPTXSize", a.GetPTXSize, missing) &&
            sym(h, "nvrtcGetPTX", a.GetPTX, missing) && sym(h, "nvrtcGetCUBINSize", a.GetCUBINSize, missing) &&
            sym(h, "nvrtcGetCUBIN", a.GetCUBIN, missing) &&
            sym(h, "nvrtcGetProgramLogSize", a.GetProgramLogSize, missing) &&
            sym(h, "nvrtcGetProgramLog", a.GetProgramLog, missing) &&
            sym(h, "nvrtcAddNameExpression", a.AddNameExpression, missing) &&
            sym(h, "nvrtcGetLoweredName", a.GetLoweredName, missing);
  int major = 0, minor = 0;
  if (ok && (a.Version(&major, &minor) != 0 || major < 12)) {
    l.reason += "\n  " + cand + ": NVRTC " + std::to_string(major) + "." + std::to_string(minor) +
                " is too old (12 or newer needed)";
    dlclose(h);
    return false;
  }
  if (!ok) {
    l.reason += "\n  " + cand + ": not NVRTC (missing " + missing + ")";
    dlclose(h);
    return false;
  }
  int n = 0;
  std::vector<int> archs;
  if (a.GetNumSupportedArchs(&n) == 0 && n > 0 && n < 1024) {
    archs.resize(size_t(n));
    if (a.GetSupportedArchs(archs.data()) != 0) archs.clear();
  }
  l.handle = h;
  l.api = a;
  l.major = major;
  l.minor = minor;
  l.archs = std::move(archs);
  l.path = dynlib::loaded_path(h, cand);
  l.reason.clear();
  return true;
}

Loader& loaded() {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  if (l.tried) return l;
  l.tried = true;
  l.reason.clear();
  for (const auto& c : candidates(l))
    if (try_open(l, c)) return l;
  std::string tried = l.reason;
  l.reason = "NVRTC (libnvrtc.so.13) was not found. Install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`, "
             "or set GPUKIT_NVRTC_PATH to the library.";
  if (!tried.empty()) l.reason += " Tried:" + tried;
  return l;
}

const Api& api() { return L().api; }

// Minimal <cstdint> for NVRTC, which has no standard library: the same typedefs as
// libcu++'s NVRTC branch, so including both is fine.
constexpr const char* kStdint = R"(#pragma once
typedef signed char int8_t; typedef signed short int16_t; typedef signed int int32_t; typedef signed long long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long long uint64_t; typedef signed long long intptr_t; typedef unsigned long long uintptr_t;
#ifdef __cplusplus
namespace std { using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t; using ::uint8_t;
using ::uint16_t; using ::uint32_t; using ::uint64_t; using ::intptr_t; using ::uintptr_t; }
#endif
#ifndef INT32_MAX
#define INT8_MIN (-128)
#define INT8_MAX 127
#define UINT8_MAX 255
#define INT16_MIN (-32768)
#define INT16_MAX 32767
#define UINT16_MAX 65535
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define UINT32_MAX 4294967295u
#define INT64_MIN (-9223372036854775807ll - 1)
#define INT64_MAX 9223372036854775807ll
#define UINT64_MAX 18446744073709551615ull
#endif
)";

}  // namespace

bool available() { return loaded().handle != nullptr; }
std::string unavailable_reason() { return loaded().reason; }
std::string nvrtc_path() { return loaded().path; }
std::pair<int, int> nvrtc_version() {
  Loader& l = loaded();
  return {l.major, l.minor};
}
std::vector<int> supported_archs() { return loaded().archs; }

void add_search_paths(const std::vector<std::string>& libs, const std::vector<std::string>& includes) {
  Loader& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  for (const auto& p : libs) l.extra_libs.push_back(p);
  for (const auto& p : includes) l.extra_includes.push_back(p);
}

std::vector<std::string> default_include_dirs() {
  Loader& l = loaded();
  std::vector<std::string> cands;
  std::string e = env("GPUKIT_CUDA_INCLUDE");
  if (!e.empty()) cands.push_back(e);
  if (!l.path.empty()) {
    auto slash = l.path.rfind('/');
    if (slash != std::string::npos) cands.push_back(l.path.substr(0, slash) + "/../include");
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    std::string h = env(var);
    if (!h.empty()) cands.push_back(h + "/include");
  }
  cands.push_back("/usr/local/cuda/include");
  {
    std::lock_guard<std::mutex> lk(l.mu);
    for (const auto& p : l.extra_includes) cands.push_back(p);
  }
  std::vector<std::string> out;
  for (const auto& c : cands) {
    if (!is_file(c + "/cuda_fp16.h")) continue;
    out.push_back(c);
    if (is_dir(c + "/cccl")) out.push_back(c + "/cccl");  // CUDA 13: <cuda/std/...>
    break;
  }
  return out;
}

namespace detail {

void require_nvrtc() {
  if (!available())
    throw Error("gk.jit: NVRTC is not available. " + unavailable_reason());
}

RawResult nvrtc_compile(const std::string& source, const std::string& prog_name, const std::string& name_expr,
                        const std::vector<std::string>& options, bool cubin) {
  require_nvrtc();
  const Api& a = api();
  const char* hdr_src[] = {kStdint, kStdint};
  const char* hdr_names[] = {"cstdint", "stdint.h"};
  nvrtcProgram prog = nullptr;
  nvrtcResult r = a.CreateProgram(&prog, source.c_str(), prog_name.c_str(), 2, hdr_src, hdr_names);
  if (r != 0) throw Error(cat("gk.jit: nvrtcCreateProgram failed: ", a.GetErrorString(r)));
  struct Guard {
    const Api& a;
    nvrtcProgram& p;
    ~Guard() { a.DestroyProgram(&p); }
  } guard{a, prog};
  r = a.AddNameExpression(prog, name_expr.c_str());
  if (r != 0) throw ValueError(cat("name: NVRTC rejected the name expression '", name_expr, "': ", a.GetErrorString(r)));
  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  detail::count_compile();
  nvrtcResult cr = a.CompileProgram(prog, int(opts.size()), opts.data());
  RawResult out;
  size_t n = 0;
  if (a.GetProgramLogSize(prog, &n) == 0 && n > 1) {
    std::string log(n, '\0');
    if (a.GetProgramLog(prog, log.data()) == 0) out.log = log.substr(0, log.find('\0'));
  }
  if (cr != 0) {
    if (out.log.empty()) out.log = a.GetErrorString(cr);
    return out;
  }
  const char* lowered = nullptr;
  r = a.GetLoweredName(prog, name_expr.c_str(), &lowered);
  if (r != 0 || !lowered)
    throw ValueError(cat("name: '", name_expr, "' does not name a __global__ function in the source (",
                         a.GetErrorString(r), ")"));
  out.lowered_name = lowered;
  out.cubin = cubin;
  if (cubin) {
    r = a.GetCUBINSize(prog, &n);
    if (r == 0) {
      out.binary.resize(n);
      r = a.GetCUBIN(prog, out.binary.data());
    }
  } else {
    r = a.GetPTXSize(prog, &n);
    if (r == 0) {
      out.binary.resize(n);
      r = a.GetPTX(prog, out.binary.data());  // NUL-terminated, as the loader expects
    }
  }
  if (r != 0) throw Error(cat("gk.jit: reading the compiled code failed: ", a.GetErrorString(r)));
  if (out.binary.empty()) throw Error("gk.jit: NVRTC produced no code");
  out.ok = true;
  return out;
}

}  // namespace detail
}  // namespace gk::jit
