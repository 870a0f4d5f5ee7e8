// Unit tests of the model-file readers (in-memory files; the Python tests cover
// interoperability with the reference packages and the hostile corpus).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "gpukit/errors.h"
#include "gpukit/io.h"

using namespace gk;
using namespace gk::io;

namespace {

std::shared_ptr<MappedFile> st_bytes(const std::string& header, const std::string& data) {
  std::string f(8, '\0');
  uint64_t n = header.size();
  std::memcpy(f.data(), &n, 8);
  f += header;
  f += data;
  return MappedFile::from_bytes(f.data(), f.size(), "test.safetensors");
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_str(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

std::string expect_format_error(std::shared_ptr<MappedFile> f, bool gguf) {
  try {
    if (gguf) GGUF g(f);
    else SafeTensors s(f);
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no FormatError";
  return "";
}

}  // namespace

TEST(SafeTensors, ParsesAndViews) {
  float vals[3] = {1.5f, -2.f, 3.25f};
  std::string data(reinterpret_cast<const char*>(vals), sizeof vals);
  data += std::string("\x01\x02", 2);
  auto f = st_bytes(
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[12,14]}}  )",
      data);
  SafeTensors st(f);
  ASSERT_EQ(st.tensors().size(), 2u);
  EXPECT_EQ(st.metadata().at("format"), "pt");
  Array w = st.get("w");
  EXPECT_EQ(w.shape(), (Shape{3}));
  EXPECT_EQ(w.data_as<float>()[2], 3.25f);
  EXPECT_EQ(st.get("b").data_as<uint8_t>()[1], 2);
  EXPECT_THROW(st.get("nope"), IndexError);
}

TEST(SafeTensors, RejectsMalformed) {
  std::string d8(8, '\0');
  auto err = [&](const std::string& h, const std::string& d) { return expect_format_error(st_bytes(h, d), false); };
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8).find("overlaps"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8).find("trailing"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8).find("needs 12"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", d8)
                .find("too many elements"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", d8).find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(err("{\"a\xff\":1}", d8).find("UTF-8"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}} x)", d8).find("after"), std::string::npos);
  EXPECT_NE(err(R"({"a":{"dtype":"U8","shape":[-8],"data_offsets":[0,8]}})", d8).find("negative"),
            std::string::npos);
  std::string deep(200, '[');
  EXPECT_NE(err("{\"a\":{\"dtype\":\"U8\",\"x\":" + deep + "}}", d8).find("nesting"), std::string::npos);
  // Header length past the end.
  std::string f(8, '\0');
  uint64_t n = 1000;
  std::memcpy(f.data(), &n, 8);
  EXPECT_NE(expect_format_error(MappedFile::from_bytes(f.data(), f.size()), false).find("exceeds the file"),
            std::string::npos);
}

TEST(SafeTensors, WriterRoundTrips) {
  auto dir = std::filesystem::temp_directory_path() / "gk_test_io";
  std::filesystem::create_directories(dir);
  std::string path = (dir / "rt.safetensors").string();
  Array a = Array::empty({2, 3}, DType::f32);
  for (int k = 0; k < 6; ++k) a.data_as<float>()[k] = float(k) * 0.5f - 1;
  Array b = Array::empty({5}, DType::i8);
  for (int k = 0; k < 5; ++k) b.data_as<int8_t>()[k] = int8_t(k - 2);
  save_safetensors(path, {{"b", b}, {"a\"q", a.T()}}, {{"k", "v\n"}});
  SafeTensors st(path);
  EXPECT_EQ(st.metadata().at("k"), "v\n");
  Array a2 = st.get("a\"q");
  EXPECT_EQ(a2.shape(), (Shape{3, 2}));
  EXPECT_EQ(a2.data_as<float>()[1], a.data_as<float>()[3]);  // transposed, made contiguous
  EXPECT_EQ(st.get("b").data_as<int8_t>()[4], 2);
  ShardedSafeTensors sh(dir.string());
  EXPECT_TRUE(sh.contains("b"));
  std::filesystem::remove_all(dir);
}

namespace {
std::string gguf_header(uint32_t version, uint64_t nt, uint64_t nkv) {
  std::string s = "GGUF";
  put<uint32_t>(s, version);
  put<uint64_t>(s, nt);
  put<uint64_t>(s, nkv);
  return s;
}
}  // namespace

TEST(GGUF, ParsesMetadataAndTensors) {
  std::string s = gguf_header(3, 1, 3);
  put_str(s, "general.architecture");
  put<uint32_t>(s, 8);
  put_str(s, "llama");
  put_str(s, "tok");
  put<uint32_t>(s, 9);
  put<uint32_t>(s, 8);
  put<uint64_t>(s, 2);
  put_str(s, "a");
  put_str(s, "bc");
  put_str(s, "nested");
  put<uint32_t>(s, 9);
  put<uint32_t>(s, 9);
  put<uint64_t>(s, 1);
  put<uint32_t>(s, 5);
  put<uint64_t>(s, 2);
  put<int32_t>(s, -7);
  put<int32_t>(s, 9);
  put_str(s, "t");
  put<uint32_t>(s, 2);
  put<int64_t>(s, 32);
  put<int64_t>(s, 2);
  put<uint32_t>(s, 8);  // Q8_0
  put<uint64_t>(s, 0);
  while (s.size() % 32) s += '\0';
  for (int blk = 0; blk < 2; ++blk) {
    put<uint16_t>(s, 0x3800);  // 0.5
    for (int j = 0; j < 32; ++j) s += char(j - 16);
  }
  GGUF g(MappedFile::from_bytes(s.data(), s.size(), "t.gguf"));
  EXPECT_EQ(g.find("general.architecture")->as_string(), "llama");
  EXPECT_EQ(g.find("tok")->as_strings(), (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(g.find("nested")->at(0).as_ints(), (std::vector<int64_t>{-7, 9}));
  EXPECT_THROW(g.find("tok")->as_ints(), FormatError);
  EXPECT_EQ(g.info("t").shape(), (Shape{2, 32}));
  Array d = g.dequantize("t");
  EXPECT_EQ(d.data_as<float>()[0], -8.f);
  EXPECT_EQ(d.data_as<float>()[63], 7.5f);
  Array bf = g.dequantize("t", DType::bf16);
  EXPECT_EQ(float(bf.data_as<bf16>()[33]), -7.5f);
  EXPECT_EQ(g.raw("t").shape(), (Shape{2, 34}));
}

TEST(GGUF, RejectsMalformed) {
  auto err = [](const std::string& s) {
    return expect_format_error(MappedFile::from_bytes(s.data(), s.size(), "bad.gguf"), true);
  };
  EXPECT_NE(err("GGUX").find("magic"), std::string::npos);
  EXPECT_NE(err(gguf_header(1, 0, 0)).find("version 1"), std::string::npos);
  EXPECT_NE(err(gguf_header(3, 0, 1ull << 60)).find("metadata count"), std::string::npos);
  std::string s = gguf_header(3, 0, 1);
  put_str(s, "k");
  put<uint32_t>(s, 9);
  put<uint32_t>(s, 0);
  put<uint64_t>(s, 1ull << 29);
  EXPECT_NE(err(s).find("needs at least"), std::string::npos);
  s = gguf_header(3, 0, 1);
  put_str(s, "k");
  put<uint32_t>(s, 13);
  EXPECT_NE(err(s).find("unknown metadata value type"), std::string::npos);
  s = gguf_header(3, 0, 1);
  put_str(s, "k");
  put<uint32_t>(s, 9);
  for (int d = 0; d < 20; ++d) {
    put<uint32_t>(s, 9);
    put<uint64_t>(s, 1);
  }
  s += std::string(64, '\0');
  EXPECT_NE(err(s).find("nested deeper"), std::string::npos);
  auto tensor = [](int64_t d0, int64_t d1, uint32_t type, uint64_t off) {
    std::string t = gguf_header(3, 1, 0);
    put_str(t, "w");
    put<uint32_t>(t, 2);
    put<int64_t>(t, d0);
    put<int64_t>(t, d1);
    put<uint32_t>(t, type);
    put<uint64_t>(t, off);
    t += std::string(128, '\0');
    return t;
  };
  EXPECT_NE(err(tensor(0, 4, 0, 0)).find("zero"), std::string::npos);
  EXPECT_NE(err(tensor(-1, 4, 0, 0)).find("negative"), std::string::npos);
  EXPECT_NE(err(tensor(int64_t(1) << 40, int64_t(1) << 40, 0, 0)).find("overflows"), std::string::npos);
  EXPECT_NE(err(tensor(4, 4, 77, 0)).find("unknown tensor type"), std::string::npos);
  EXPECT_NE(err(tensor(4, 4, 0, 3)).find("alignment"), std::string::npos);
  EXPECT_NE(err(tensor(64, 64, 0, 0)).find("past the end"), std::string::npos);
  EXPECT_NE(err(tensor(33, 1, 2, 0)).find("block size"), std::string::npos);
}
