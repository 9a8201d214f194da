// Roofline arithmetic (the source article's numbers) and device profiles.
#include "tools/bench/roofline.h"

#include <filesystem>

#include "engine/accel/device_profile.h"
#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(RooflineTest, ReproducesTheArticlesSevenBillionArithmetic) {
  RooflineInput in;  // 32 layers, 8 KV heads, head_dim 128, fp16.
  in.fps = 3;
  in.tokens_per_frame = 128;
  in.context = 10000;
  const RooflineResult r = ComputeRoofline(in);
  EXPECT_EQ(r.kv_bytes_per_token, 131072u);
  EXPECT_EQ(r.kv_growth_bytes_per_s, 50331648.0);  // 48 MiB/s.
  EXPECT_EQ(r.full.bytes_per_step, 1310720000.0);
  // 4 * 32 layers * 32 query heads * 128 * 10000 tokens.
  EXPECT_EQ(r.full.flops_per_step, 4.0 * 32 * 32 * 128 * 10000);
  EXPECT_DOUBLE_EQ(r.full.intensity, 4.0);  // 2 * 32 / (8 * 2 bytes).
  EXPECT_EQ(r.ridge, 0.0);                  // No device given.
  EXPECT_FALSE(r.full.memory_bound);
  // kvmem attends to W + 30 % of W.
  EXPECT_EQ(r.recall_tokens, 614u);
  EXPECT_EQ(r.kvmem.tokens, 2048u + 614u);
  EXPECT_EQ(r.kvmem.bytes_per_step, (2048.0 + 614) * 131072);
}

TEST(RooflineTest, DeviceDecidesTheVerdictAndTimeUntilFull) {
  RooflineInput in;
  in.memory_bytes = 64.0 * (1ull << 30);
  in.bandwidth_bytes_per_s = 204.8e9;
  in.peak_flops = 42.5e12;
  const RooflineResult r = ComputeRoofline(in);
  EXPECT_NEAR(r.ridge, 42.5e12 / 204.8e9, 1e-9);
  EXPECT_TRUE(r.full.memory_bound);
  EXPECT_TRUE(r.kvmem.memory_bound);
  EXPECT_NEAR(r.seconds_until_full, 64.0 * (1ull << 30) / 50331648.0, 1e-6);
  EXPECT_NEAR(r.full.memory_time_s, 1310720000.0 / 204.8e9, 1e-12);
  // A device slower at math than at memory: compute-bound.
  in.peak_flops = 100e9;
  EXPECT_FALSE(ComputeRoofline(in).full.memory_bound);
  // A context shorter than W + R: kvmem attends to all of it.
  in.context = 1000;
  EXPECT_EQ(ComputeRoofline(in).kvmem.tokens, 1000u);
}

TEST(DeviceProfileTest, ParsesNumbersNamesAndComments) {
  auto p = ParseDeviceProfile(
      "# a board\nname = \"Board # 1\"  # its name\n\ndram_bandwidth_gbs = "
      "204.8 # datasheet\nmemory_gib=64\n",
      "test.toml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "Board # 1");
  EXPECT_EQ(p->Get("dram_bandwidth_gbs", 0), 204.8);
  EXPECT_EQ(p->Get("memory_gib", 0), 64);
  EXPECT_EQ(p->Get("absent", 7), 7);
  auto bad = ParseDeviceProfile("x = 1\ny = fast\n", "bad.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.toml:2"), std::string::npos)
      << bad.status();
  // Valid TOML, but not a number (or a name that is not a string).
  for (const char* text : {"x = 1\ny = \"fast\"\n", "x = 1\ny = [1, 2]\n",
                           "x = 1\nname = 3\n", "x = 1\n[y]\nz = 2\n"}) {
    auto wrong = ParseDeviceProfile(text, "bad.toml");
    ASSERT_FALSE(wrong.ok()) << text;
    EXPECT_NE(wrong.status().message().find("bad.toml:2: "), std::string::npos)
        << wrong.status();
  }
  EXPECT_EQ(LoadDeviceProfile("/nonexistent.toml").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DeviceProfileTest, ShippedProfilesParseAndCarryTheRooflineKeys) {
  const std::filesystem::path dir = KVMEM_PROFILES_DIR;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto p = LoadDeviceProfile(e.path().string());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE(p->name.empty()) << e.path();
    for (const char* key :
         {"memory_gib", "dram_bandwidth_gbs", "peak_fp16_tflops"}) {
      EXPECT_GT(p->Get(key, 0), 0) << e.path() << " " << key;
    }
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace kvmem
