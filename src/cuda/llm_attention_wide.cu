// EngineOptions::fused_attention_wide: the engine's fused decode attention (llm_attention.cu
// describes it) with 2 or 4 times the warps per CTA, for the MMA passes and chunks of 64 / 128
// keys. The kernel is llm_attention_kernel.cuh's with WM = 2 / 4 (the same bits as WM = 1);
// its instances live here so that llm_attention.cu's kernels and their build stay as they were.
// llm_attention_rope (llm_attention.cu) checks the arguments and chooses the merge, then calls
// this for AttnArgs::wide.
#include <type_traits>

#include "core/cuda_util.h"
#include "gpukit/errors.h"
#include "cuda/llm_attention_kernel.cuh"
#include "cuda/llm_attention_launch.cuh"
#include "llm/fused.h"

namespace gk::cuda {

void llm_attention_rope_wide(const llm::AttnArgs& a, const llm::ProjRope& rope, void* stream, bool cl, bool push) {
  auto st = static_cast<cudaStream_t>(stream);
  auto go = [&](auto tv, auto dv, auto kv, auto wv) {
    using T = decltype(tv);
    constexpr int D = decltype(dv)::value, KC = decltype(kv)::value, WM = decltype(wv)::value;
    push ? attn_launch<T, D, KC, 2, WM>(a, rope, st)
         : cl ? attn_launch<T, D, KC, 1, WM>(a, rope, st) : attn_launch<T, D, KC, 0, WM>(a, rope, st);
  };
  auto by_wm = [&](auto tv, auto dv, auto kv) {
    if (a.wide == 4) go(tv, dv, kv, std::integral_constant<int, 4>{});
    else go(tv, dv, kv, std::integral_constant<int, 2>{});
  };
  auto by_chunk = [&](auto tv, auto dv) {
    if (a.chunk == 64) by_wm(tv, dv, std::integral_constant<int, 64>{});
    else by_wm(tv, dv, std::integral_constant<int, 128>{});
  };
  auto by_d = [&](auto tv) {
    if (a.D == 64) by_chunk(tv, std::integral_constant<int, 64>{});
    else by_chunk(tv, std::integral_constant<int, 128>{});
  };
  if (a.wide != 2 && a.wide != 4) throw ValueError("attention_rope: wide 2 or 4");
  if (!a.mma || (a.chunk != 64 && a.chunk != 128)) throw ValueError("attention_rope: wide needs mma and chunks of 64 / 128");
  if (a.dtype == DType::bf16) by_d(bf16{});
  else if (a.dtype == DType::f16) by_d(f16{});
  else throw TypeError("attention_rope: bfloat16 or float16 expected");
}

}  // namespace gk::cuda
