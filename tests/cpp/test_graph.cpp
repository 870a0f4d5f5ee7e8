// CUDA graphs: capture a sequence of ops, replay, results equal eager bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpukit/array.h"
#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "gpukit/stream.h"

using namespace gk;

namespace {
Array sequence(const Array& x, const Array& y, const Stream* s) {
  Array a = mul(x, y, s);
  Array b = unary(UnaryOp::GeluTanh, binary(BinaryOp::Add, a, Scalar::of(0.5), false, s), s);
  Array c = where(binary(BinaryOp::Gt, b, Scalar::of(0.0), false, s), b, unary(UnaryOp::Neg, y, s), s);
  return clamp(c, Scalar::of(-2.0), Scalar::of(2.0), s).astype(DType::bf16, s);
}
std::vector<uint16_t> host_bits(const Array& a) {
  Array h = a.to(Device::cpu());
  std::vector<uint16_t> v(size_t(h.numel()));
  std::memcpy(v.data(), h.data(), v.size() * 2);
  return v;
}
}  // namespace

TEST(Graph, ReplayEqualsEagerBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Device d = Device::cuda(0);
  Stream s = Stream::create(d);
  Array x = arange(-3, 3, 6.0 / 4099, DType::f32, d, &s);
  Array y = unary(UnaryOp::Cos, x, &s);
  std::vector<uint16_t> eager = host_bits(sequence(x, y, &s));
  Graph g = Graph::create(s);
  g.begin();
  Array out = sequence(x, y, &s);
  g.end();
  EXPECT_TRUE(g.captured());
  g.replay();
  s.synchronize();
  EXPECT_EQ(host_bits(out), eager);
  // change the input in place and replay
  copy_into(x, unary(UnaryOp::Sin, x, &s), &s);
  std::vector<uint16_t> eager2 = host_bits(sequence(x, y, &s));
  for (int i = 0; i < 3; ++i) g.replay(&s);
  s.synchronize();
  EXPECT_EQ(host_bits(out), eager2);
  EXPECT_NE(eager, eager2);
}

TEST(Graph, Misuse) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Stream s = Stream::create(Device::cuda(0));
  Graph g = Graph::create(s);
  EXPECT_THROW(g.replay(), ValueError);
  EXPECT_THROW(g.end(), ValueError);
  g.begin();
  EXPECT_THROW(g.begin(), ValueError);
  g.end();
  EXPECT_THROW(g.begin(), ValueError);
  EXPECT_THROW(Graph::create(Stream()), ValueError);
}
