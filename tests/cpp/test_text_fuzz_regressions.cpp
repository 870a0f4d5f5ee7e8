// Replays every input in fuzz/regressions/tokenizer through the fuzz harness, so
// each past fuzzer finding stays a regression test of the normal suite.
#define GK_FUZZ_NO_ABORT 1
#include "../../fuzz/fuzz_tokenizer.cpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

TEST(TextFuzzRegressions, ReplayAll) {
  namespace fs = std::filesystem;
#ifdef GPUKIT_SOURCE_DIR
  const fs::path root = GPUKIT_SOURCE_DIR;
#else
  const fs::path root = fs::path(__FILE__).parent_path().parent_path().parent_path();
#endif
  fs::path dir = root / "fuzz" / "regressions" / "tokenizer";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()), data.size())) << e.path();
    ++n;
  }
  EXPECT_GT(n, 0);
  // the seed corpus too
  for (auto& e : fs::directory_iterator(dir.parent_path().parent_path() / "corpus" / "tokenizer")) {
    std::ifstream f(e.path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()), data.size())) << e.path();
  }
}
