// EngineOptions from the environment: the GPUKIT_* variables that set a new model's defaults (each
// documented at its field in include/gpukit/llm.h). Moved out of model.cpp (session 8).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gpukit/errors.h"
#include "llm/internal.h"

namespace gk::llm {

namespace {
// The default EngineOptions::fusion of a new model: GPUKIT_ENGINE_FUSION (0, 1, 2), or
// GPUKIT_ENGINE_UNFUSED=1 for 0; otherwise 2.
int env_fusion() {
  if (const char* e = std::getenv("GPUKIT_ENGINE_FUSION"); e && *e) {
    if (std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0) return e[0] - '0';
    throw ValueError(cat("GPUKIT_ENGINE_FUSION: expected 0, 1 or 2, got \"", e, "\""));
  }
  if (const char* e = std::getenv("GPUKIT_ENGINE_UNFUSED"); e && std::strcmp(e, "1") == 0) return 0;
  return 2;
}
bool env_flag(const char* name, bool dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  return std::strcmp(e, "0") != 0;
}
int64_t env_mb(const char* name, int64_t dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  if (*end || v < 0 || v > 4096) throw ValueError(cat(name, ": expected MiB in [0, 4096], got \"", e, "\""));
  return v;
}
}  // namespace

// The environment's defaults of a new model's options.
void env_options(EngineOptions& o) {
  o.fusion = env_fusion();
  o.rope_in_qkv = env_flag("GPUKIT_ROPE_IN_QKV", false);
  o.norm_in_tail = env_flag("GPUKIT_NORM_IN_TAIL", false);
  o.prefetch_mb = env_mb("GPUKIT_PREFETCH_MB", o.prefetch_mb);
  o.prefetch_last = env_flag("GPUKIT_PREFETCH_LAST", o.prefetch_last);
  o.head_proj = env_flag("GPUKIT_HEAD_PROJ", o.head_proj);
  o.embed_norm = env_flag("GPUKIT_EMBED_NORM", o.embed_norm);
  o.dequant_prefill = env_flag("GPUKIT_DEQUANT_PREFILL", o.dequant_prefill);
  o.fused_attention = env_flag("GPUKIT_FUSED_ATTN", o.fused_attention);
  o.fused_attention_auto = env_flag("GPUKIT_FUSED_ATTN_AUTO", o.fused_attention_auto);
  o.fused_attention_auto_hd64 = env_flag("GPUKIT_FUSED_ATTN_AUTO_HD64", o.fused_attention_auto_hd64);
  o.fused_attention_auto_quant = env_flag("GPUKIT_FUSED_ATTN_AUTO_QUANT", o.fused_attention_auto_quant);
  o.kv_l2 = env_flag("GPUKIT_KV_L2", o.kv_l2);
  o.weights_evict_first = env_flag("GPUKIT_WEIGHTS_EF", o.weights_evict_first);
  o.quant_streaming = env_flag("GPUKIT_QUANT_STREAMING", o.quant_streaming);
  o.fused_attention_mma = env_flag("GPUKIT_FUSED_ATTN_MMA", o.fused_attention_mma);
  o.fused_attention_push = env_flag("GPUKIT_FUSED_ATTN_PUSH", o.fused_attention_push);
  o.fused_attention_push_auto = env_flag("GPUKIT_FUSED_ATTN_PUSH_AUTO", o.fused_attention_push_auto);
  o.fused_attention_early_rope = env_flag("GPUKIT_FUSED_ATTN_EARLY", o.fused_attention_early_rope);
  o.o_proj_stage = env_flag("GPUKIT_O_PROJ_STAGE", o.o_proj_stage);
  if (const char* e = std::getenv("GPUKIT_QUANT_SMALL_PDL"); e && *e) o.quantized_small_pdl = std::atoi(e) & 3;
  if (const char* e = std::getenv("GPUKIT_FUSED_ATTN_WIDE"); e && *e) {
    if (std::strcmp(e, "-1") && std::strcmp(e, "0") && std::strcmp(e, "2") && std::strcmp(e, "4"))
      throw ValueError(cat("GPUKIT_FUSED_ATTN_WIDE: expected -1, 0, 2 or 4, got \"", e, "\""));
    o.fused_attention_wide = std::atoi(e);
  }
  if (const char* e = std::getenv("GPUKIT_FUSED_ATTN_PAD_KB"); e && *e)
    o.fused_attention_pad_kb = std::clamp(std::atoi(e), 0, 227);
  if (const char* e = std::getenv("GPUKIT_CARVEOUT"); e && *e) o.carveout = std::clamp(std::atoi(e), -1, 100);
  if (const char* e = std::getenv("GPUKIT_FUSED_ATTN_CHUNK"); e && *e) {
    if (std::strcmp(e, "-1") && std::strcmp(e, "0") && std::strcmp(e, "64") && std::strcmp(e, "128") &&
        std::strcmp(e, "256") && std::strcmp(e, "384"))
      throw ValueError(cat("GPUKIT_FUSED_ATTN_CHUNK: expected -1, 0, 64, 128, 256 or 384, got \"", e, "\""));
    o.fused_attention_chunk = std::atoi(e);
  }
  if (const char* e = std::getenv("GPUKIT_FUSED_ATTN_TRIGGER"); e && *e) {
    if (std::strlen(e) != 1 || e[0] < '0' || e[0] > '3')
      throw ValueError(cat("GPUKIT_FUSED_ATTN_TRIGGER: expected 0, 1, 2 or 3, got \"", e, "\""));
    o.fused_attention_trigger = e[0] - '0';
  }
  if (const char* e = std::getenv("GPUKIT_ATTN_L2"); e && *e) {
    if (std::strlen(e) != 1 || e[0] < '0' || e[0] > '4')
      throw ValueError(cat("GPUKIT_ATTN_L2: expected 0 to 4, got \"", e, "\""));
    o.attn_l2 = e[0] - '0';
  }
  o.fused_attention_cluster = env_flag("GPUKIT_FUSED_ATTN_CLUSTER", o.fused_attention_cluster);
  o.norm_in_proj = env_flag("GPUKIT_NORM_IN_PROJ", o.norm_in_proj);
  o.quantized_pdl = env_flag("GPUKIT_QUANT_PDL", o.quantized_pdl);
  o.quantized_pdl_fp8 = env_flag("GPUKIT_QUANT_PDL_FP8", o.quantized_pdl_fp8);
  o.quantized_pdl_compact = env_flag("GPUKIT_QUANT_PDL_COMPACT", o.quantized_pdl_compact);
  o.quantized_attention_pdl = env_flag("GPUKIT_QUANT_ATTN_PDL", o.quantized_attention_pdl);
  o.quantized_x_prep = env_flag("GPUKIT_QUANT_X_PREP", o.quantized_x_prep);
  o.quantized_swiglu = env_flag("GPUKIT_QUANT_SWIGLU", o.quantized_swiglu);
}

}  // namespace gk::llm
