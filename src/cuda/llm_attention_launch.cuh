// The launch of the engine's fused decode attention kernel (llm_attention_kernel.cuh), shared
// by its two translation units: llm_attention.cu (WM = 1) and llm_attention_wide.cu (WM = 2 / 4,
// EngineOptions::fused_attention_wide; compiled apart so that the kernels of WM = 1 and their
// build stay as they were).
#pragma once
#include <algorithm>

#include "core/cuda_util.h"
#include "cuda/llm_attention_kernel.cuh"
#include "cuda/llm_attention_push.cuh"
#include "llm/fused.h"

namespace gk::cuda {
namespace {

template <class T, int D, int KC, int CL = 0, int WM = 1>
void attn_launch(const llm::AttnArgs& a, const llm::ProjRope& rope, cudaStream_t st) {
  const size_t smem = ACfg<D, KC>::SMEM + (CL == 2 ? push_recv_bytes<D, kAG>(a.S) : 0);
  static_assert(ACfg<D, KC>::SMEM + (CL == 2 ? push_recv_bytes<D, kAG>(8) : 0) + size_t(KC) * 8 + 256 <= 227 * 1024,
                "shared memory (dynamic + static)");
  decltype(&k_attn_rope<T, D, KC, CL, true, false, WM>) kern = nullptr;  // (instantiates no kernel)
  if constexpr (WM == 1) {
    kern = k_attn_rope<T, D, KC, CL, true>;
    if constexpr (CL != 2) kern = a.mma ? kern : k_attn_rope<T, D, KC, CL, false>;
    // early (fused_attention_early_rope): the MMA kernels of 64 / 128-key chunks only (the same
    // bits as without it: the other kernels ignore it)
    if constexpr (KC <= 128)
      if (a.early && a.mma) kern = k_attn_rope<T, D, KC, CL, true, true>;
  } else {
    // WM times the warps (the caller takes these for mma and chunks of 64 / 128 keys; early is ignored)
    kern = k_attn_rope<T, D, KC, CL, true, false, WM>;
  }
  // pad_kb: at least that much dynamic shared memory (within a CTA's 227 KiB beside the static part)
  constexpr size_t kMaxDyn = 227 * 1024 - size_t(KC) * 8 - 256;
  const size_t dyn = std::max(smem, std::min(size_t(a.pad_kb) * 1024, kMaxDyn));
  GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dyn)));
  set_carveout(kern);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(a.S), unsigned(a.hkv), unsigned(a.B));
  cfg.blockDim = dim3(unsigned(at_threads(KC) * WM));
  cfg.dynamicSmemBytes = dyn;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  unsigned na = 0;
  if (CL) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = unsigned(a.S);
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  if (a.pdl) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  GK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, rope));
  GK_LAUNCH_CHECK("llm_attention_rope");
}

}  // namespace
}  // namespace gk::cuda
