// Run-time compilation of CUDA C++ kernels with NVRTC (gk.jit).
//
// NVRTC is loaded with dlopen on first use (GPUKIT_NVRTC_PATH, the loader path, the
// CUDA toolkit, then paths registered by the Python layer such as the PyPI
// nvidia-cuda-nvrtc wheel); gpukit never links it. Compiled code is cached in memory
// and on disk, keyed by a SHA-256 of the source, options, name expression, target
// architecture and NVRTC version. Kernels are loaded and launched through the CUDA
// runtime's library API (cudaLibraryLoadData / cudaLaunchKernel) on gpukit streams,
// so launches are stream-ordered, capturable in a Graph, and sticky faults mark the
// device failed like every other gpukit call.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpukit/array.h"
#include "gpukit/dtype.h"
#include "gpukit/errors.h"
#include "gpukit/stream.h"

namespace gk::jit {

// A compile error. what() holds a summary with the offending source line; `log` is
// NVRTC's full log.
struct JitError : Error {
  JitError(const std::string& msg, std::string log, int line, std::string source_line)
      : Error(msg), log(std::move(log)), line(line), source_line(std::move(source_line)) {}
  std::string log;
  int line;  // 1-based line of the first error in the user's source; 0 when unknown
  std::string source_line;
};

// ---- NVRTC availability ----
bool available();              // loads NVRTC on first call
std::string unavailable_reason();  // empty when available: the paths tried and why each failed
std::string nvrtc_path();      // the library that was loaded
std::pair<int, int> nvrtc_version();
std::vector<int> supported_archs();  // e.g. {75, 80, ..., 90, 100, 120}
// Candidate library files / directories and include directories from the Python layer
// (PyPI wheels). Only consulted when NVRTC is not loaded yet.
void add_search_paths(const std::vector<std::string>& libs, const std::vector<std::string>& includes);
std::vector<std::string> default_include_dirs();  // headers added with -I (cuda_fp16.h, ...)

// ---- caches ----
struct Stats {
  uint64_t nvrtc_compiles = 0;  // programs compiled by NVRTC
  uint64_t memory_hits = 0;
  uint64_t disk_hits = 0;
  uint64_t disk_writes = 0;
  uint64_t disk_errors = 0;     // unreadable, corrupt or unwritable cache files (ignored)
  uint64_t library_loads = 0;   // cudaLibraryLoadData calls
  uint64_t launches = 0;
};
Stats stats();
void reset_stats();
void clear_memory_cache();
std::string cache_dir();  // $GPUKIT_CACHE_DIR/jit, else $XDG_CACHE_HOME/gpukit/jit, else ~/.cache/gpukit/jit

// ---- signatures ----
enum class ParamKind : uint8_t { Pointer, Int, UInt, Float, Bool };
struct ParamType {
  ParamKind kind = ParamKind::Pointer;
  int size = 8;                   // bytes in the kernel's parameter buffer
  std::optional<DType> elem;      // pointers: the element dtype when it is a known type;
                                  // scalars: the value's type (f16/bf16 scalars are packed as such)
  bool any_elem = false;          // void* / char*: accepts every dtype
  bool unsigned_elem = false;     // unsigned integer pointees: any integer/bool dtype of the same size
  int elem_size = 0;              // pointers: bytes of the element type when known
  std::string spelling;           // as written (after template substitution)
};
// Parses a C++ parameter type ("const float* __restrict__", "int64_t", "unsigned",
// "__nv_bfloat16*", ...). Throws ValueError naming `arg` for unsupported types.
ParamType parse_type(std::string_view spelling, const std::string& arg = "types");
struct Signature {
  std::vector<ParamType> params;
  std::vector<std::string> names;  // parameter names ("" when unnamed)
};
// Finds the __global__ declaration of `name_expr`'s kernel (template arguments of the
// name expression substituted) and parses its parameter list; nullopt when not found.
std::optional<Signature> find_signature(std::string_view source, std::string_view name_expr);

// ---- compilation ----
struct Program {
  std::string key;           // hex SHA-256 of everything that determines the code
  std::string name_expr;
  std::string lowered_name;  // the symbol to load
  std::string arch;          // "sm_90a" (CUBIN) or "compute_90" (PTX)
  bool cubin = true;
  std::string binary;        // CUBIN bytes, or PTX text
  std::string log;           // NVRTC's log (warnings)
  std::string origin;        // "nvrtc", "memory" or "disk"
};
// Normalizes "90a", "sm_90a", "compute_80" ...; throws ValueError naming `arg`.
std::string normalize_arch(std::string_view arch, const char* arg = "arch");
// The target for a device: sm_XY (sm_XYa for compute capability >= 9) when NVRTC
// supports it, else PTX for the newest architecture it does.
std::string arch_for_device(Device d);
// Compiles (or fetches from the caches) `source` for `arch`. Throws JitError on a
// compile error, ValueError when NVRTC is missing or arguments are bad.
std::shared_ptr<const Program> compile(const std::string& source, const std::string& name_expr,
                                       const std::vector<std::string>& options, const std::string& arch,
                                       bool use_cache = true);
std::string cache_key(const std::string& source, const std::string& name_expr,
                      const std::vector<std::string>& options, const std::string& arch);

// ---- kernels ----
// One launch argument, as the bindings extract it from Python objects.
struct Arg {
  enum Kind : uint8_t { Null, Pointer, Int, Float, Bool, Other } kind = Null;  // Other: not passable
  void* ptr = nullptr;
  std::optional<Device> device;   // pointers: where the memory lives, when known
  std::optional<DType> dtype;     // pointers: element type, when known
  const Array* array = nullptr;    // gk arrays: for allocator stream bookkeeping
  int64_t i = 0;
  bool big_unsigned = false;      // an integer above INT64_MAX, held in u
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string what;               // the Python type name, for error messages
};

struct Dim3 {
  int64_t x = 1, y = 1, z = 1;
};

// The CUDA device holding a device or managed pointer (cudaPointerGetAttributes);
// cpu for host memory and unknown pointers.
Device pointer_device(const void* p);

class Kernel {
 public:
  // Compiles for `device` (or `arch` when given: compile-only use without a GPU).
  // `types` overrides the parameter types parsed from the source.
  static Kernel create(std::string source, std::string name_expr, std::vector<std::string> options,
                       std::string arch, std::optional<std::vector<std::string>> types,
                       std::optional<Device> device, bool use_cache = true);
  const Signature& signature() const;   // throws TypeError when unknown
  bool has_signature() const;
  std::shared_ptr<const Program> program() const;  // the first compiled program
  const std::string& name() const;
  // Packs arguments into the kernel's parameter buffer (validation only: no launch).
  // Returns the bytes, each parameter at its natural alignment.
  std::string pack(const std::vector<Arg>& args) const;
  void launch(Dim3 grid, Dim3 block, const std::vector<Arg>& args, size_t shared_mem, const Stream* stream) const;
  struct State;

 private:
  std::shared_ptr<State> s_;
};

}  // namespace gk::jit
