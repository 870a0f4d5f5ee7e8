// gk::Array views, factories, conversions and errors (CPU; a CUDA round trip when present).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpukit/array.h"
#include "gpukit/errors.h"
#include "gpukit/ops.h"

using namespace gk;

namespace {
Array iota(int64_t n, DType t = DType::f32) { return arange(0, double(n), 1, t, Device::cpu()); }
std::vector<double> to_vec(const Array& a) {
  Array c = a.to(Device::cpu()).astype(DType::f64);
  return std::vector<double>(c.data_as<double>(), c.data_as<double>() + c.numel());
}
}  // namespace

TEST(Array, EmptyIsContiguousRowMajor) {
  Array a = Array::empty({2, 3, 4}, DType::f32);
  EXPECT_EQ(a.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(a.numel(), 24);
  EXPECT_EQ(a.nbytes(), 96u);
  EXPECT_TRUE(a.is_contiguous());
}

TEST(Array, ViewsDoNotCopyAndReadTheRightElements) {
  Array a = iota(24).reshape({2, 3, 4});
  Array t = a.permute({2, 0, 1});
  EXPECT_EQ(t.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(t.storage(), a.storage());
  EXPECT_FALSE(t.is_contiguous());
  Array s = a.slice(2, 3, std::nullopt, -2);  // [..., 3::-2] -> elements 3, 1
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(to_vec(s.select(0, 1).select(0, 2)), (std::vector<double>{23, 21}));
  EXPECT_EQ(to_vec(a.narrow(1, 1, 1).squeeze()), (std::vector<double>{4, 5, 6, 7, 16, 17, 18, 19}));
  Array b = a.select(2, 0).unsqueeze(0).broadcast_to({3, 2, 3});
  EXPECT_EQ(b.strides()[0], 0);
  EXPECT_EQ(to_vec(b).size(), 18u);
  EXPECT_EQ(to_vec(a.T().contiguous()).at(1), 12);
}

TEST(Array, ReshapeRefusesWhatNeedsACopy) {
  Array a = iota(12).reshape({3, 4});
  EXPECT_THROW(a.T().reshape({12}), ValueError);
  EXPECT_TRUE(a.slice(0, std::nullopt, std::nullopt, 2).try_view({2, 2, 2}).has_value());
  EXPECT_EQ(a.reshape({-1}).shape(), (Shape{12}));
  EXPECT_THROW(a.reshape({5, -1}), ValueError);
}

TEST(Array, BadShapesAndIndices) {
  EXPECT_THROW(Array::empty({int64_t(1) << 40, int64_t(1) << 40}, DType::f32), ValueError);
  EXPECT_THROW(Array::empty({int64_t(1) << 62, 4}, DType::f64), ValueError);
  EXPECT_THROW(Array::empty({-1}, DType::f32), ValueError);
  Array a = iota(6);
  EXPECT_THROW(a.select(0, 6), IndexError);
  EXPECT_THROW(a.narrow(0, 4, 3), IndexError);
  EXPECT_THROW(a.transpose(0, 1), IndexError);
  EXPECT_THROW(a.as_strided({4}, {2}, 0), ValueError);
  EXPECT_THROW(a.slice(0, 0, 6, 0), ValueError);
  EXPECT_EQ(a.slice(0, 10, 20).numel(), 0);  // slices clamp
  EXPECT_THROW(broadcast_shapes({2, 3}, {4}), ValueError);
  EXPECT_THROW(Device::parse("cuda:x"), ValueError);
  EXPECT_THROW(Device::parse("gpu"), ValueError);
  EXPECT_THROW(dtype_from_name("float17"), TypeError);
}

TEST(Array, ErrorMessagesNameTheArgument) {
  try {
    add(iota(3), iota(4));
    FAIL();
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("(3,)"), std::string::npos) << m;
    EXPECT_NE(m.find("(4,)"), std::string::npos) << m;
  }
}

TEST(Array, ConversionsRoundToNearestEvenAndSaturate) {
  // 1 + 2^-8 is a tie between bf16 neighbours 1 and 1 + 2^-7: even is 1.
  EXPECT_EQ(float(bf16(1.0f + 0.00390625f)), 1.0f);
  EXPECT_EQ(float(bf16(1.0f + 3 * 0.00390625f)), 1.0f + 4 * 0.00390625f);
  EXPECT_EQ(float(f16(65520.0f)), INFINITY);  // rounds past the largest half
  EXPECT_EQ(float(f16(65519.0f)), 65504.0f);
  EXPECT_EQ(float(f8e4m3(1000.0f)), 448.0f);  // fp8 saturates
  EXPECT_EQ(float(f8e4m3(-INFINITY)), -448.0f);
  EXPECT_EQ(float(f8e5m2(1e6f)), 57344.0f);
  EXPECT_TRUE(std::isnan(float(f8e4m3(NAN))));
  EXPECT_EQ(float(f8e4m3(0.001953125f)), 0.001953125f);  // smallest subnormal
  EXPECT_EQ((convert<int8_t>(300.5f)), 127);
  EXPECT_EQ((convert<int8_t>(NAN)), 0);
  EXPECT_EQ((convert<int32_t>(-2.9)), -2);
}

TEST(Array, PromotionRules) {
  EXPECT_EQ(promote(DType::u8, DType::i8), DType::i16);
  EXPECT_EQ(promote(DType::i64, DType::u8), DType::i64);
  EXPECT_EQ(promote(DType::i32, DType::bf16), DType::bf16);
  EXPECT_EQ(promote(DType::f16, DType::bf16), DType::f32);
  EXPECT_EQ(promote(DType::f8e4m3, DType::f8e5m2), DType::f16);
  EXPECT_EQ(promote(DType::b8, DType::i8), DType::i8);
  EXPECT_EQ(float_result(DType::i32), DType::f32);
  for (int i = 0; i < kNumDTypes; ++i)
    for (int j = 0; j < kNumDTypes; ++j) EXPECT_EQ(promote(DType(i), DType(j)), promote(DType(j), DType(i)));
}

TEST(Array, CopyIntoBroadcastsConvertsAndStaysInsideTheView) {
  Array frame = full({6, 8}, Scalar::of(-1.0), DType::f32, Device::cpu());
  Array dst = frame.slice(0, 1, 5, 2).slice(1, 1, 7, 3);  // (2, 2), strided
  copy_into(dst, iota(2, DType::i32));
  std::vector<double> v = to_vec(frame);
  int written = 0;
  for (double x : v) written += x != -1.0;
  EXPECT_EQ(written, 4);  // values 0, 1, 0, 1 at (1,1) (1,4) (3,1) (3,4)
  EXPECT_EQ(v[1 * 8 + 1], 0);
  EXPECT_EQ(v[1 * 8 + 4], 1);
  EXPECT_EQ(v[3 * 8 + 4], 1);
  EXPECT_EQ(v[0], -1);
}

TEST(Array, CudaRoundTrip) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Array h = iota(1000, DType::bf16);
  Array d = h.to(Device::cuda(0));
  EXPECT_TRUE(d.device().is_cuda());
  Array back = mul(d, d).to(Device::cpu());
  std::vector<double> v = to_vec(back);
  float w = float(bf16(999.0f));
  EXPECT_EQ(v[999], double(float(bf16(w * w))));
  EXPECT_EQ(to_vec(d.slice(0, std::nullopt, std::nullopt, -3)).at(0), double(float(bf16(999.0f))));  // 1000 in bf16
  EXPECT_THROW(add(h, d), ValueError);
}
