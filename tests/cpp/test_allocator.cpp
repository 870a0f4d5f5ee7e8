// The caching allocator: reuse, stream ordering, byte limit, OOM then recovery.
#include <gtest/gtest.h>

#include "core/internal.h"
#include "gpukit/allocator.h"
#include "gpukit/array.h"
#include "gpukit/errors.h"
#include "gpukit/ops.h"

using namespace gk;

#define NEED_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(Allocator, SizeClasses) {
  EXPECT_EQ(round_size(0), 512u);
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(round_size((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(round_size((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(round_size(5u << 20), 6u << 20);
}

TEST(Allocator, CpuStatsTrackLiveBytes) {
  size_t before = allocator_stats(Device::cpu()).allocated;
  {
    Array a = Array::empty({1000}, DType::f64);
    EXPECT_GE(allocator_stats(Device::cpu()).allocated, before + 8000);
  }
  EXPECT_EQ(allocator_stats(Device::cpu()).allocated, before);
  EXPECT_THROW(set_memory_limit(Device::cpu(), 1), ValueError);
}

TEST(Allocator, DebugPoisonAndGuards) {
  detail::debug_check_guards();
  detail::debug_set_alloc_poison(0xAB);
  Array a = Array::empty({5}, DType::u8);
  detail::debug_set_alloc_poison(-1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.data_as<uint8_t>()[i], 0xAB);
  EXPECT_TRUE(detail::debug_check_guards().empty());
  a.data_as<uint8_t>()[5] = 0;  // one past the end: inside the guard, which the test owns
  EXPECT_EQ(detail::debug_check_guards().size(), 1u);
  a.data_as<uint8_t>()[5] = 0xAB;
  EXPECT_TRUE(detail::debug_check_guards().empty());
}

TEST(Allocator, ReuseOnTheSameStream) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  Stream s = Stream::create(d);
  void* p;
  {
    Array a = Array::empty({1 << 20}, DType::f32, d, &s);
    p = a.data();
  }
  AllocatorStats before = allocator_stats(d);
  Array b = Array::empty({1 << 20}, DType::f32, d, &s);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(allocator_stats(d).hits, before.hits + 1);
  Stream other = Stream::create(d);
  Array c = Array::empty({1 << 20}, DType::f32, d, &other);
  EXPECT_NE(c.data(), p);
}

TEST(Allocator, BlockUsedOnAnotherStreamWaitsForIt) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  Stream s1 = Stream::create(d), s2 = Stream::create(d);
  const int64_t n = 1 << 22;
  Array x = full({n}, Scalar::of(4.0), DType::f32, d, &s1);
  s1.synchronize();
  Array r = x;
  for (int i = 0; i < 50; ++i) r = unary(UnaryOp::Sqrt, add(r, r, &s2), &s2);  // s2 reads x
  void* p = x.data();
  x = Array();
  r = Array();  // the chain's intermediates too
  Array y = Array::empty({n}, DType::f32, d, &s1);
  // The block of x may come back only once s2 has finished with it.
  if (y.data() == p) EXPECT_TRUE(s2.query());
  s2.synchronize();
}

TEST(Allocator, LimitThenOomThenRecovery) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  synchronize(d);
  empty_cache(d);
  size_t base = allocator_stats(d).reserved;
  set_memory_limit(d, base + (64u << 20));
  {
    Array keep = Array::empty({32 << 20}, DType::u8, d);
    try {
      Array::empty({48 << 20}, DType::u8, d);
      ADD_FAILURE() << "no OutOfMemoryError";
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(e.requested, size_t(48) << 20);
      EXPECT_EQ(e.limit, base + (64u << 20));
      EXPECT_GE(e.in_use, size_t(32) << 20);
    }
  }
  Array big = Array::empty({56 << 20}, DType::u8, d);  // the cache is released to fit
  big = Array();
  set_memory_limit(d, 0);
  size_t total = device_properties(d).total_memory;
  EXPECT_THROW(Array::empty({int64_t(total) * 4}, DType::u8, d), OutOfMemoryError);
  Array ok = full({16}, Scalar::of(2.0), DType::f32, d);
  Array h = ok.to(Device::cpu());
  EXPECT_EQ(h.data_as<float>()[15], 2.0f);
}

TEST(Allocator, EmptyCacheReleasesReserved) {
  NEED_CUDA();
  Device d = Device::cuda(0);
  { Array a = Array::empty({64 << 20}, DType::u8, d); }
  synchronize(d);
  size_t r = allocator_stats(d).reserved;
  empty_cache(d);
  EXPECT_LT(allocator_stats(d).reserved, r);
}
