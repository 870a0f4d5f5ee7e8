// Compilation with the memory and disk caches; architecture selection; stats.
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "jit/internal.h"

namespace gk::jit {
namespace {

// ---- stats ----
struct Counters {
  std::atomic<uint64_t> compiles{0}, mem_hits{0}, disk_hits{0}, disk_writes{0}, disk_errors{0}, loads{0}, launches{0};
};
Counters& C() {
  static auto* c = new Counters();
  return *c;
}

// ---- memory cache ----
std::mutex g_mu;
std::map<std::string, std::shared_ptr<const Program>>& memory() {
  static auto* m = new std::map<std::string, std::shared_ptr<const Program>>();
  return *m;
}

constexpr const char* kProgName = "gpukit_jit.cu";
constexpr const char kMagic[8] = {'G', 'K', 'J', 'I', 'T', '0', '1', '\n'};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

void mkdirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return;
    }
  }
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
void put_str(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

// Bounds-checked reader over a cache file's bytes.
struct Reader {
  const std::string& d;
  size_t pos = 0;
  bool ok = true;
  uint64_t u64() {
    if (d.size() - pos < 8) {
      ok = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(d[pos + i])) << (8 * i);
    pos += 8;
    return v;
  }
  std::string str() {
    uint64_t n = u64();
    if (!ok || n > d.size() - pos) {
      ok = false;
      return {};
    }
    std::string s = d.substr(pos, n);
    pos += n;
    return s;
  }
};

std::string serialize(const Program& p) {
  std::string out(kMagic, 8);
  put_u64(out, p.cubin ? 1 : 0);
  put_str(out, p.key);
  put_str(out, p.name_expr);
  put_str(out, p.lowered_name);
  put_str(out, p.arch);
  put_str(out, p.binary);
  put_str(out, p.log);
  out += detail::sha256_hex(out);
  return out;
}

// ---- compile errors ----
[[noreturn]] void throw_compile_error(const std::string& source, const std::string& name_expr,
                                      const std::string& arch, const std::string& log) {
  int line = 0;
  std::string first;
  std::string prefix = std::string(kProgName) + "(";
  size_t pos = 0;
  while ((pos = log.find(prefix, pos)) != std::string::npos) {
    size_t num = pos + prefix.size(), end = num;
    while (end < log.size() && std::isdigit(static_cast<unsigned char>(log[end]))) ++end;
    if (end > num && log.compare(end, 3, "): ") == 0) {
      size_t eol = log.find('\n', pos);
      std::string msg = log.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
      if (msg.find("error") != std::string::npos) {
        line = std::atoi(log.substr(num, end - num).c_str());
        first = msg;
        break;
      }
    }
    pos = num;
  }
  if (first.empty()) {
    size_t e = log.find("error");
    if (e != std::string::npos) {
      size_t b = log.rfind('\n', e);
      b = b == std::string::npos ? 0 : b + 1;
      first = log.substr(b, log.find('\n', e) - b);
    }
  }
  std::string src_line;
  if (line > 0) {
    std::istringstream is(source);
    std::string l;
    for (int i = 0; i < line && std::getline(is, l); ++i) src_line = l;
  }
  auto [maj, min] = nvrtc_version();
  std::string msg = cat("gk.jit: compiling '", name_expr, "' for ", arch, " with NVRTC ", maj, ".", min, " failed");
  if (!first.empty()) msg += ":\n  " + first;
  if (line > 0) msg += cat("\n  line ", line, ": ", src_line);
  msg += "\n--- compile log ---\n" + log;
  throw JitError(msg, log, line, src_line);
}

}  // namespace

namespace detail {
void count_compile() { ++C().compiles; }
void count_memory_hit() { ++C().mem_hits; }
void count_disk_hit() { ++C().disk_hits; }
void count_disk_write() { ++C().disk_writes; }
void count_disk_error() { ++C().disk_errors; }
void count_library_load() { ++C().loads; }
void count_launch() { ++C().launches; }

bool disk_load(const std::string& key, Program& out) {
  std::string dir = cache_dir();
  if (dir.empty()) return false;
  std::string path = dir + "/" + key + ".bin";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  if (!S_ISREG(st.st_mode) || st.st_size < 8 + 64 || st.st_size > (int64_t(1) << 30)) {
    count_disk_error();
    return false;
  }
  std::ifstream f(path, std::ios::binary);
  std::string d(size_t(st.st_size), '\0');
  if (!f.read(d.data(), std::streamsize(d.size()))) {
    count_disk_error();
    return false;
  }
  std::string body = d.substr(0, d.size() - 64);
  if (body.compare(0, 8, std::string(kMagic, 8)) != 0 || sha256_hex(body) != d.substr(d.size() - 64)) {
    count_disk_error();
    return false;
  }
  Reader r{body, 8};
  uint64_t cubin = r.u64();
  Program p;
  p.cubin = cubin == 1;
  p.key = r.str();
  p.name_expr = r.str();
  p.lowered_name = r.str();
  p.arch = r.str();
  p.binary = r.str();
  p.log = r.str();
  if (!r.ok || r.pos != body.size() || cubin > 1 || p.key != key || p.binary.empty() || p.lowered_name.empty()) {
    count_disk_error();
    return false;
  }
  p.origin = "disk";
  out = std::move(p);
  return true;
}

void disk_store(const Program& p) {
  std::string dir = cache_dir();
  if (dir.empty()) return;
  mkdirs(dir);
  std::string data = serialize(p);
  std::random_device rd;
  std::string tmp = cat(dir, "/.", p.key, ".", getpid(), ".", rd(), ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f || !f.write(data.data(), std::streamsize(data.size())) || !f.flush()) {
      count_disk_error();
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), (dir + "/" + p.key + ".bin").c_str()) != 0) {
    count_disk_error();
    std::remove(tmp.c_str());
    return;
  }
  count_disk_write();
}
}  // namespace detail

Stats stats() {
  Stats s;
  s.nvrtc_compiles = C().compiles;
  s.memory_hits = C().mem_hits;
  s.disk_hits = C().disk_hits;
  s.disk_writes = C().disk_writes;
  s.disk_errors = C().disk_errors;
  s.library_loads = C().loads;
  s.launches = C().launches;
  return s;
}

void reset_stats() {
  C().compiles = 0;
  C().mem_hits = 0;
  C().disk_hits = 0;
  C().disk_writes = 0;
  C().disk_errors = 0;
  C().loads = 0;
  C().launches = 0;
}

void clear_memory_cache() {
  std::lock_guard<std::mutex> lk(g_mu);
  memory().clear();
}

std::string cache_dir() {
  std::string d = env("GPUKIT_CACHE_DIR");
  if (!d.empty()) return d + "/jit";
  d = env("XDG_CACHE_HOME");
  if (!d.empty()) return d + "/gpukit/jit";
  d = env("HOME");
  if (!d.empty()) return d + "/.cache/gpukit/jit";
  return {};
}

std::string normalize_arch(std::string_view a, const char* arg) {
  std::string s(a);
  bool ptx = false;
  if (s.rfind("sm_", 0) == 0) {
    s = s.substr(3);
  } else if (s.rfind("compute_", 0) == 0) {
    s = s.substr(8);
    ptx = true;
  }
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  std::string suffix = s.substr(digits);
  if (digits < 2 || digits > 3 || !(suffix.empty() || suffix == "a" || suffix == "f"))
    throw ValueError(cat(arg, ": invalid architecture '", a, "' (expected e.g. 'sm_90a', 'sm_80' or 'compute_90')"));
  return (ptx ? "compute_" : "sm_") + s;
}

std::string arch_for_device(Device d) {
  if (!d.is_cuda() || !cuda_available())
    throw ValueError(cat("device: gk.jit needs a CUDA device to pick the architecture (got ", d.str(),
                         "); pass arch='sm_90a' (or another) to compile without one"));
  detail::require_nvrtc();
  DeviceProperties p = device_properties(d);
  int cc = p.major * 10 + p.minor;
  auto archs = supported_archs();
  bool supported = false;
  int best = 0;
  for (int a : archs) {
    if (a == cc) supported = true;
    if (a <= cc && a > best) best = a;
  }
  if (supported) return cat("sm_", cc, p.major >= 9 ? "a" : "");
  if (best == 0) throw ValueError(cat("device: NVRTC supports no architecture at or below sm_", cc));
  return cat("compute_", best);  // the driver compiles the PTX for the newer device
}

std::string cache_key(const std::string& source, const std::string& name_expr,
                      const std::vector<std::string>& options, const std::string& arch) {
  auto [maj, min] = nvrtc_version();
  std::string k = "gpukit-jit-1";
  put_str(k, source);
  put_str(k, name_expr);
  put_str(k, arch);
  put_str(k, cat(maj, ".", min));
  put_u64(k, options.size());
  for (const auto& o : options) put_str(k, o);
  return detail::sha256_hex(k);
}

std::shared_ptr<const Program> compile(const std::string& source, const std::string& name_expr,
                                       const std::vector<std::string>& options, const std::string& arch_in,
                                       bool use_cache) {
  if (name_expr.empty()) throw ValueError("name: the kernel name must not be empty");
  if (source.find('\0') != std::string::npos) throw ValueError("source: contains a NUL character");
  for (const auto& o : options) {
    if (o.rfind("--gpu-architecture", 0) == 0 || o.rfind("-arch", 0) == 0)
      throw ValueError(cat("options: '", o, "': pass the architecture as arch=... instead"));
    if (o.find('\0') != std::string::npos) throw ValueError("options: contains a NUL character");
  }
  detail::require_nvrtc();
  std::string arch = normalize_arch(arch_in);
  bool cubin = arch.rfind("sm_", 0) == 0;
  std::vector<std::string> full{"--gpu-architecture=" + arch};
  for (const auto& inc : default_include_dirs()) full.push_back("-I" + inc);
  full.insert(full.end(), options.begin(), options.end());
  std::string key = cache_key(source, name_expr, full, arch);
  if (use_cache) {
    {
      std::lock_guard<std::mutex> lk(g_mu);
      auto it = memory().find(key);
      if (it != memory().end()) {
        detail::count_memory_hit();
        return it->second;
      }
    }
    Program p;
    if (detail::disk_load(key, p)) {
      detail::count_disk_hit();
      auto sp = std::make_shared<const Program>(std::move(p));
      std::lock_guard<std::mutex> lk(g_mu);
      return memory().emplace(key, sp).first->second;
    }
  }
  detail::RawResult r = detail::nvrtc_compile(source, kProgName, name_expr, full, cubin);
  if (!r.ok) throw_compile_error(source, name_expr, arch, r.log);
  Program p;
  p.key = key;
  p.name_expr = name_expr;
  p.lowered_name = r.lowered_name;
  p.arch = arch;
  p.cubin = cubin;
  p.binary = std::move(r.binary);
  p.log = std::move(r.log);
  p.origin = "nvrtc";
  auto sp = std::make_shared<const Program>(std::move(p));
  if (use_cache) {
    detail::disk_store(*sp);
    std::lock_guard<std::mutex> lk(g_mu);
    memory().emplace(key, sp);
  }
  return sp;
}

}  // namespace gk::jit
