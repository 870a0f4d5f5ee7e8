// The engine's decode attention for short contexts (see llm/fused.h, attention_rope):
// RoPE of q and k, the paged KV append of the new token and attention over the
// sequence's keys in one launch, written for programmatic dependent launch:
//   1. before waiting for the q/k/v projection, each CTA copies (cp.async) the cached
//      keys and values of its chunk (positions < pos: written by earlier steps) into
//      shared memory and lets the next kernel (the output projection) launch, so its
//      weight loads start while attention runs;
//   2. after the wait: q of the group's query heads and the new k, v from the
//      projection's output, rotated exactly as rope_append does (the same bits in the
//      cache); the CTA whose chunk holds the new position stores k, v in the cache;
//   3. scores (one key per thread), softmax per head, P V (one dimension per thread),
//      fp32 throughout;
//   4. one chunk: the output directly; several: each chunk writes (o, max, sum) to the
//      workspace and the last CTA of the (sequence, kv head) to finish (an integer
//      counter, reset by it) merges the chunks in chunk order.
// Every sum has a fixed order: the same bits every run, whatever the other sequences.
// The kernel: llm_attention_kernel.cuh; here its launch and the entry points.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/attention.cuh"
#include "cuda/common/rows.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/llm_attention_kernel.cuh"
#include "cuda/llm_attention_launch.cuh"
#include "cuda/llm_attention_parts.cuh"
#include "cuda/llm_attention_push.cuh"
#include "cuda/llm_common.cuh"
#include "llm/fused.h"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace llmk;
}  // namespace

int64_t llm_attention_ws_floats(int64_t B, int64_t hkv, int64_t S) { return B * hkv * S * kAG * (128 + 2); }

int llm_attention_rope(const llm::AttnArgs& a, const llm::ProjRope& rope, void* stream) {
  if (a.B <= 0) return 0;
  if (a.D != 64 && a.D != 128) throw ValueError("attention_rope: head_dim 64 or 128");
  if (a.hkv <= 0 || a.hq % a.hkv || a.hq / a.hkv > kAG) throw ValueError("attention_rope: at most 8 query heads per kv head");
  if (a.S <= 0 || a.S > 65535 || a.hkv > 65535 || a.B > 65535) throw ValueError("attention_rope: grid too large");
  auto st = static_cast<cudaStream_t>(stream);
  if (a.chunk != 64 && a.chunk != 128 && a.chunk != 256 && a.chunk != 384)
    throw ValueError("attention_rope: chunks of 64, 128, 256 or 384 keys");
  // the cluster merge for 2..8 chunks of 64 / 128 keys
  const bool cl = a.cluster && a.S >= 2 && a.S <= 8 && a.chunk <= 128;
  const bool push = cl && a.push && a.mma;  // the push merge: with the MMA passes only
  // wide (fused_attention_wide 2 / 4): the kernels with that many times the warps
  // (llm_attention_wide.cu), for the MMA passes and chunks of 64 / 128 keys (else ignored)
  // wide 1 (fused_attention_wide -1, auto): 4 where the grid's CTAs fit two per SM (a 4x CTA
  // holds 32K registers), else 2. WM never changes the bits, so it may depend on the batch.
  int wide = a.wide;
  if (wide == 1) wide = int64_t(a.B) * a.hkv * a.S <= 2 * int64_t(sm_count()) ? 4 : 2;
  if ((wide == 2 || wide == 4) && a.mma && a.chunk <= 128) {
    llm::AttnArgs w = a;
    w.wide = static_cast<unsigned char>(wide);
    llm_attention_rope_wide(w, rope, stream, cl, push);
    return (push ? 2 : cl ? 1 : 0) | 4 | (wide == 4 ? 8 : 0);
  }
  auto go = [&](auto tv) {
    using T = decltype(tv);
    auto by_chunk = [&](auto dv) {
      constexpr int D = decltype(dv)::value;
      switch (a.chunk) {
        case 64:
          push ? attn_launch<T, D, 64, 2>(a, rope, st)
               : cl ? attn_launch<T, D, 64, 1>(a, rope, st) : attn_launch<T, D, 64>(a, rope, st);
          break;
        case 128:
          push ? attn_launch<T, D, 128, 2>(a, rope, st)
               : cl ? attn_launch<T, D, 128, 1>(a, rope, st) : attn_launch<T, D, 128>(a, rope, st);
          break;
        case 256: attn_launch<T, D, 256>(a, rope, st); break;
        default: attn_launch<T, D, 384>(a, rope, st); break;
      }
    };
    if (a.D == 64) by_chunk(std::integral_constant<int, 64>{});
    else by_chunk(std::integral_constant<int, 128>{});
  };
  if (a.dtype == DType::bf16) go(bf16{});
  else if (a.dtype == DType::f16) go(f16{});
  else throw TypeError("attention_rope: bfloat16 or float16 expected");
  return push ? 2 : cl ? 1 : 0;
}

}  // namespace gk::cuda
