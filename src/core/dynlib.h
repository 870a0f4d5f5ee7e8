// Helpers for libraries gpukit loads at run time (NVRTC, cuBLASLt): environment
// look-ups, file tests, and the ordered list of places to try.
#pragma once
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

}  // namespace gk::dynlib
