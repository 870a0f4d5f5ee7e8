// Weight loading: every tensor by name from safetensors (bf16/fp16/fp32) or GGUF
// (float formats, quantized ones dequantized here), checked against the config,
// converted to the requested dtype and moved to the device one tensor at a time,
// so host memory peaks at about one tensor. A failed load throws and the arrays
// made so far are released with the partial Weights.
#include <cmath>
#include <filesystem>

#include "gpukit/errors.h"
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
  // mapped: the array views the file mapping (safetensors) rather than owning memory
  Array read(const std::string& n, bool& mapped) const {
    mapped = !gguf;
    if (gguf) {
      const auto& info = gguf->info(n);
      if (!io::ggml_can_dequantize(info.type))
        throw ValueError(cat("tensor ", n, ": GGUF type ", io::ggml_type_name(info.type), " is not supported"));
      return gguf->dequantize(n, DType::f32);
    }
    Array a = st->get(n);
    DType t = a.dtype();
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16)
      throw ValueError(cat("tensor ", n, ": dtype ", dtype_name(t), " is not supported (float32, float16, bfloat16)"));
    return a;
  }
};

}  // namespace

std::vector<WeightSlot> weight_plan(const ModelConfig& c, Weights& w, bool tied) {
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
  // Check every name and shape before reading anything.
  for (auto& want : wants) {
    std::string n = tensor_name(c, want.role, want.layer);
    if (!src.contains(n)) throw ValueError(cat("model file: tensor ", n, " is missing"));
    Shape s = src.shape(n);
    if (s != want.shape)
      throw ValueError(cat("model file: tensor ", n, " has shape ", shape_str(s), ", expected ", shape_str(want.shape),
                           " from the config"));
  }
  int64_t done = 0;
  for (auto& want : wants) {
    std::string n = tensor_name(c, want.role, want.layer);
    bool mapped = false;
    Array a = src.read(n, mapped);
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

Weights random_weights(const ModelConfig& c, Device device, DType dtype, uint64_t seed) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw ValueError(cat("dtype: models run in float32, float16 or bfloat16, got ", dtype_name(dtype)));
  Weights w;
  std::vector<WeightSlot> wants = weight_plan(c, w, c.tie_embeddings);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& want : wants) {
    Array a = Array::empty(want.shape, DType::f32, Device{});
    float* p = a.data_as<float>();
    const int64_t n = a.numel();
    const bool norm = want.shape.size() == 1 && want.role.find("bias") == std::string::npos;
    const float scale = want.shape.size() == 2 && want.role != "embed" ? 1.0f / std::sqrt(float(want.shape[1])) : 1.0f;
    for (int64_t i = 0; i < n; ++i) {  // xorshift64*: uniform in [-1, 1) * sqrt(3) (unit variance)
      state ^= state >> 12;
      state ^= state << 25;
      state ^= state >> 27;
      const float u = float((state * 0x2545F4914F6CDD1Dull) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
      p[i] = norm ? 1.0f + 0.1f * u : 1.7320508f * u * scale * (want.role.find("bias") != std::string::npos ? 0.1f : 1.0f);
    }
    Array b = a.astype(dtype).to(device);
    w.nbytes += b.nbytes();
    *want.dst = std::move(b);
  }
  if (c.tie_embeddings) w.lm_head = w.embed;
  moe_finish_weights(c, w);
  return w;
}

}  // namespace gk::llm
