// The C++ side of gk::jit: type parsing, signatures, cache keys, compile errors.
// NVRTC parts skip when libnvrtc cannot be loaded; launches are tested from Python on the GPU.
#include <gtest/gtest.h>

#include "gpukit/jit.h"
#include "jit/internal.h"

using namespace gk;
using namespace gk::jit;

TEST(JitTypes, Scalars) {
  EXPECT_EQ(parse_type("int").kind, ParamKind::Int);
  EXPECT_EQ(parse_type("unsigned long long").kind, ParamKind::UInt);
  EXPECT_EQ(parse_type("unsigned long long").size, 8);
  EXPECT_EQ(parse_type("const double").size, 8);
  EXPECT_EQ(parse_type("__nv_bfloat16").elem, DType::bf16);
  EXPECT_EQ(parse_type("signed char").elem, DType::i8);
  EXPECT_EQ(parse_type("bool").kind, ParamKind::Bool);
  EXPECT_THROW(parse_type("float&"), ValueError);
  EXPECT_THROW(parse_type("long double"), ValueError);
  EXPECT_THROW(parse_type(""), ValueError);
}

TEST(JitTypes, Pointers) {
  ParamType p = parse_type("const float* __restrict__");
  EXPECT_EQ(p.kind, ParamKind::Pointer);
  EXPECT_EQ(p.elem, DType::f32);
  EXPECT_FALSE(p.any_elem);
  EXPECT_TRUE(parse_type("void*").any_elem);
  EXPECT_TRUE(parse_type("char*").any_elem);
  EXPECT_TRUE(parse_type("float**").any_elem);
  EXPECT_TRUE(parse_type("unsigned*").unsigned_elem);
  EXPECT_EQ(parse_type("float4*").elem, DType::f32);
}

TEST(JitSignature, TemplatesAndDefaults) {
  const char* src = "template <typename T, typename U = int>\n__global__ void k(const T* x, U n, T s) {}";
  auto sig = find_signature(src, "k<double>");
  ASSERT_TRUE(sig.has_value());
  ASSERT_EQ(sig->params.size(), 3u);
  EXPECT_EQ(sig->params[0].elem, DType::f64);
  EXPECT_EQ(sig->params[1].kind, ParamKind::Int);
  EXPECT_EQ(sig->names[2], "s");
  EXPECT_FALSE(find_signature(src, "missing").has_value());
}

TEST(JitHash, Sha256KnownVectors) {
  EXPECT_EQ(gk::jit::detail::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(gk::jit::detail::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(gk::jit::detail::sha256_hex(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(JitArch, Normalize) {
  EXPECT_EQ(normalize_arch("90a"), "sm_90a");
  EXPECT_EQ(normalize_arch("sm_120"), "sm_120");
  EXPECT_EQ(normalize_arch("compute_80"), "compute_80");
  EXPECT_THROW(normalize_arch("sm90"), ValueError);
  EXPECT_THROW(normalize_arch("sm_9"), ValueError);
}

TEST(JitCompile, KeysAndErrors) {
  if (!available()) GTEST_SKIP() << unavailable_reason();
  const std::string src = "extern \"C\" __global__ void f(int* p) { p[0] = 1; }";
  auto a = compile(src, "f", {}, "sm_90a", /*use_cache=*/false);
  EXPECT_TRUE(a->cubin);
  EXPECT_EQ(a->lowered_name, "f");
  EXPECT_EQ(a->binary.substr(0, 4), "\x7f" "ELF");
  EXPECT_EQ(cache_key(src, "f", {"-DA"}, "sm_90a"), cache_key(src, "f", {"-DA"}, "sm_90a"));
  EXPECT_NE(cache_key(src, "f", {"-DA"}, "sm_90a"), cache_key(src, "f", {"-DB"}, "sm_90a"));
  EXPECT_NE(cache_key(src, "f", {}, "sm_90a"), cache_key(src, "f", {}, "sm_80"));
  EXPECT_NE(cache_key(src, "f", {}, "sm_90a"), cache_key(src + " ", "f", {}, "sm_90a"));
  try {
    compile("extern \"C\" __global__ void f() {\n  undefined_name();\n}", "f", {}, "sm_90a", false);
    FAIL() << "no JitError";
  } catch (const JitError& e) {
    EXPECT_EQ(e.line, 2);
    EXPECT_NE(e.source_line.find("undefined_name"), std::string::npos);
    EXPECT_NE(e.log.find("undefined_name"), std::string::npos);
  }
}
