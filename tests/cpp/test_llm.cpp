// The C++ API of the LLM engine: a tiny random model written as a Hugging Face
// checkpoint, loaded back, forward == batched step, generation, and bad input.
// (Numerical parity with a float64 reference lives in tests/python/test_llm.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "gpukit/errors.h"
#include "gpukit/llm.h"

using namespace gk;

namespace {

const char* kConfig = R"({"model_type": "llama", "vocab_size": 61, "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 96,
  "max_position_embeddings": 48, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
  "eos_token_id": 2})";

std::string write_model(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << kConfig;
  llm::ModelConfig c = llm::config_from_hf_json(kConfig);
  auto m = llm::Model::random(c, Device{}, DType::f32, 3);
  const llm::Weights& w = m->weights();
  std::vector<std::pair<std::string, Array>> t = {{"model.embed_tokens.weight", w.embed},
                                                  {"model.norm.weight", w.final_norm}};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto& L = w.layers[l];
    std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", L.attn_norm});
    t.push_back({p + "post_attention_layernorm.weight", L.ffn_norm});
    t.push_back({p + "self_attn.q_proj.weight", L.q});
    t.push_back({p + "self_attn.k_proj.weight", L.k});
    t.push_back({p + "self_attn.v_proj.weight", L.v});
    t.push_back({p + "self_attn.o_proj.weight", L.o});
    t.push_back({p + "mlp.gate_proj.weight", L.gate});
    t.push_back({p + "mlp.up_proj.weight", L.up});
    t.push_back({p + "mlp.down_proj.weight", L.down});
  }
  io::save_safetensors((dir / "model.safetensors").string(), t);
  return dir.string();
}

}  // namespace

TEST(Llm, ConfigAndUnknownArchitecture) {
  llm::ModelConfig c = llm::config_from_hf_json(kConfig);
  EXPECT_EQ(c.family, "llama");
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_TRUE(c.tie_embeddings);
  std::string bad = kConfig;
  bad.replace(bad.find("\"llama\""), 7, "\"gpt_neox\"");
  try {
    llm::config_from_hf_json(bad);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("supported: llama"), std::string::npos) << e.what();
  }
}

TEST(Llm, LoadForwardStepGenerate) {
  std::string dir = write_model("gk_llm_cpp_test");
  auto m = llm::Model::load(dir);
  ASSERT_EQ(m->config().vocab_size, 61);
  std::vector<int32_t> ids = {5, 9, 13, 17, 21, 25, 29};
  Array full = m->forward(ids);
  ASSERT_EQ(full.shape(), (Shape{7, 61}));
  // prefill of 4 tokens then 3 decode steps give the same rows
  llm::KvCache cache = m->make_cache({7});
  int64_t s = cache.add_sequence();
  Array a = m->step(cache, {s}, {{5, 9, 13, 17}}, true);
  const float* f = full.data_as<float>();
  for (int64_t i = 0; i < 4 * 61; ++i) EXPECT_NEAR(a.data_as<float>()[i], f[i], 1e-4f * (1 + std::fabs(f[i])));
  for (int j = 4; j < 7; ++j) {
    Array r = m->step(cache, {s}, {{ids[size_t(j)]}}, false);
    for (int64_t v = 0; v < 61; ++v)
      EXPECT_NEAR(r.data_as<float>()[v], f[j * 61 + v], 1e-4f * (1 + std::fabs(f[j * 61 + v])));
  }
  EXPECT_EQ(cache.length(s), 7);
  // greedy generation: the first token is the argmax of the prompt's last row
  llm::GenerateOptions o;
  o.max_new_tokens = 5;
  o.ignore_eos = true;
  auto out = llm::generate(m, {ids}, o);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].size(), 5u);
  int best = 0;
  for (int v = 1; v < 61; ++v)
    if (f[6 * 61 + v] > f[6 * 61 + best]) best = v;
  EXPECT_EQ(out[0][0], best);
  // bad input
  EXPECT_THROW(m->forward({}), ValueError);
  EXPECT_THROW(m->forward(std::vector<int32_t>(49, 1)), ValueError);
  EXPECT_THROW(llm::generate(m, {{}}, o), ValueError);
  o.top_p = 0;
  EXPECT_THROW(llm::generate(m, {ids}, o), ValueError);
  EXPECT_THROW(llm::Model::load(dir + "/missing"), ValueError);
  std::filesystem::remove_all(dir);
}
