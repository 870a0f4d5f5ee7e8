// The transformer forward pass (llama / qwen2 / qwen3 families) over a paged KV
// cache: embedding, per layer rms_norm (fused residual), q/k/v projections
// (matmul against transposed weight views, no copies), optional bias and q/k
// norm, rope at per-token positions, kv_append into the pages of each sequence,
// attention (prefill: causal over the packed prompts; decode: one token per
// sequence at its own length), output projection, SwiGLU MLP; final norm and lm
// head; float32 logits. The KV cache and prefill / decode / step: model_step.cpp.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gpukit/errors.h"
#include "gpukit/gemm.h"
#include "gpukit/ops.h"
#include "gpukit/text.h"
#include "llm/fused.h"
#include "llm/internal.h"
#include "text/json.h"

namespace gk::llm {

// ---- model ----

// The L2 prefetch's side branch: work on `s` forks from the current stream after `fork`, joins it at the step's end.
struct SideBranch {
  Stream s;
  Event fork, join;
  bool open = false;  // prefetches issued since the last join
  Array counters;     // int32 zeros: the fused attention's per-(sequence, kv head) counters
};

std::shared_ptr<Model> Model::load(const std::string& path, Device device, DType dtype, const Progress& progress,
                                   const std::string& quantize) {
  ModelFiles files = locate_model(path);
  auto m = std::make_shared<Model>();
  env_options(m->opt_);
  m->device_ = device;
  m->dtype_ = dtype;
  if (!files.gguf.empty()) {
    io::GGUF g(files.gguf);
    m->cfg_ = config_from_gguf(g);
    if (g.find("tokenizer.ggml.model")) {
      m->tok_ = std::make_shared<text::Tokenizer>(text::Tokenizer::from_gguf(g));
      m->chat_template_ = m->tok_->chat_template();
    }
  } else {
    std::ifstream in(std::filesystem::path(files.dir) / "config.json", std::ios::binary);
    if (!in) throw ValueError(cat("cannot read ", files.dir, "/config.json"));
    std::stringstream ss;
    ss << in.rdbuf();
    m->cfg_ = config_from_hf_json(ss.str());
    // generation_config.json may list more EOS ids (e.g. the end-of-turn token of chat models)
    std::ifstream gin(std::filesystem::path(files.dir) / "generation_config.json", std::ios::binary);
    if (gin) {
      std::stringstream gs;
      gs << gin.rdbuf();
      text::json::Value g = text::json::parse(gs.str());
      if (const text::json::Value* e = g.is_object() ? g.find("eos_token_id") : nullptr) {
        std::vector<int64_t> ids;
        if (e->is_array()) {
          for (auto& x : e->array("eos_token_id")) ids.push_back(x.integer("generation_config.json eos_token_id"));
        } else if (!e->is_null()) {
          ids.push_back(e->integer("generation_config.json eos_token_id"));
        }
        for (int64_t id : ids)
          if (std::find(m->cfg_.eos_ids.begin(), m->cfg_.eos_ids.end(), id) == m->cfg_.eos_ids.end())
            m->cfg_.eos_ids.push_back(id);
      }
    }
    auto tj = std::filesystem::path(files.dir) / "tokenizer.json";
    if (std::filesystem::exists(tj)) {
      m->tok_ = std::make_shared<text::Tokenizer>(text::Tokenizer::from_file(tj.string()));
      m->chat_template_ = m->tok_->chat_template();
    }
  }
  if (m->tok_ && m->tok_->vocab_size() > m->cfg_.vocab_size)
    throw ValueError(cat("tokenizer has ", m->tok_->vocab_size(), " tokens but the model's vocabulary is ",
                         m->cfg_.vocab_size));
  m->w_ = load_weights(m->cfg_, path, device, dtype, progress);
  prepare_weights(m->cfg_, m->w_, quantize);
  m->make_side_branch();
  return m;
}

std::shared_ptr<Model> Model::random(const ModelConfig& c, Device device, DType dtype, uint64_t seed,
                                     const std::string& quantize, bool share_layers) {
  auto m = std::make_shared<Model>();
  env_options(m->opt_);
  m->cfg_ = c;
  m->cfg_.format = "random";
  m->device_ = device;
  m->dtype_ = dtype;
  m->w_ = random_weights(c, device, dtype, seed, share_layers);
  prepare_weights(m->cfg_, m->w_, quantize, share_layers);
  m->make_side_branch();
  return m;
}

std::string Model::chat_template() const { return chat_template_; }

KvCache Model::make_cache(const std::vector<int64_t>& lengths, int64_t block_size) const {
  int64_t blocks = 0;
  for (int64_t n : lengths) blocks += std::max<int64_t>(1, (n + block_size - 1) / block_size);
  return KvCache(cfg_, std::max<int64_t>(blocks, 1), block_size, device_, dtype_);
}

namespace {
constexpr int64_t kGemvRows = 8;  // gk::gemv / gemv_quantized take up to 8 rows
}  // namespace

Array Model::project(const Array& x, const Array& w, const QuantizedWeight& qw, const Array& bias,
                     std::optional<DType> out) const {
  const int64_t M = x.shape(0);
  const bool half = dtype_ == DType::bf16 || dtype_ == DType::f16;
  Array y;
  if (!qw.format.empty()) {
    const DType ot = out.value_or(dtype_);
    if (M <= kGemvRows || device_.is_cpu()) {
      // quant_streaming (decode): the codes are streaming data in L2 for this launch
      const bool win = opt_.quant_streaming && engine_ops() && qw.q.defined();
      fused::StreamWindowScope sw(Stream::current(device_), win ? qw.q.data() : nullptr,
                                  win ? int64_t(qw.q.nbytes()) : 0);
      // quantized_x_prep: x is the last norm's output, whose scaled fp16 copy it wrote
      const bool prep = xprep_h_.defined() && x.data() == xprep_h_.data() && x.dtype() == xprep_h_.dtype() &&
                        x.shape() == xprep_h_.shape() && x.strides() == xprep_h_.strides();
      y = prep ? gemv_quantized_prepared(x, xprep_xh_, xprep_inv_, qw, ot) : gemv_quantized(x, qw, ot);
    } else if (opt_.dequant_prefill && (y = fused::dequant_linear(x, qw, ot)).defined()) {
      // prefill: the weight expanded to x's type, cuBLASLt (src/cuda/llm_step.cu)
    } else {
      // Prefill with quantized weights: the GEMV kernel over blocks of 8 rows (reads the
      // weight once per block; a dequantizing GEMM would be faster for long prompts).
      y = Array::empty({M, qw.q.shape(0)}, ot, device_);
      for (int64_t r = 0; r < M; r += kGemvRows) {
        const int64_t n = std::min(kGemvRows, M - r);
        copy_into(y.narrow(0, r, n), gemv_quantized(x.narrow(0, r, n), qw, ot));
      }
    }
  } else if (device_.is_cuda() && half && opt_.use_gemv && M <= kGemvRows && w.numel() >= opt_.gemv_min_elems) {
    y = gemv(x, w);
  } else if (device_.is_cuda() && half) {
    y = linear(x, w);  // cuBLASLt with w [N, K]
  } else {
    y = matmul(x, w.T());
  }
  return bias.defined() ? add(y, bias) : y;
}

// The quantized gate/up projection with the SwiGLU in its epilogue (quantized_swiglu; gk::gemv_quantized_swiglu, under
// project()'s streaming window): undefined where that kernel does not run (the caller projects, then runs the SwiGLU).
Array Model::project_swiglu(const Array& x, const QuantizedWeight& qw) const {
  const bool win = opt_.quant_streaming && qw.q.defined();
  fused::StreamWindowScope sw(Stream::current(device_), win ? qw.q.data() : nullptr, win ? int64_t(qw.q.nbytes()) : 0);
  return gemv_quantized_swiglu(x, qw, dtype_);
}

bool Model::head_argmax(int64_t B) const {
  return opt_.fusion >= 2 && opt_.head_proj && opt_.use_gemv && device_.is_cuda() &&
         (dtype_ == DType::bf16 || dtype_ == DType::f16) && B >= 1 && B <= kGemvRows &&
         w_.lm_head_q.format.empty() && w_.lm_head.defined() && w_.lm_head.dtype() == dtype_;
}

Array Model::lm_head(const Array& h, const Array* argmax_keys) const {
  if (raw_final_) {  // h: the raw residual (norm_in_proj); the final norm inside the head's GEMV
    raw_final_ = false;
    fused::ProjOpts o;
    o.out_f32 = true;
    o.argmax_keys = argmax_keys && argmax_keys->defined() ? argmax_keys : nullptr;
    o.norm_w = &w_.final_norm;
    o.norm_eps = cfg_.norm_eps;
    return fused::project_opts(h, w_.lm_head, Array(), o);
  }
  if (!w_.lm_head_q.format.empty()) return project(h, Array(), w_.lm_head_q, Array(), DType::f32);
  if (device_.is_cuda() && (dtype_ == DType::bf16 || dtype_ == DType::f16)) {
    if (opt_.head_proj && engine_proj(h) && h.dtype() == w_.lm_head.dtype())
      return fused::project(h, w_.lm_head, Array(), false, nullptr, nullptr, /*out_f32=*/true,
                            argmax_keys && argmax_keys->defined() ? argmax_keys : nullptr);
    if (opt_.use_gemv && h.shape(0) <= kGemvRows && w_.lm_head.numel() >= opt_.gemv_min_elems)
      return gemv(h, w_.lm_head, DType::f32);
    return linear(h, w_.lm_head, nullptr, Activation::none, nullptr, DType::f32);
  }
  return matmul(h, w_.lm_head.T()).astype(DType::f32);
}

// Level 2 decode: the L2 prefetch of the weights after attention (the output projection, then the
// first rows of gate and up, which the gate/up GEMV's first blocks read) on a side branch forked after
// the q/k/v projection, beside RoPE and attention; joined at the end of the step (join_side_branch).
void Model::prefetch_during_attention(const LayerWeights& L) {
  if (!engine_ops() || opt_.prefetch_mb <= 0) return;
  int64_t budget = opt_.prefetch_mb << 20;
  PrefetchArgs a;
  auto add_at = [&](const Array& t, int64_t from, int64_t bytes) {
    if (!t.defined() || budget <= 0 || a.n >= 4 || !t.is_contiguous()) return;
    bytes = std::min({bytes, budget, int64_t(t.nbytes()) - from});
    if (bytes <= 0) return;
    a.p[a.n] = static_cast<const uint8_t*>(t.data()) + from;
    a.bytes[a.n++] = bytes;
    budget -= bytes;
  };
  auto add = [&](const Array& t, int64_t bytes) { add_at(t, 0, bytes); };
  const bool plain = L.o_q.format.empty();
  const Array& o = plain ? L.o : L.o_q.q;
  // o's second half first: the o GEMV's first blocks (launched early) read the first rows themselves
  const int64_t half_o = int64_t(o.nbytes()) / 2 / 256 * 256;
  add_at(o, half_o, int64_t(o.nbytes()) - half_o);
  add_at(o, 0, half_o);
  if (L.gate_up_q.format.empty()) {  // the engine's gate/up GEMV: block j reads gate and up rows 2j, 2j + 1
    const int64_t half = budget / 2;
    add(L.gate, half);
    add(L.up, half);
  } else {
    add(L.gate_up_q.q, budget);
  }
  if (a.n == 0 || !side_) return;
  Stream main = Stream::current(device_);
  side_->fork.record(main);
  side_->s.wait(side_->fork);
  fused::prefetch_l2(a, opt_.prefetch_last, side_->s);
  side_->open = true;
}

// The side branch's stream and events, made with the model (not during a graph capture).
void Model::make_side_branch() {
  if (!device_.is_cuda() || side_) return;
  side_ = std::make_shared<SideBranch>();
  side_->s = Stream::create(device_);
  side_->fork = Event::create(device_, /*timing=*/false);
  side_->join = Event::create(device_, /*timing=*/false);
  side_->counters = full({1024}, Scalar::of_int(0), DType::i32, device_);
}

void Model::join_side_branch() {
  if (!side_ || !side_->open) return;
  side_->join.record(side_->s);
  Stream::current(device_).wait(side_->join);
  side_->open = false;
}

// SwiGLU MLP: one gate/up projection [T, 2 I] (gate then up), the fused activation,
// the down projection (fusion 1). Level 2 decode: one GEMV with the SwiGLU epilogue.
// Level 0: gate and up projected separately, silu then mul.
Array Model::mlp(const LayerWeights& L, const Array& h, int l) const {
  const bool plain = L.gate_up_q.format.empty();
  Array act;
  if (engine_proj(h) && plain) {
    act = fused::project(h, L.gate_up, Array(), /*swiglu=*/true);
    mark("gate_up", l);  // with SwiGLU
  } else if (opt_.fusion <= 0) {
    Array g, u;
    if (plain) {
      g = project(h, L.gate, L.gate_up_q);
      u = project(h, L.up, L.gate_up_q);
    } else {  // quantized: one matrix
      Array gu = project(h, Array(), L.gate_up_q);
      g = gu.narrow(1, 0, cfg_.intermediate_size);
      u = gu.narrow(1, cfg_.intermediate_size, cfg_.intermediate_size);
    }
    mark("gate_up", l);
    act = mul(unary(UnaryOp::Silu, g), u);
    mark("swiglu", l);
  } else if (!plain && engine_ops() && opt_.quantized_swiglu && h.shape(0) <= kGemvRows &&
             (act = project_swiglu(h, L.gate_up_q)).defined()) {
    mark("gate_up", l);  // with SwiGLU (int4 on the integer tensor cores)
  } else {
    Array gu = project(h, L.gate_up, L.gate_up_q);
    mark("gate_up", l);
    // level 2 decode: the PDL-chained kernel (gemv_quantized around it may start early)
    act = engine_ops() ? fused::swiglu(gu) : nn::gated_fused(nn::GatedAct::SwiGLU, gu);
    mark("swiglu", l);
  }
  Array down = engine_proj(act) && L.down_q.format.empty() ? fused::project(act, L.down)
                                                             : project(act, L.down, L.down_q);
  mark("down", l);
  return down;
}

// Level 2 decode on CUDA: the engine's kernels (src/llm/fused.h).
bool Model::engine_ops() const { return opt_.fusion >= 2 && decoding_ && device_.is_cuda(); }
bool Model::engine_proj(const Array& x) const {
  return engine_ops() && opt_.use_gemv && (dtype_ == DType::bf16 || dtype_ == DType::f16) && x.shape(0) <= kGemvRows;
}

// residual += x; returns rms_norm(residual) with w (fused as the level asks).
Array Model::add_norm(const Array& x, Array& resid, const Array& w, int l) const {
  Array h;
  xprep_h_ = xprep_xh_ = xprep_inv_ = Array();
  if (engine_ops() && opt_.quantized_x_prep && (w_.quantized == "fp8" || w_.quantized == "int8")) {
    fused::AddNormPrep r = fused::add_rms_norm_prep(x, resid, w, cfg_.norm_eps);
    h = r.h;
    resid = r.res;
    if (r.xh.defined()) xprep_h_ = h, xprep_xh_ = r.xh, xprep_inv_ = r.xinv;
  } else if (engine_ops()) {
    std::tie(h, resid) = fused::add_rms_norm(x, resid, w, cfg_.norm_eps);
  } else if (opt_.fusion <= 0) {
    resid = add(x, resid);
    mark("add", l);
    h = nn::rms_norm(resid, w, cfg_.norm_eps);
  } else {
    std::tie(h, resid) = nn::rms_norm_residual(x, resid, w, cfg_.norm_eps);
  }
  mark("norm", l);
  return h;
}

// One pass of the layers. Per layer: the fused q/k/v projection (one matrix), views of
// q, k, v into its output, optional q/k norm, rope in place, kv_append, attention,
// output projection, fused residual + norm, the fused gate/up projection with SwiGLU,
// down projection, fused residual + the next norm. (EngineOptions::fusion: level 2
// decode steps fuse further, level 0 unfuses.)
Array Model::run_layers(const Array& ids, const Array& positions, KvCache& cache, const nn::KvIndex& idx,
                        const std::function<Array(const Array&, const Array&, const Array&, int)>& attend) {
  if (cfg_.learned_positions) return gpt2_layers(cfg_, w_, ids, positions.to(device_), cache, idx, attend);  // gpt2.cpp
  const ModelConfig& c = cfg_;
  const int64_t T = ids.numel(), D = c.head_dim, Q = c.num_heads * D, KV = c.num_kv_heads * D;
  auto split_qkv = [&](const Array& qkv, Array& q, Array& k, Array& v) {  // [T, Q + 2 KV] -> heads
    q = qkv.narrow(1, 0, Q).reshape({T, c.num_heads, D});
    k = qkv.narrow(1, Q, KV).reshape({T, c.num_kv_heads, D});
    v = qkv.narrow(1, Q + KV, KV).reshape({T, c.num_kv_heads, D});
  };
  Array pos = positions.to(device_, nullptr, /*non_blocking=*/true);
  Array x, h;  // the residual stream [T, H] and its norm
  if (engine_ops() && opt_.embed_norm && ids.dtype() == DType::i32 &&
      fused::embed_norm_supported(w_.embed, w_.layers[0].attn_norm)) {
    std::tie(h, x) = fused::embed_norm(ids, w_.embed, w_.layers[0].attn_norm, c.norm_eps);
    mark("embed", -1);  // with the norm
  } else {
    x = embedding(ids, w_.embed);
    mark("embed", -1);
    h = nn::rms_norm(x, w_.layers[0].attn_norm, c.norm_eps);
    mark("norm", 0);
  }
  Array resid = x;
  std::optional<int> rd;
  if (c.rotary_dim) rd = int(c.rotary_dim);
  // level 2 decode: rope + append in one kernel (one token per sequence, paged cache)
  const bool rope_append = engine_ops() && idx.block_table.defined() && pos.dtype() == DType::i32 &&
                           idx.block_table.device() == device_ && cache.k[0].dtype() == dtype_;
  fused::Rope rope;
  rope.theta = c.rope_theta;
  rope.rotary_dim = rd;
  rope.interleaved = c.rope_interleaved;
  rope.scaling = c.rope_scaling;
  // level 2 decode: RoPE, the KV append and attention in one kernel (short contexts). Auto: where
  // measured faster than rope_append + attention_decode on the H200 (<= 384 keys): bf16/fp16 weights
  // with head_dim 128 (session 5) and 64 (_auto_hd64), fp8, int8 (session 16) and int4 weights with head_dim 128
  // (_auto_quant)
  const int64_t table_keys = idx.block_table.defined() ? idx.block_table.shape(1) * cache.block_size() : 0;
  const bool fa_auto64 = opt_.fused_attention_auto && opt_.fused_attention_auto_hd64 && D == 64 &&
                         w_.quantized.empty() && table_keys <= 384;
  const bool fa_autoq = opt_.fused_attention_auto && opt_.fused_attention_auto_quant && D == 128 &&
                        (w_.quantized == "fp8" || w_.quantized == "int8" || w_.quantized == "int4") &&
                        table_keys <= 384;
  const bool fa_auto =
      (opt_.fused_attention_auto && D == 128 && w_.quantized.empty() && table_keys <= 384) || fa_auto64 || fa_autoq;
  const bool fa = rope_append && (opt_.fused_attention || fa_auto) && !c.qk_norm && c.sliding_window <= 0 && side_ &&
                  side_->counters.numel() >= T * c.num_kv_heads && table_keys <= opt_.fused_attention_max_keys &&
                  fused::attention_rope_supported(T, c.num_heads, c.num_kv_heads, D, table_keys, dtype_);
  // attn_l2: the output projection's weight (or its second half) into L2 during attention
  auto o_l2 = [&](const LayerWeights& L) {
    fused::L2Range r;
    if (opt_.attn_l2 <= 0 || T > 8) return r;  // decode steps of up to 8 sequences
    const Array& o = L.o_q.format.empty() ? L.o : L.o_q.q;
    if (!o.defined() || !o.is_contiguous() || o.device() != device_) return r;
    const int64_t n = int64_t(o.nbytes()), from = opt_.attn_l2 % 2 ? n / 2 : 0;  // 1, 3: the second half
    r.p = static_cast<const uint8_t*>(o.data()) + from;
    r.bytes = n - from;
    r.late = opt_.attn_l2 >= 3;  // the fused attention: after its K/V have landed
    return r;
  };
  // 0: one CTA per kv head where the table fits in 384 keys; -1: 64 with 8-bit weights (fp8, int8), else 128
  const bool w8 = w_.quantized == "fp8" || w_.quantized == "int8";
  int fa_chunk = opt_.fused_attention_chunk >= 0 ? opt_.fused_attention_chunk : w8 ? 64 : 128;
  // head_dim 64 by auto without the push merge: one CTA per kv head (checkpoint A, 1B: fa+fac0 1155.1, fa 1129.9)
  if (fa && fa_auto64 && !opt_.fused_attention && !push_merge(opt_, cfg_, w_)) fa_chunk = 0;
  if (fa && fa_chunk == 0) {
    const int64_t mk = idx.block_table.shape(1) * cache.block_size();
    fa_chunk = mk <= 128 ? 128 : mk <= 256 ? 256 : mk <= 384 ? 384 : 128;
  }
  // the fused attention of layer l (counted; the debug stamps of set_attention_stamps' layer)
  auto fused_attention = [&](const Array& qkv, const LayerWeights& L, int l) {
    const bool st = l == stamps_layer_ && stamps_.defined();
    fused::AttnStampScope stamps(st ? static_cast<unsigned long long*>(stamps_.data()) : nullptr,
                                 st ? stamps_.numel() : 0);
    int merge = 0;
    Array att = fused::attention_rope(qkv, c.num_heads, cache.k[size_t(l)], cache.v[size_t(l)], pos, idx.block_table,
                                      rope, side_->counters, nullptr, fa_chunk, opt_.fused_attention_trigger, o_l2(L),
                                      opt_.fused_attention_cluster, &merge);
    ++fa_layers_;
    fa_push_layers_ += (merge & 3) == 2;
    fa_wide_layers_ += (merge & 4) != 0;
    fa_wide4_layers_ += (merge & 8) != 0;
    return att.reshape({T, Q});
  };
  if (rope_append && engine_proj(x) && w_.layers[0].qkv_q.format.empty() && w_.layers[0].gate_up.defined() &&
      c.num_experts == 0) {
    // Level 2 decode, plain weights, dense MLP: the engine's kernels only. Per layer: q/k/v GEMV (+ RoPE and
    // the KV append with rope_in_qkv), attention, o GEMV, residual add + RMSNorm (in the o GEMV's last block
    // with norm_in_tail), gate/up GEMV with SwiGLU, down GEMV, residual add + the next RMSNorm (likewise).
    Array ctr;  // norm_in_tail: one zeroed counter per projection with a norm
    if (opt_.norm_in_tail) ctr = full({2 * c.num_layers}, Scalar::of_int(0), DType::i32, device_);
    auto proj_norm = [&](const Array& in, const Array& w, const Array& nw, int64_t slot, int l, const char* name) {
      if (!opt_.norm_in_tail) {
        Array y = fused::project(in, w);
        mark(name, l);
        return add_norm(y, resid, nw, l);
      }
      Array hh, rr;
      fused::project_norm(in, w, resid, nw, c.norm_eps, ctr, slot, hh, rr);
      mark(name, l);  // with the add + norm
      resid = rr;
      return hh;
    };
    // norm_in_proj: no norm launches (the residual added in the o / down epilogues, the
    // norms applied inside the q/k/v, gate/up and lm head GEMVs)
    const bool nip = opt_.norm_in_proj && !opt_.norm_in_tail;
    auto qkv_proj = [&](const LayerWeights& L, int l) {
      if (!nip && opt_.kv_l2 && T <= 8) {  // the layer's KV pages into L2 by the GEMV's last blocks
        fused::ProjOpts o;
        o.kv_k = &cache.k[size_t(l)];
        o.kv_v = &cache.v[size_t(l)];
        o.kv_pos = &pos;
        o.kv_bt = &idx.block_table;
        return fused::project_opts(h, L.qkv, L.qkv_bias, o);
      }
      if (!nip) return fused::project(h, L.qkv, L.qkv_bias);
      fused::ProjOpts o;
      o.norm_w = &L.attn_norm;
      o.norm_eps = c.norm_eps;
      return fused::project_opts(resid, L.qkv, L.qkv_bias, o);
    };
    for (int l = 0; l < int(c.num_layers); ++l) {
      const LayerWeights& L = w_.layers[size_t(l)];
      Array q, k, v, att;
      const bool rq = opt_.rope_in_qkv && !c.qk_norm && !nip;
      if (fa) {  // RoPE, the KV append and attention in one launch
        Array qkv = qkv_proj(L, l);
        mark("qkv", l);
        prefetch_during_attention(L);
        att = fused_attention(qkv, L, l);
        mark("attention", l);  // with RoPE and the KV append
      } else {
        if (rq) {
          q = fused::project_qkv_rope(h, L.qkv, L.qkv_bias, c.num_heads, cache.k[size_t(l)], cache.v[size_t(l)],
                                      pos, idx.block_table, rope);
          mark("qkv", l);  // with RoPE and the KV append
          prefetch_during_attention(L);
        } else {
          split_qkv(qkv_proj(L, l), q, k, v);
          mark("qkv", l);
          prefetch_during_attention(L);
          if (c.qk_norm) {
            q = nn::rms_norm(q, L.q_norm, c.norm_eps);
            k = nn::rms_norm(k, L.k_norm, c.norm_eps);
            mark("qk_norm", l);
          }
          fused::rope_append(q, k, v, cache.k[size_t(l)], cache.v[size_t(l)], pos, idx.block_table, rope, nullptr,
                           o_l2(L));
          mark("rope_kv", l);
        }
        att = attend(q, k, v, l).reshape({T, Q});
        mark("attention", l);
      }
      if (nip) {
        fused::ProjOpts ro;
        ro.residual = &resid;
        resid = fused::project_opts(att, L.o, Array(), ro);
        mark("o_proj", l);  // with the residual add
        fused::ProjOpts go;
        go.swiglu = true;
        go.norm_w = &L.ffn_norm;
        go.norm_eps = c.norm_eps;
        Array act = fused::project_opts(resid, L.gate_up, Array(), go);
        mark("gate_up", l);  // with the norm and SwiGLU
        resid = fused::project_opts(act, L.down, Array(), ro);
        mark("down", l);  // with the residual add
        continue;
      }
      h = proj_norm(att, L.o, L.ffn_norm, 2 * l, l, "o_proj");
      Array act = fused::project(h, L.gate_up, Array(), /*swiglu=*/true);
      mark("gate_up", l);  // with SwiGLU
      const Array& next_norm = l + 1 < int(c.num_layers) ? w_.layers[size_t(l + 1)].attn_norm : w_.final_norm;
      h = proj_norm(act, L.down, next_norm, 2 * l + 1, l, "down");
    }
    if (nip) {
      if (opt_.head_proj && w_.lm_head_q.format.empty() && w_.lm_head.defined() &&
          w_.lm_head.dtype() == resid.dtype()) {
        raw_final_ = true;  // the final norm inside the lm head's GEMV
        return resid;
      }
      h = nn::rms_norm(resid, w_.final_norm, c.norm_eps);
      mark("norm", int(c.num_layers) - 1);
    }
    return h;  // final-normed hidden states [T, H]
  }
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerWeights& L = w_.layers[size_t(l)];
    Array q, k, v, att;
    if (opt_.fusion <= 0 && L.qkv_q.format.empty() && L.q.defined()) {  // unfused: three projections
      q = project(h, L.q, {}, L.q_bias).reshape({T, c.num_heads, D});
      k = project(h, L.k, {}, L.k_bias).reshape({T, c.num_kv_heads, D});
      v = project(h, L.v, {}, L.v_bias).reshape({T, c.num_kv_heads, D});
    } else {
      Array qkv = engine_proj(h) && L.qkv_q.format.empty() ? fused::project(h, L.qkv, L.qkv_bias)
                                                           : project(h, L.qkv, L.qkv_q, L.qkv_bias);
      if (fa) {  // level 2 decode (quantized weights): RoPE, the KV append and attention in one launch
        mark("qkv", l);
        prefetch_during_attention(L);
        // quantized_attention_pdl: launched early (PDL) though the step's other kernels are not
        fused::PdlOnScope fa_pdl(!L.qkv_q.format.empty() && opt_.quantized_attention_pdl);
        // quantized_pdl_compact: not launched early (its large CTAs would park beside the GEMV's)
        fused::NoPdlScope fa_no_pdl(!L.qkv_q.format.empty() && opt_.quantized_pdl_compact);
        att = fused_attention(qkv, L, l);
      } else {
        split_qkv(qkv, q, k, v);
      }
    }
    if (!att.defined()) {
      mark("qkv", l);
      prefetch_during_attention(L);
      if (c.qk_norm) {
        q = nn::rms_norm(q, L.q_norm, c.norm_eps);
        k = nn::rms_norm(k, L.k_norm, c.norm_eps);
        mark("qk_norm", l);
      }
      if (rope_append) {
        fused::rope_append(q, k, v, cache.k[size_t(l)], cache.v[size_t(l)], pos, idx.block_table, rope, nullptr,
                           o_l2(L));
        mark("rope_kv", l);
      } else {
        std::tie(q, k) = nn::rope(q, k, pos, c.rope_theta, rd, c.rope_interleaved, c.rope_scaling, /*inplace=*/true);
        mark("rope", l);
        nn::kv_append(k, v, cache.k[size_t(l)], cache.v[size_t(l)], idx);
        mark("kv_append", l);
      }
      att = attend(q, k, v, l).reshape({T, Q});
    }
    mark("attention", l);
    Array o = engine_proj(att) && L.o_q.format.empty() ? fused::project(att, L.o) : project(att, L.o, L.o_q);
    mark("o_proj", l);
    h = add_norm(o, resid, L.ffn_norm, l);
    Array down = cfg_.num_experts > 0 ? moe_forward(cfg_, L, h)  // Mixtral: sparse MLP (src/llm/moe.cpp)
                                      : mlp(L, h, l);
    const Array& next_norm = l + 1 < int(c.num_layers) ? w_.layers[size_t(l + 1)].attn_norm : w_.final_norm;
    h = add_norm(down, resid, next_norm, l);
  }
  return h;  // final-normed hidden states [T, H]
}

}  // namespace gk::llm
