// Internal pieces of the JIT shared by src/jit/*.cpp.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "gpukit/jit.h"

namespace gk::jit::detail {

// Result of one NVRTC compilation.
struct RawResult {
  bool ok = false;
  std::string log, binary, lowered_name;
  bool cubin = true;
};
// Compiles with NVRTC (which must be available). `options` are complete
// (architecture and include directories included).
RawResult nvrtc_compile(const std::string& source, const std::string& prog_name, const std::string& name_expr,
                        const std::vector<std::string>& options, bool cubin);
// Throws ValueError when NVRTC cannot be loaded, saying where it was looked for.
void require_nvrtc();

std::string sha256_hex(const std::string& data);

// Disk cache: load returns false on a miss or a corrupt file (counted in stats).
bool disk_load(const std::string& key, Program& out);
void disk_store(const Program& p);

// Stats counters (atomic).
void count_compile();
void count_memory_hit();
void count_disk_hit();
void count_disk_write();
void count_disk_error();
void count_library_load();
void count_launch();

}  // namespace gk::jit::detail
