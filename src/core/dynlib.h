// Helpers for libraries gpukit loads at run time (NVRTC, cuBLASLt): environment
// look-ups, file tests, the ordered list of places to try, dlopen / dlsym with the
// reasons a candidate was passed over.
#pragma once
#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace gk::dynlib {

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
inline bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
inline bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Candidates for dlopen, in order: the file or folder named by $path_env; then (unless
// $no_search_env is set to something other than "0") the bare names for the loader's
// own search, $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64 and `extra`
// (files or folders, e.g. pip wheel directories). A folder stands for each name in it.
inline std::vector<std::string> candidates(const char* path_env, std::initializer_list<const char*> names,
                                           const std::vector<std::string>& extra,
                                           const char* no_search_env = nullptr) {
  std::vector<std::string> c;
  auto add = [&](const std::string& p) {
    if (p.empty()) return;
    if (is_dir(p)) {
      for (const char* n : names) c.push_back(p + "/" + n);
    } else {
      c.push_back(p);
    }
  };
  add(env(path_env));
  if (no_search_env) {
    std::string v = env(no_search_env);
    if (!v.empty() && v != "0") return c;
  }
  for (const char* n : names) c.push_back(n);
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    std::string h = env(var);
    if (!h.empty()) add(h + "/lib64");
  }
  add("/usr/local/cuda/lib64");
  for (const auto& p : extra) add(p);
  return c;
}

// dlopen(cand, RTLD_NOW | RTLD_LOCAL), where a path (a name with '/') must name a file; on
// failure nullptr, with "\n  <cand>: <why>" appended to reason.
inline void* open_lib(const std::string& cand, std::string& reason) {
  if (cand.find('/') != std::string::npos && !is_file(cand)) {
    reason += "\n  " + cand + ": no such file";
    return nullptr;
  }
  void* h = dlopen(cand.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    reason += "\n  " + cand + ": " + (e ? e : "dlopen failed");
  }
  return h;
}

// out = the symbol name of h; false where h has none (the first such name goes to missing).
template <class F>
bool sym(void* h, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(dlsym(h, name));
  if (!out && missing.empty()) missing = name;
  return out != nullptr;
}

// The file h was loaded from: its folder (dlinfo) and cand's file name; cand where the
// folder is unknown.
inline std::string loaded_path(void* h, const std::string& cand) {
  char buf[4096];
  if (dlinfo(h, RTLD_DI_ORIGIN, buf) != 0) return cand;
  const auto slash = cand.rfind('/');
  return std::string(buf) + "/" + (slash == std::string::npos ? cand : cand.substr(slash + 1));
}

}  // namespace gk::dynlib
