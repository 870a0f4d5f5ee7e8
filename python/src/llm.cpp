// Bindings of the LLM engine (gpukit._C.llm; the Python layer is gpukit/llm.py).
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/unique_ptr.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/llm.h"
#include "gpukit/text.h"

namespace gkpy {
using namespace gk;

GK_BINDING(60, llm) {
  nb::module_ lm = m.def_submodule("llm", "LLM engine (see gpukit.llm).");
  m.def("embedding", [](nb::handle ids, const Array& table, nb::handle stream) {
    Stream st;
    Array a = to_array(ids, "ids");
    return gk::embedding(a, table, to_stream(stream, st));
  }, nb::arg("ids"), nb::arg("table"), nb::arg("stream") = nb::none(),
     "Rows of table [V, H] for integer ids of any shape: ids.shape + (H,).");

  nb::class_<llm::ModelConfig>(lm, "ModelConfig")
      .def_ro("architecture", &llm::ModelConfig::architecture)
      .def_ro("family", &llm::ModelConfig::family)
      .def_ro("format", &llm::ModelConfig::format)
      .def_ro("vocab_size", &llm::ModelConfig::vocab_size)
      .def_ro("hidden_size", &llm::ModelConfig::hidden_size)
      .def_ro("num_layers", &llm::ModelConfig::num_layers)
      .def_ro("num_heads", &llm::ModelConfig::num_heads)
      .def_ro("num_kv_heads", &llm::ModelConfig::num_kv_heads)
      .def_ro("head_dim", &llm::ModelConfig::head_dim)
      .def_ro("intermediate_size", &llm::ModelConfig::intermediate_size)
      .def_ro("max_positions", &llm::ModelConfig::max_positions)
      .def_ro("rope_theta", &llm::ModelConfig::rope_theta)
      .def_ro("rotary_dim", &llm::ModelConfig::rotary_dim)
      .def_ro("rope_interleaved", &llm::ModelConfig::rope_interleaved)
      .def_ro("norm_eps", &llm::ModelConfig::norm_eps)
      .def_ro("tie_embeddings", &llm::ModelConfig::tie_embeddings)
      .def_ro("qk_norm", &llm::ModelConfig::qk_norm)
      .def_ro("attention_bias", &llm::ModelConfig::attention_bias)
      .def_ro("sliding_window", &llm::ModelConfig::sliding_window)
      .def_ro("bos_id", &llm::ModelConfig::bos_id)
      .def_ro("eos_ids", &llm::ModelConfig::eos_ids)
      .def_ro("layer_norm", &llm::ModelConfig::layer_norm)
      .def_ro("activation", &llm::ModelConfig::activation)
      .def_ro("learned_positions", &llm::ModelConfig::learned_positions)
      .def_prop_ro("rope_scaling", [](const llm::ModelConfig& c) {
        const nn::RopeScaling& s = c.rope_scaling;
        static const char* kinds[] = {"none", "linear", "ntk", "yarn", "llama3"};
        nb::dict d;
        d["type"] = kinds[int(s.kind)];
        d["factor"] = s.factor;
        d["original_max_position"] = s.original_max_position;
        d["low_freq_factor"] = s.low_freq_factor;
        d["high_freq_factor"] = s.high_freq_factor;
        d["beta_fast"] = s.beta_fast;
        d["beta_slow"] = s.beta_slow;
        return d;
      })
      .def("__repr__", [](const llm::ModelConfig& c) { return "ModelConfig(" + llm::config_summary(c) + ")"; });

  lm.def("supported_architectures", &llm::supported_architectures);
  lm.def("config_from_hf_json", &llm::config_from_hf_json, nb::arg("text"));

  nb::class_<llm::KvCache>(lm, "KvCache", "Paged KV cache (pools allocated up front; sequences take pages)")
      .def("add_sequence", &llm::KvCache::add_sequence)
      .def("release", &llm::KvCache::release, nb::arg("seq"))
      .def("length", &llm::KvCache::length, nb::arg("seq"))
      .def("truncate", &llm::KvCache::truncate, nb::arg("seq"), nb::arg("length"))
      .def("capacity", &llm::KvCache::capacity, nb::arg("seq"))
      .def_prop_ro("free_blocks", &llm::KvCache::free_blocks)
      .def_prop_ro("block_size", &llm::KvCache::block_size);

  nb::class_<llm::Model>(lm, "Model")
      .def_static("load", [](const std::string& path, nb::handle device, nb::handle dtype, nb::object progress,
                             const std::string& quantize) {
        llm::Progress p;
        if (!progress.is_none()) p = [progress](int64_t done, int64_t total) { progress(done, total); };
        return llm::Model::load(path, to_device(device), to_dtype(dtype), p, quantize);
      }, nb::arg("path"), nb::arg("device") = nb::none(), nb::arg("dtype") = "float32",
         nb::arg("progress") = nb::none(), nb::arg("quantize") = "")
      .def_static("random", [](const std::string& config_json, nb::handle device, nb::handle dtype, uint64_t seed,
                               const std::string& quantize, bool share_layers) {
        return llm::Model::random(llm::config_from_hf_json(config_json), to_device(device), to_dtype(dtype), seed,
                                  quantize, share_layers);
      }, nb::arg("config_json"), nb::arg("device") = nb::none(), nb::arg("dtype") = "float32", nb::arg("seed") = 0,
         nb::arg("quantize") = "", nb::arg("share_layers") = false,
         "A model with random weights from the text of a Hugging Face config.json (share_layers: every layer a "
         "copy of layer 0's draw, for fast benchmark set-up).")
      .def_prop_rw("cuda_graph", [](const llm::Model& m) { return m.options().cuda_graph; },
                   [](llm::Model& m, bool v) { m.options().cuda_graph = v; },
                   "Decode steps replay a captured CUDA graph on CUDA (default True).")
      .def_prop_rw("use_gemv", [](const llm::Model& m) { return m.options().use_gemv; },
                   [](llm::Model& m, bool v) { m.options().use_gemv = v; },
                   "Decode projections of <= 8 rows through gk.gemv rather than matmul (default True).")
      .def_prop_rw("gemv_min_elems", [](const llm::Model& m) { return m.options().gemv_min_elems; },
                   [](llm::Model& m, int64_t v) { m.options().gemv_min_elems = v; },
                   "With use_gemv: weights smaller than this many elements go through cuBLASLt (default 0).")
      .def_prop_rw("fusion", [](const llm::Model& m) { return m.options().fusion; },
                   [](llm::Model& m, int v) {
                     if (v < 0 || v > 2) throw ValueError(cat("fusion: expected 0, 1 or 2, got ", v));
                     m.options().fusion = v;
                   },
                   "How the layers are composed: 2 the engine's decode kernels (default), 1 the gk.nn fused ops, "
                   "0 unfused (see EngineOptions in gpukit/llm.h). Takes effect at the next capture.")
      .def_prop_rw("rope_in_qkv", [](const llm::Model& m) { return m.options().rope_in_qkv; },
                   [](llm::Model& m, bool v) { m.options().rope_in_qkv = v; },
                   "Fusion level 2: the q/k/v GEMV also applies RoPE and appends k, v to the cache (one launch).")
      .def_prop_rw("norm_in_tail", [](const llm::Model& m) { return m.options().norm_in_tail; },
                   [](llm::Model& m, bool v) { m.options().norm_in_tail = v; },
                   "Fusion level 2 decode: residual add + RMSNorm in the o/down projection's last block.")
      .def_prop_rw("prefetch_mb", [](const llm::Model& m) { return m.options().prefetch_mb; },
                   [](llm::Model& m, int64_t v) {
                     if (v < 0 || v > 4096) throw ValueError(cat("prefetch_mb: expected 0..4096, got ", v));
                     m.options().prefetch_mb = v;
                   },
                   "Fusion level 2 decode: MiB of the next weights (o, then gate/up) prefetched into L2 on a side "
                   "branch while attention runs (0: off).")
      .def_prop_rw("prefetch_last", [](const llm::Model& m) { return m.options().prefetch_last; },
                   [](llm::Model& m, bool v) { m.options().prefetch_last = v; },
                   "The L2 prefetch marks its lines evict-last.")
      .def_prop_rw("head_proj", [](const llm::Model& m) { return m.options().head_proj; },
                   [](llm::Model& m, bool v) { m.options().head_proj = v; },
                   "Fusion level 2 decode: the lm head through the engine's GEMV (float32 logits).")
      .def_prop_rw("embed_norm", [](const llm::Model& m) { return m.options().embed_norm; },
                   [](llm::Model& m, bool v) { m.options().embed_norm = v; },
                   "Fusion level 2 decode: embedding gather + first RMSNorm in one launch.")
      .def_prop_rw("dequant_prefill", [](const llm::Model& m) { return m.options().dequant_prefill; },
                   [](llm::Model& m, bool v) { m.options().dequant_prefill = v; },
                   "Quantized prefill on CUDA: the weight expanded to bf16/fp16 + cuBLASLt (else the GEMV per 8 rows).")
      .def_prop_rw("fused_attention", [](const llm::Model& m) { return m.options().fused_attention; },
                   [](llm::Model& m, bool v) { m.options().fused_attention = v; },
                   "Fusion level 2 decode: RoPE, KV append and attention in one launch (short contexts).")
      .def_prop_rw("fused_attention_max_keys", [](const llm::Model& m) { return m.options().fused_attention_max_keys; },
                   [](llm::Model& m, int64_t v) {
                     if (v < 0 || v > 16384) throw ValueError(cat("fused_attention_max_keys: expected 0..16384, got ", v));
                     m.options().fused_attention_max_keys = v;
                   },
                   "The longest block table (keys) the fused decode attention takes; longer: attention_decode.")
      .def_prop_rw("fused_attention_chunk", [](const llm::Model& m) { return m.options().fused_attention_chunk; },
                   [](llm::Model& m, int v) {
                     if (v != -1 && v != 0 && v != 64 && v != 128 && v != 256 && v != 384)
                       throw ValueError(cat("fused_attention_chunk: -1, 0, 64, 128, 256 or 384, got ", v));
                     m.options().fused_attention_chunk = v;
                   },
                   "Keys per CTA of the fused decode attention (64: two threads per key; 128, 256, 384: one; 0: "
                   "the smallest of 128 / 256 / 384 that holds the step's block table, else 128; -1, the default: 64 with "
                   "fp8 weights, else 128).")
      .def_prop_rw("fused_attention_trigger", [](const llm::Model& m) { return m.options().fused_attention_trigger; },
                   [](llm::Model& m, int v) {
                     if (v < 0 || v > 3) throw ValueError(cat("fused_attention_trigger: 0, 1, 2 or 3, got ", v));
                     m.options().fused_attention_trigger = v;
                   },
                   "Where the fused decode attention lets the output projection launch (PDL): 0 before waiting "
                   "for the q/k/v projection, 1 after reading its output, 2 after P V, 3 at exit.")
      .def_prop_rw("fused_attention_auto", [](const llm::Model& m) { return m.options().fused_attention_auto; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_auto = v; },
                   "Without fused_attention: the fused decode attention where measured faster (bf16/fp16 weights, "
                   "head_dim 128, block tables of <= 384 keys).")
      .def_prop_rw("fused_attention_cluster", [](const llm::Model& m) { return m.options().fused_attention_cluster; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_cluster = v; },
                   "The fused decode attention's 2..8 chunks (64 / 128 keys) merge through a thread block cluster's "
                   "shared memory.")
      .def_prop_rw("carveout", [](const llm::Model& m) { return m.options().carveout; },
                   [](llm::Model& m, int v) {
                     if (v < -1 || v > 100) throw ValueError(cat("carveout: -1 (the driver's choice) or 0..100, got ", v));
                     m.options().carveout = v;
                   },
                   "Level 2 decode: the preferred shared memory carveout (percent) of the engine's kernels; -1: the "
                   "driver's choice.")
      .def_prop_rw("fused_attention_mma", [](const llm::Model& m) { return m.options().fused_attention_mma; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_mma = v; },
                   "The fused decode attention's scores on the tensor cores and its P V with 16-byte V reads "
                   "(other bits, within rounding).")
      .def_prop_rw("fused_attention_early_rope",
                   [](const llm::Model& m) { return m.options().fused_attention_early_rope; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_early_rope = v; },
                   "The fused attention's RoPE cos / sin and the new token's cache slot computed before its PDL "
                   "wait (the same bits).")
      .def_prop_rw("fused_attention_wide", [](const llm::Model& m) { return m.options().fused_attention_wide; },
                   [](llm::Model& m, int v) {
                     if (v != -1 && v != 0 && v != 2 && v != 4)
                       throw ValueError(cat("fused_attention_wide: -1, 0, 2 or 4, got ", v));
                     m.options().fused_attention_wide = v;
                   },
                   "The fused attention (MMA passes, chunks of 64 / 128 keys) with 2 or 4 times the warps per CTA "
                   "(0: off; -1, the default: 2 with int4 weights, else 4 where the launch's CTAs fit two per SM, "
                   "else 2; the same bits).")
      .def_prop_rw("o_proj_stage", [](const llm::Model& m) { return m.options().o_proj_stage; },
                   [](llm::Model& m, bool v) { m.options().o_proj_stage = v; },
                   "The output projection after the fused attention stages half of its rows in shared memory "
                   "before its PDL wait (the same bits).")
      .def_prop_rw("quantized_small_pdl", [](const llm::Model& m) { return m.options().quantized_small_pdl; },
                   [](llm::Model& m, int v) {
                     if (v < 0 || v > 3) throw ValueError(cat("quantized_small_pdl: 0..3, got ", v));
                     m.options().quantized_small_pdl = v;
                   },
                   "Quantized weights without quantized_pdl: PDL for the norms (1) and / or SwiGLU (2) launches "
                   "(the same bits).")
      .def_prop_rw("quantized_x_prep", [](const llm::Model& m) { return m.options().quantized_x_prep; },
                   [](llm::Model& m, bool v) { m.options().quantized_x_prep = v; },
                   "fp8 / int8 weights, level 2 decode: the norms before the q/k/v, gate/up and lm head GEMVs also "
                   "write their output's scaled fp16 copy, which those GEMVs read (the same bits).")
      .def_prop_rw("quantized_swiglu", [](const llm::Model& m) { return m.options().quantized_swiglu; },
                   [](llm::Model& m, bool v) { m.options().quantized_swiglu = v; },
                   "int4 weights, level 2 decode: the SwiGLU in the gate/up GEMV's epilogue where the integer "
                   "tensor-core kernel runs it (the same bits).")
      .def_prop_rw("quantized_full_ring", [](const llm::Model& m) { return m.options().quantized_full_ring; },
                   [](llm::Model& m, int v) {
                     if (v < 0 || v > 3) throw ValueError(cat("quantized_full_ring: 0..3, got ", v));
                     m.options().quantized_full_ring = v;
                   },
                   "fp8 / int8 weights: the decode GEMVs whose whole weight fits the GPU's shared memory request "
                   "all of it before their PDL wait; mask: 1 N > K (q/k/v), 2 N <= K (o) (the same bits).")
      .def_prop_rw("fused_attention_auto_hd64", [](const llm::Model& m) { return m.options().fused_attention_auto_hd64; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_auto_hd64 = v; },
                   "fused_attention_auto also takes head_dim 64 (with the push merge, else one CTA per kv head).")
      .def_prop_rw("fused_attention_auto_quant",
                   [](const llm::Model& m) { return m.options().fused_attention_auto_quant; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_auto_quant = v; },
                   "fused_attention_auto also takes fp8 weights (head_dim 128).")
      .def_prop_rw("quantized_attention_pdl", [](const llm::Model& m) { return m.options().quantized_attention_pdl; },
                   [](llm::Model& m, bool v) { m.options().quantized_attention_pdl = v; },
                   "Quantized weights, quantized_pdl off: the fused attention alone launched with PDL (the "
                   "same bits).")
      .def_prop_rw("fused_attention_push", [](const llm::Model& m) { return m.options().fused_attention_push; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_push = v; },
                   "The fused attention's cluster merge by push (st.async into chunk 0's shared memory, an "
                   "mbarrier; with the cluster merge and the mma passes; the same bits).")
      .def_prop_rw("fused_attention_push_auto",
                   [](const llm::Model& m) { return m.options().fused_attention_push_auto; },
                   [](llm::Model& m, bool v) { m.options().fused_attention_push_auto = v; },
                   "The push merge also without fused_attention_push where measured faster: head_dim 64, "
                   "quantized weights.")
      .def_prop_rw("fused_attention_pad_kb", [](const llm::Model& m) { return m.options().fused_attention_pad_kb; },
                   [](llm::Model& m, int v) {
                     if (v < 0 || v > 227) throw ValueError(cat("fused_attention_pad_kb: 0..227, got ", v));
                     m.options().fused_attention_pad_kb = v;
                   },
                   "The fused attention's CTAs ask for at least this many KiB of shared memory (keeps other "
                   "kernels' blocks off their SMs; the same bits).")
      .def_prop_rw("quant_streaming", [](const llm::Model& m) { return m.options().quant_streaming; },
                   [](llm::Model& m, bool v) { m.options().quant_streaming = v; },
                   "Level 2 decode, quantized weights: each GEMV's codes marked streaming in L2 (a stream access "
                   "policy window; the same bits).")
      .def_prop_rw("weights_evict_first", [](const llm::Model& m) { return m.options().weights_evict_first; },
                   [](llm::Model& m, bool v) { m.options().weights_evict_first = v; },
                   "Level 2 decode, bf16/fp16 weights, one sequence: the engine GEMV's weight loads tagged L2 "
                   "evict-first (the same bits).")
      .def_prop_rw("kv_l2", [](const llm::Model& m) { return m.options().kv_l2; },
                   [](llm::Model& m, bool v) { m.options().kv_l2 = v; },
                   "Level 2 decode, bf16/fp16 weights: the q/k/v GEMV's last blocks bring the layer's KV cache "
                   "pages into L2 for the attention after it.")
      .def_prop_rw("attn_l2", [](const llm::Model& m) { return m.options().attn_l2; },
                   [](llm::Model& m, int v) {
                     if (v < 0 || v > 4) throw ValueError(cat("attn_l2: 0 to 4, got ", v));
                     m.options().attn_l2 = v;
                   },
                   "Level 2 decode: the kernel before the o projection (rope_append or the fused attention) brings "
                   "the o weight into L2 before its PDL wait: 0 off, 1 its second half, 2 all of it; 3, 4: as 1, 2, the fused "
                   "attention issuing it after its cached K/V have landed.")
      .def("set_attention_stamps", &llm::Model::set_attention_stamps, nb::arg("layer"),
           "Debug: the fused attention of this layer (-1: none) writes per CTA 8 %globaltimer stamps at every "
           "decode step (entry, K/V copies issued, after the PDL wait, q/k/v done, K/V landed, softmax, P V, "
           "output written).")
      .def("attention_stamps", [](const llm::Model& m) {
             Array s = m.attention_stamps();
             return s.defined() ? s.to(Device{}) : Array::empty({0, 8}, DType::i64, Device{});
           },
           "int64 [512, 8] of set_attention_stamps (on the CPU), rows (b * hkv + kv head) * chunks + chunk.")
      .def_prop_ro("fused_attention_layers", &llm::Model::fused_attention_layers,
                   "Layers run through the fused decode attention since the model was made (eager or captured).")
      .def_prop_ro("fused_attention_push_layers", &llm::Model::fused_attention_push_layers,
                   "... of them with the push merge (st.async into chunk 0's shared memory).")
      .def_prop_ro("fused_attention_wide_layers", &llm::Model::fused_attention_wide_layers,
                   "... of them with more warps per CTA (fused_attention_wide).")
      .def_prop_ro("fused_attention_wide4_layers", &llm::Model::fused_attention_wide4_layers,
                   "... of them with 4 times the warps per CTA.")
      .def_prop_rw("norm_in_proj", [](const llm::Model& m) { return m.options().norm_in_proj; },
                   [](llm::Model& m, bool v) { m.options().norm_in_proj = v; },
                   "Fusion level 2 decode: residual adds in the o/down GEMVs, norms inside the q/k/v, gate/up "
                   "(and, with head_proj, lm head) GEMVs: no norm launches (the normalized rows not rounded).")
      .def_prop_rw("quantized_pdl", [](const llm::Model& m) { return m.options().quantized_pdl; },
                   [](llm::Model& m, bool v) { m.options().quantized_pdl = v; },
                   "Level 2 decode, quantized weights: the engine's launches between the quantized GEMVs use PDL.")
      .def_prop_rw("quantized_pdl_fp8", [](const llm::Model& m) { return m.options().quantized_pdl_fp8; },
                   [](llm::Model& m, bool v) { m.options().quantized_pdl_fp8 = v; },
                   "fp8 weights take quantized_pdl whatever its value.")
      .def_prop_rw("quantized_pdl_compact", [](const llm::Model& m) { return m.options().quantized_pdl_compact; },
                   [](llm::Model& m, bool v) { m.options().quantized_pdl_compact = v; },
                   "With quantized_pdl: SwiGLU and rope_append grids capped at 4 blocks, the fused attention "
                   "without PDL (fewer parked blocks beside the quantized GEMVs).")
      .def_prop_ro("quantized", [](const llm::Model& m) { return m.weights().quantized; })
      .def("profile_decode", [](llm::Model& m, int64_t batch, int64_t context, int64_t reps) {
        auto r = llm::profile_decode(m, batch, context, reps);
        nb::list out;
        for (auto& t : r) out.append(nb::make_tuple(t.name, t.layer, t.ms));
        return out;
      }, nb::arg("batch") = 1, nb::arg("context") = 128, nb::arg("reps") = 3,
         "GPU time of each op of one eager decode step (CUDA events, the GPU queue pre-filled so that launch "
         "gaps do not count): [(op, layer, ms)], the median over reps; layer -1 outside the layers.")
      .def_prop_ro("config", [](const llm::Model& m) { return m.config(); })
      .def_prop_ro("device", &llm::Model::device)
      .def_prop_ro("dtype", [](const llm::Model& m) { return dtype_object(m.dtype()); })
      .def_prop_ro("nbytes", [](const llm::Model& m) { return m.weights().nbytes; })
      .def_prop_ro("chat_template", &llm::Model::chat_template)
      .def_prop_ro("tokenizer", [](const llm::Model& m) -> nb::object {
        if (!m.tokenizer()) return nb::none();
        return nb::cast(*m.tokenizer());
      })
      .def("make_cache", &llm::Model::make_cache, nb::arg("lengths"), nb::arg("block_size") = 16,
           "A KV cache with room for sequences of these lengths.")
      .def("step", &llm::Model::step, nb::arg("cache"), nb::arg("seqs"), nb::arg("tokens"),
           nb::arg("all_logits") = false,
           "Appends tokens to each sequence; float32 logits [sum T, V] (all_logits) or [B, V].")
      .def("forward", &llm::Model::forward, nb::arg("ids"), "float32 logits [T, V] of one fresh sequence.");

  nb::class_<llm::Generation>(lm, "Generation")
      .def("__init__", [](llm::Generation* g, std::shared_ptr<llm::Model> m,
                          const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens, double temperature,
                          int64_t top_k, double top_p, uint64_t seed, const std::vector<int32_t>& stop_ids,
                          bool ignore_eos, std::optional<bool> cuda_graph, bool lookahead) {
        llm::GenerateOptions o;
        o.cuda_graph = cuda_graph;
        o.lookahead = lookahead;
        o.max_new_tokens = max_new_tokens;
        o.temperature = temperature;
        o.top_k = top_k;
        o.top_p = top_p;
        o.seed = seed;
        o.stop_ids = stop_ids;
        o.ignore_eos = ignore_eos;
        new (g) llm::Generation(std::move(m), prompts, o);
      }, nb::arg("model"), nb::arg("prompts"), nb::arg("max_new_tokens") = 64, nb::arg("temperature") = 0.0,
         nb::arg("top_k") = 0, nb::arg("top_p") = 1.0, nb::arg("seed") = 0,
         nb::arg("stop_ids") = std::vector<int32_t>{}, nb::arg("ignore_eos") = false,
         nb::arg("cuda_graph") = nb::none(), nb::arg("lookahead") = true)
      .def_static("resume", [](std::shared_ptr<llm::Model> m, std::shared_ptr<llm::KvCache> cache,
                               const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& prompts,
                               int64_t max_new_tokens, double temperature, int64_t top_k, double top_p, uint64_t seed,
                               bool ignore_eos, std::optional<bool> cuda_graph) {
        llm::GenerateOptions o;
        o.cuda_graph = cuda_graph;
        o.max_new_tokens = max_new_tokens;
        o.temperature = temperature;
        o.top_k = top_k;
        o.top_p = top_p;
        o.seed = seed;
        o.ignore_eos = ignore_eos;
        return std::make_unique<llm::Generation>(std::move(m), std::move(cache), seqs, prompts, o);
      }, nb::arg("model"), nb::arg("cache"), nb::arg("seqs"), nb::arg("prompts"), nb::arg("max_new_tokens") = 64,
         nb::arg("temperature") = 0.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0, nb::arg("seed") = 0,
         nb::arg("ignore_eos") = false, nb::arg("cuda_graph") = nb::none(),
         "Continues sequences of an existing KV cache with new tokens.")
      .def("step", &llm::Generation::step, "One forward pass; the new token of each row (-1: finished).")
      .def_prop_ro("done", &llm::Generation::done)
      .def("last_logits", &llm::Generation::last_logits,
           "float32 logits [n, V] of the rows that ran in the last step (a host copy).")
      .def_prop_ro("captures", &llm::Generation::captures, "Times the decode step was captured as a CUDA graph.")
      .def_prop_ro("graph_nodes", &llm::Generation::graph_nodes,
                   "Nodes of the decode step's CUDA graph: [all, kernels, memcpy, memset] (zeros when eager).")
      .def("finish", &llm::Generation::finish, nb::arg("row"))
      .def_prop_ro("generated", &llm::Generation::generated)
      .def_prop_ro("finish_reasons", &llm::Generation::finish_reasons);
}

}  // namespace gkpy
