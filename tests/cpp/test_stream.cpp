// Streams and events: current stream, ordering between streams, timing.
#include <gtest/gtest.h>

#include <vector>

#include "gpukit/array.h"
#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "gpukit/stream.h"

using namespace gk;

#define NEED_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(Stream, CpuHasNone) {
  EXPECT_FALSE(resolve_stream(nullptr, Device::cpu()).valid());
  EXPECT_THROW(Event::create(Device::cpu()), ValueError);
  if (!built_with_cuda()) EXPECT_THROW(Stream::create(Device::cuda(0)), Error);
}

TEST(Stream, CurrentIsNotTheLegacyDefault) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  Stream cur = Stream::current(d);
  EXPECT_TRUE(cur.valid());
  EXPECT_NE(cur.handle(), nullptr);
  Stream s = Stream::create(d);
  Stream::set_current(s);
  EXPECT_EQ(Stream::current(d), s);
  Stream::set_current(cur);
  EXPECT_EQ(Stream::current(d), cur);
}

TEST(Stream, EventOrdersTwoStreams) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  Stream s1 = Stream::create(d), s2 = Stream::create(d);
  const int64_t n = 1 << 22;
  Array x = full({n}, Scalar::of(1.0), DType::f32, d, &s1);
  for (int i = 0; i < 20; ++i) x = add(x, x, &s1);  // 2^20 after the chain
  Event e = Event::create(d);
  e.record(s1);
  s2.wait(e);
  Array y = binary(BinaryOp::Add, x, Scalar::of(1.0), false, &s2);
  s2.synchronize();
  EXPECT_TRUE(e.query());
  Array h = y.to(Device::cpu());
  EXPECT_EQ(h.data_as<float>()[n - 1], 1048577.0f);
  EXPECT_TRUE(s1.query());
}

TEST(Stream, EventTiming) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  Stream s = Stream::create(d);
  Event a = Event::create(d), b = Event::create(d);
  EXPECT_THROW(a.elapsed_ms(b), ValueError);  // not recorded
  a.record(s);
  Array x = full({1 << 24}, Scalar::of(1.0), DType::f32, d, &s);
  x = unary(UnaryOp::Exp, x, &s);
  b.record(s);
  b.synchronize();
  float ms = a.elapsed_ms(b);
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);
  Event nt = Event::create(d, false);
  nt.record(s);
  EXPECT_THROW(a.elapsed_ms(nt), ValueError);
}

TEST(Stream, OpWithStreamOfAnotherDeviceFails) {
  NEED_CUDA();
  if (cuda_device_count() < 2) GTEST_SKIP() << "one GPU";
  Stream s1 = Stream::create(Device::cuda(1));
  Array x = full({4}, Scalar::of(1.0), DType::f32, Device::cuda(0));
  EXPECT_THROW(add(x, x, &s1), ValueError);
}
