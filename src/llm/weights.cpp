// Weight loading: every tensor by name from safetensors (bf16/fp16/fp32) or GGUF
// (float formats, quantized ones dequantized here), checked against the config,
// converted to the requested dtype and moved to the device one tensor at a time,
// so host memory peaks at about one tensor. A failed load throws and the arrays
// made so far are released with the partial Weights.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <map>

#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "llm/internal.h"

namespace gk::llm {

namespace fs = std::filesystem;

ModelFiles locate_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ValueError(cat("model path '", path, "' does not exist"));
  ModelFiles f;
  if (fs::is_directory(path, ec)) {
    f.dir = path;
    f.weights = path;
    if (!fs::exists(fs::path(path) / "config.json", ec)) {
      // a directory holding exactly one .gguf file
      std::string found;
      for (auto& e : fs::directory_iterator(path, ec))
        if (e.path().extension() == ".gguf") {
          if (!found.empty()) throw ValueError(cat("model directory '", path, "' has no config.json and several .gguf files"));
          found = e.path().string();
        }
      if (found.empty()) throw ValueError(cat("model directory '", path, "' has neither config.json nor a .gguf file"));
      f = {};
      f.gguf = found;
    }
    return f;
  }
  if (fs::path(path).extension() == ".gguf") {
    f.gguf = path;
    return f;
  }
  if (fs::path(path).extension() == ".safetensors" || fs::path(path).extension() == ".json") {
    f.dir = fs::path(path).parent_path().string();
    if (f.dir.empty()) f.dir = ".";
    if (!fs::exists(fs::path(f.dir) / "config.json", ec))
      throw ValueError(cat("model file '", path, "': no config.json beside it"));
    f.weights = fs::path(path).filename() == "config.json" ? f.dir : path;
    return f;
  }
  // sniff the magic
  FILE* fp = std::fopen(path.c_str(), "rb");
  char magic[4] = {};
  if (fp) {
    size_t got = std::fread(magic, 1, 4, fp);
    std::fclose(fp);
    if (got == 4 && std::string(magic, 4) == "GGUF") {
      f.gguf = path;
      return f;
    }
  }
  throw ValueError(cat("model path '", path, "' is neither a GGUF file nor a directory with config.json"));
}

namespace {

struct Source {
  std::unique_ptr<io::GGUF> gguf;
  std::unique_ptr<io::ShardedSafeTensors> st;
  bool contains(const std::string& n) const { return gguf ? gguf->contains(n) : st->contains(n); }
  Shape shape(const std::string& n) const { return gguf ? gguf->info(n).shape() : st->info(n).shape; }
  // The stored type must be readable (checked for every tensor before any is read).
  void check_type(const std::string& n) const {
    if (gguf) {
      const auto& info = gguf->info(n);
      if (!io::ggml_can_dequantize(info.type))
        throw ValueError(cat("tensor ", n, ": GGUF type ", io::ggml_type_name(info.type), " is not supported"));
      return;
    }
    DType t = st->info(n).dtype;
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16)
      throw ValueError(cat("tensor ", n, ": dtype ", dtype_name(t), " is not supported (float32, float16, bfloat16)"));
  }
  // mapped: the array views the file mapping (safetensors) rather than owning memory
  Array read(const std::string& n, bool& mapped) const {
    check_type(n);
    mapped = !gguf;
    if (gguf) return gguf->dequantize(n, DType::f32);
    return st->get(n);
  }
};

}  // namespace

std::vector<WeightSlot> weight_plan(const ModelConfig& c, Weights& w, bool tied) {
  if (c.family == "gpt2") return gpt2_weight_plan(c, w, tied);
  const int64_t H = c.hidden_size, D = c.head_dim, Q = c.num_heads * D, KV = c.num_kv_heads * D;
  const int64_t I = c.intermediate_size, V = c.vocab_size;
  w.layers.resize(size_t(c.num_layers));
  std::vector<WeightSlot> wants;
  wants.push_back({&w.embed, "embed", -1, {V, H}});
  wants.push_back({&w.final_norm, "final_norm", -1, {H}});
  if (!tied) wants.push_back({&w.lm_head, "lm_head", -1, {V, H}});
  for (int l = 0; l < int(c.num_layers); ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    wants.push_back({&L.attn_norm, "attn_norm", l, {H}});
    wants.push_back({&L.q, "q", l, {Q, H}});
    wants.push_back({&L.k, "k", l, {KV, H}});
    wants.push_back({&L.v, "v", l, {KV, H}});
    wants.push_back({&L.o, "o", l, {H, Q}});
    if (c.attention_bias) {
      wants.push_back({&L.q_bias, "q_bias", l, {Q}});
      wants.push_back({&L.k_bias, "k_bias", l, {KV}});
      wants.push_back({&L.v_bias, "v_bias", l, {KV}});
    }
    if (c.qk_norm) {
      wants.push_back({&L.q_norm, "q_norm", l, {D}});
      wants.push_back({&L.k_norm, "k_norm", l, {D}});
    }
    wants.push_back({&L.ffn_norm, "ffn_norm", l, {H}});
    if (c.num_experts > 0) {
      moe_weight_slots(c, L, l, wants);
      continue;
    }
    wants.push_back({&L.gate, "gate", l, {I, H}});
    wants.push_back({&L.up, "up", l, {I, H}});
    wants.push_back({&L.down, "down", l, {H, I}});
  }
  return wants;
}

Weights load_weights(const ModelConfig& c, const std::string& path, Device device, DType dtype,
                     const Progress& progress) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw ValueError(cat("dtype: models run in float32, float16 or bfloat16, got ", dtype_name(dtype)));
  ModelFiles files = locate_model(path);
  Source src;
  if (!files.gguf.empty()) src.gguf = std::make_unique<io::GGUF>(files.gguf);
  else src.st = std::make_unique<io::ShardedSafeTensors>(files.weights);

  Weights w;
  bool tied = c.tie_embeddings || !src.contains(tensor_name(c, "lm_head"));
  std::vector<WeightSlot> wants = weight_plan(c, w, tied);
  // The file's name of a tensor: HF GPT-2 checkpoints may lack the "transformer." prefix.
  auto file_name = [&](const WeightSlot& want) {
    std::string n = tensor_name(c, want.role, want.layer);
    const std::string pre = "transformer.";
    if (!src.contains(n) && n.rfind(pre, 0) == 0 && src.contains(n.substr(pre.size()))) n = n.substr(pre.size());
    return n;
  };
  // Check every name and shape before reading anything.
  for (auto& want : wants) {
    std::string n = file_name(want);
    if (!src.contains(n)) throw ValueError(cat("model file: tensor ", n, " is missing"));
    Shape s = src.shape(n);
    Shape expect = want.shape;
    if (want.file_transposed) std::reverse(expect.begin(), expect.end());
    if (s != expect)
      throw ValueError(cat("model file: tensor ", n, " has shape ", shape_str(s), ", expected ", shape_str(expect),
                           " from the config"));
    src.check_type(n);
  }
  int64_t done = 0;
  for (auto& want : wants) {
    std::string n = file_name(want);
    bool mapped = false;
    Array a = src.read(n, mapped);
    if (want.file_transposed) {  // [in, out] -> [out, in], an owned copy
      a = a.T().contiguous();
      mapped = false;
    }
    Array b = a.astype(dtype);
    if (mapped && b.storage() == a.storage() && device.is_cpu()) b = b.copy();  // own it, not the file mapping
    a = Array();
    b = b.to(device);
    w.nbytes += b.nbytes();
    *want.dst = std::move(b);
    if (progress) progress(++done, int64_t(wants.size()));
  }
  if (tied) w.lm_head = w.embed;
  moe_finish_weights(c, w);
  return w;
}

namespace {
// xorshift64* draws: norms near 1, other weights uniform with unit variance scaled by
// 1/sqrt(fan_in) (biases 0.1 of that), made on the host in float32.
Array random_tensor(const WeightSlot& want, uint64_t& state, Device device, DType dtype) {
  Array a = Array::empty(want.shape, DType::f32, Device{});
  float* p = a.data_as<float>();
  const int64_t n = a.numel();
  const bool norm = want.shape.size() == 1 && want.role.find("bias") == std::string::npos;
  const float scale = want.shape.size() == 2 && want.role != "embed" ? 1.0f / std::sqrt(float(want.shape[1])) : 1.0f;
  const float bias = want.role.find("bias") != std::string::npos ? 0.1f : 1.0f;
  for (int64_t i = 0; i < n; ++i) {  // uniform in [-1, 1)
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const float u = float((state * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    p[i] = norm ? 1.0f + 0.1f * u : 1.7320508f * u * scale * bias;
  }
  return a.astype(dtype).to(device);
}
}  // namespace

// Fast pseudo-random values made on the device (share_layers on CUDA: benchmark set-up
// of multi-GB models in seconds): u_i = sin(i a + s) sin(i b + t) over float64 i, two
// incommensurate Weyl rotations (mean 0, variance 1/4), scaled like random_tensor.
static Array device_random_tensor(const WeightSlot& want, uint64_t salt, Device device, DType dtype) {
  int64_t n = 1;
  for (int64_t x : want.shape) n *= x;
  const double s = double(salt % 1000003) * 0.001, t = double((salt / 1000003) % 1000003) * 0.0007;
  Array i = arange(0, double(n), 1, DType::f64, device);
  Array u1 = unary(UnaryOp::Sin, binary(BinaryOp::Add, binary(BinaryOp::Mul, i, Scalar::of(3.8832220774509327)),
                                        Scalar::of(s)));
  Array u2 = unary(UnaryOp::Sin, binary(BinaryOp::Add, binary(BinaryOp::Mul, i, Scalar::of(4.7430302002081620)),
                                        Scalar::of(t)));
  i = Array();
  const float scale = want.role != "embed" ? 1.0f / std::sqrt(float(want.shape[1])) : 1.0f;
  Array u = binary(BinaryOp::Mul, mul(u1, u2), Scalar::of(2.0 * scale));  // unit variance * scale
  return u.astype(dtype).reshape(want.shape);
}

Weights random_weights(const ModelConfig& c, Device device, DType dtype, uint64_t seed, bool share_layers) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw ValueError(cat("dtype: models run in float32, float16 or bfloat16, got ", dtype_name(dtype)));
  Weights w;
  std::vector<WeightSlot> wants = weight_plan(c, w, c.tie_embeddings);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  std::map<std::string, Array> first;  // share_layers: layer 0's tensor of each role
  for (auto& want : wants) {
    Array b;
    if (share_layers && want.layer > 0) b = first.at(want.role).copy();
    else if (share_layers && device.is_cuda() && want.shape.size() == 2)
      b = device_random_tensor(want, seed * 7919 + wants.size() + std::hash<std::string>{}(want.role), device, dtype);
    else b = random_tensor(want, state, device, dtype);
    if (share_layers && want.layer == 0) first[want.role] = b;
    w.nbytes += b.nbytes();
    *want.dst = std::move(b);
  }
  if (c.tie_embeddings) w.lm_head = w.embed;
  moe_finish_weights(c, w);
  return w;
}

namespace {
// Rows of the given matrices (or vectors) stacked into one new array.
Array concat_rows(const std::vector<const Array*>& parts) {
  int64_t rows = 0;
  for (const Array* a : parts) rows += a->shape(0);
  Shape s = parts[0]->shape();
  s[0] = rows;
  Array out = Array::empty(s, parts[0]->dtype(), parts[0]->device());
  int64_t at = 0;
  for (const Array* a : parts) {
    copy_into(out.narrow(0, at, a->shape(0)), *a);
    at += a->shape(0);
  }
  return out;
}
size_t qbytes(const QuantizedWeight& q) {
  size_t n = q.q.nbytes();
  if (q.scales.defined()) n += q.scales.nbytes();
  if (q.zeros.defined()) n += q.zeros.nbytes();
  return n;
}
QuantizedWeight copy_qw(const QuantizedWeight& q) {
  QuantizedWeight r = q;
  r.q = q.q.copy();
  if (q.scales.defined()) r.scales = q.scales.copy();
  if (q.zeros.defined()) r.zeros = q.zeros.copy();
  return r;
}
}  // namespace

void prepare_weights(const ModelConfig& c, Weights& w, const std::string& quantize_arg, bool share_layers) {
  // "<format>" or "<format>:head=<fp8|int8|int4|none>" (the lm head's format; none keeps
  // it in the model's dtype; default int8 for int4 models, else the layers' format)
  std::string quantize = quantize_arg, head_fmt;
  if (const size_t colon = quantize_arg.find(':'); colon != std::string::npos) {
    quantize = quantize_arg.substr(0, colon);
    const std::string rest = quantize_arg.substr(colon + 1);
    if (rest.rfind("head=", 0) != 0) throw ValueError(cat("quantize: expected \"<format>:head=<format>\", got \"", quantize_arg, "\""));
    head_fmt = rest.substr(5);
    if (head_fmt != "fp8" && head_fmt != "int8" && head_fmt != "int4" && head_fmt != "none")
      throw ValueError(cat("quantize: the head's format must be fp8, int8, int4 or none, got \"", head_fmt, "\""));
  }
  if (!quantize.empty() && quantize != "fp8" && quantize != "int8" && quantize != "int4")
    throw ValueError(cat("quantize: expected \"fp8\", \"int8\" or \"int4\", got \"", quantize_arg, "\""));
  if (quantize.empty() && !head_fmt.empty()) throw ValueError("quantize: a head format needs a layer format");
  const int64_t Q = c.num_heads * c.head_dim, KV = c.num_kv_heads * c.head_dim, I = c.intermediate_size;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& L = w.layers[l];
    if (L.q.defined() && L.k.defined() && L.v.defined() && !L.qkv.defined()) {
      L.qkv = concat_rows({&L.q, &L.k, &L.v});
      L.q = L.qkv.narrow(0, 0, Q);
      L.k = L.qkv.narrow(0, Q, KV);
      L.v = L.qkv.narrow(0, Q + KV, KV);
      if (L.q_bias.defined()) {
        L.qkv_bias = concat_rows({&L.q_bias, &L.k_bias, &L.v_bias});
        L.q_bias = L.qkv_bias.narrow(0, 0, Q);
        L.k_bias = L.qkv_bias.narrow(0, Q, KV);
        L.v_bias = L.qkv_bias.narrow(0, Q + KV, KV);
      }
    }
    if (L.gate.defined() && L.up.defined() && !L.gate_up.defined()) {  // SwiGLU MLP (not MoE layers)
      L.gate_up = concat_rows({&L.gate, &L.up});
      L.gate = L.gate_up.narrow(0, 0, I);
      L.up = L.gate_up.narrow(0, I, I);
    }
  }
  if (quantize.empty()) return;
  // int4 groups: 128 columns, or 64 / 32 where K is not a multiple of 128 (SmolLM2: 576)
  auto q = [&](const Array& a, const char* role, size_t layer) {
    const int64_t K = a.shape(1);
    int64_t group = 128;
    while (group > 32 && K % group != 0) group /= 2;
    if (quantize == "int4" && K % group != 0)
      throw ValueError(cat("quantize: layer ", layer, " ", role, " has K = ", K,
                           ", not a multiple of 32 (the smallest int4 group)"));
    return quantize_weight(a, quantize, group);
  };
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& L = w.layers[l];
    if (!L.qkv.defined() || !L.o.defined() || !L.gate_up.defined() || !L.down.defined())
      throw ValueError(cat("quantize: supported for the llama, qwen2 and qwen3 families (q/k/v, o, gate/up, down), "
                           "not for layer ", l, " of this ", c.family, " model"));
    const size_t before = L.qkv.nbytes() + L.o.nbytes() + L.gate_up.nbytes() + L.down.nbytes();
    if (share_layers && l > 0 && w.layers[0].qkv_q.q.defined()) {
      const LayerWeights& F = w.layers[0];
      L.qkv_q = copy_qw(F.qkv_q);
      L.o_q = copy_qw(F.o_q);
      L.gate_up_q = copy_qw(F.gate_up_q);
      L.down_q = copy_qw(F.down_q);
    } else {
      L.qkv_q = q(L.qkv, "qkv", l);
      L.o_q = q(L.o, "o", l);
      L.gate_up_q = q(L.gate_up, "gate_up", l);
      L.down_q = q(L.down, "down", l);
    }
    L.q = L.k = L.v = L.o = L.gate = L.up = L.down = L.qkv = L.gate_up = Array();
    w.nbytes = w.nbytes - before + qbytes(L.qkv_q) + qbytes(L.o_q) + qbytes(L.gate_up_q) + qbytes(L.down_q);
  }
  const std::string head = !head_fmt.empty() ? head_fmt : quantize == "int4" ? "int8" : quantize;
  if (w.lm_head.defined() && head != "none") {
    int64_t group = 128;
    while (group > 32 && w.lm_head.shape(1) % group != 0) group /= 2;
    if (head == "int4" && w.lm_head.shape(1) % group != 0)
      throw ValueError(cat("quantize: the lm head has K = ", w.lm_head.shape(1), ", not a multiple of 32"));
    w.lm_head_q = quantize_weight(w.lm_head, head, group);
    const bool tied = w.lm_head.storage() == w.embed.storage();
    w.nbytes += qbytes(w.lm_head_q);
    if (!tied) {  // the float lm head is no longer read
      w.nbytes -= w.lm_head.nbytes();
      w.lm_head = Array();
    }
  }
  w.quantized = quantize;
}

}  // namespace gk::llm
