// Host side of the fused sampling kernel (src/cuda/sampling_fused.cu): the cluster shape by
// batch size, the per-thread geometry of a slice, the shared-memory plan and the development
// knobs read from the environment (GPUKIT_SAMPLING_*; results never depend on them).
#pragma once
#include <cstdint>
#include <cstdlib>

#include "cuda/common/sampling_cluster.cuh"

namespace gk::cuda {
namespace {
using namespace fused;

struct Cfg {
  int CL, NT;
};

int env_int(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::atoi(e) : 0;
}

// Few rows: 16-CTA clusters (the rows' work spread over as many SMs as a cluster allows);
// many rows: 8-CTA clusters, two 512-thread CTAs per SM.
// Development knobs (bench/sampling.py --breakdown): GPUKIT_SAMPLING_CLUSTER (1-16) and
// GPUKIT_SAMPLING_THREADS (512 or 1024) force the shape; results never depend on it (every
// decision is an exact integer), only the speed does.
Cfg pick_cfg(int64_t B, int64_t V) {
  Cfg c{B <= 4 ? 16 : 8, 512};  // (16 x 512 measured fastest for B = 1 at checkpoint A; 1024 unmeasured)
  const int ecl = env_int("GPUKIT_SAMPLING_CLUSTER"), ent = env_int("GPUKIT_SAMPLING_THREADS");
  if (ecl >= 1 && ecl <= 16) c.CL = ecl;
  if (ent == 512 || ent == 1024) c.NT = ent;
  const int64_t by_v = (V + 2047) / 2048;  // at least ~2048 entries per CTA
  if (by_v < c.CL) c.CL = int(by_v < 1 ? 1 : by_v);
  return c;
}

FGeo geo_for(int64_t V, Cfg c) {
  FGeo g;
  g.CL = c.CL;
  g.S = ((V + c.CL - 1) / c.CL + 7) / 8 * 8;
  int64_t E = (g.S + c.NT - 1) / c.NT;
  if (E % 2 == 0) ++E;
  g.E = int(E);
  g.aligned = 0;
  g.early = 1, g.stop = 0, g.cache = 0, g.compact = 1, g.qsel = 1, g.rot = 1, g.cmask = 1, g.tmask = 1, g.pipe = 1;
  if (const char* e = std::getenv("GPUKIT_SAMPLING_PIPE"); e && e[0] == '0') g.pipe = 0;
  if (const char* e = std::getenv("GPUKIT_SAMPLING_TMASK"); e && e[0] == '0') g.tmask = 0;
  if (const char* e = std::getenv("GPUKIT_SAMPLING_CMASK"); e && e[0] == '0') g.cmask = 0;
  if (const char* e = std::getenv("GPUKIT_SAMPLING_COMPACT"); e && e[0] == '0') g.compact = 0;
  if (const char* e = std::getenv("GPUKIT_SAMPLING_ROT"); e && e[0] == '0') g.rot = 0;
  if (const char* e = std::getenv("GPUKIT_SAMPLING_EARLY"); e && e[0] == '0') g.early = 0;
  g.stop = env_int("GPUKIT_SAMPLING_STOP");
  return g;
}
bool geo_ok(const FGeo& g, Cfg c) { return g.E <= kMaxE && size_t(g.E) * size_t(c.NT) * 4 <= size_t(kMaxDyn); }
// Dynamic shared memory: the slice, and the relative-exp cache where it is on (few rows: one
// CTA per SM anyway; many rows would lose the second CTA per SM). GPUKIT_SAMPLING_CACHE=0/1
// forces it (development); it is dropped where the two arrays do not fit.
size_t smem_of(FGeo& g, Cfg c, int64_t B) {
  const size_t one = size_t(g.E) * size_t(c.NT) * 4;
  const int ec = env_int("GPUKIT_SAMPLING_CACHE");
  const char* ee = std::getenv("GPUKIT_SAMPLING_CACHE");
  g.cache = ee ? (ec != 0) : (B <= 4);
  if (2 * one > size_t(kMaxDyn)) g.cache = 0;
  return g.cache ? 2 * one : one;
}

}  // namespace
}  // namespace gk::cuda
