// The token stage's lanes kernels (engine/recall/token_lanes.h), each the
// CPU can run, against TokenDensities, the path they replace, on random
// codes: bit for bit where the head range is a multiple of 8 heads and the
// avx2 kernels run (the same operations in the same order), to float
// rounding elsewhere; every group size around their 8 and 16 lanes,
// records scattered, with and without the identity channel's mean vector,
// head_dim 32 to 256, 1 to 17 vectors.
#include "engine/recall/token_lanes.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/recall/fast_exp.h"
#include "engine/recall/token_stage.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

MassEstimate Estimate(std::mt19937_64& rng, uint32_t heads, uint32_t vectors) {
  MassEstimate est;
  est.heads = heads;
  est.vectors = vectors;
  std::normal_distribution<float> lse(6.0f, 1.5f);
  for (size_t i = 0; i < size_t{vectors} * heads; ++i) {
    est.log_norm.push_back(lse(rng));
  }
  return est;
}

// The exp kernel's densities are the avx2 kernel's ("avx512" uses them).
bool AvxDensities() {
  const std::string& name = ActiveExpKernel().name;
  return name == "avx2" || name == "avx512";
}

struct Case {
  uint32_t heads, head_dim, vectors, h0, h1;
};

// The lanes kernels this CPU can run, best first.
std::vector<std::string> LaneKernels() {
  const std::string had = LaneTokenKernel();
  std::vector<std::string> names;
  for (const char* name : {"avx512vnni", "avx2"}) {
    if (SelectLaneTokenKernel(name)) names.push_back(name);
  }
  EXPECT_TRUE(SelectLaneTokenKernel(had));
  return names;
}

// The lanes kernel `name` on while it lives, the one before after.
class LaneKernelOn {
 public:
  explicit LaneKernelOn(const std::string& name) : had_(LaneTokenKernel()) {
    EXPECT_TRUE(SelectLaneTokenKernel(name));
  }
  ~LaneKernelOn() { EXPECT_TRUE(SelectLaneTokenKernel(had_)); }

 private:
  std::string had_;
};

void ExpectTheTokenStagesDensities();

TEST(TokenLanesTest, EqualsTheTokenStagesDensities) {
  const std::vector<std::string> kernels = LaneKernels();
  if (kernels.empty()) {
    GTEST_SKIP() << "this CPU lacks AVX2 + FMA: the token stage scores "
                    "through TokenDensities alone";
  }
  // The best kernel is the default.
  EXPECT_EQ(LaneTokenKernel(), kernels.front());
  for (const std::string& name : kernels) {
    SCOPED_TRACE(name);
    LaneKernelOn on(name);
    std::printf("token lanes %s, token kernel %s, exp kernel %s\n",
                LaneTokenKernel().c_str(), ActiveTokenKernel().name.c_str(),
                ActiveExpKernel().name.c_str());
    ExpectTheTokenStagesDensities();
  }
}

void ExpectTheTokenStagesDensities() {
  const Case cases[] = {{8, 64, 8, 0, 8},   {8, 64, 1, 0, 8},
                        {8, 128, 3, 0, 8},  {16, 64, 17, 8, 16},
                        {6, 32, 3, 0, 6},   {8, 64, 8, 3, 4},
                        {16, 96, 2, 0, 16}, {4, 256, 8, 0, 4}};
  int bitwise = 0;
  for (const Case& c : cases) {
    std::mt19937_64 rng(c.heads * 1000 + c.head_dim + c.vectors + c.h0);
    const TokenCodeShape shape{c.heads, c.head_dim};
    const size_t pool = 200;
    const std::vector<float> keys =
        testing::RandomNormal(rng, pool * c.heads * c.head_dim, 1.0f);
    const std::vector<float> query = testing::RandomNormal(
        rng, size_t{c.vectors} * c.heads * c.head_dim, 2.0f);
    const std::string codes = EncodeTokenCodes(shape, keys.data(), pool);
    TokenQuery q;
    PrepareTokenQuery(shape, query.data(), c.vectors, &q);
    const MassEstimate est = Estimate(rng, c.heads, c.vectors);
    const MassEstimate mean_est = Estimate(rng, c.heads, 1);
    std::vector<float> weight(c.vectors);
    for (float& w : weight) w = 0.5f + static_cast<float>(rng() % 100) / 100;
    const float logit_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (const bool mean : {false, true}) {
      DensityTerms terms;
      PrepareDensityTerms(est, c.h0, c.h1, logit_scale,
                          mean ? &mean_est : nullptr,
                          mean ? weight.data() : nullptr, &terms);
      TokenStageInput in;
      in.query = &q;
      in.est = &est;
      in.h0 = c.h0;
      in.h1 = c.h1;
      in.logit_scale = logit_scale;
      in.terms = &terms;
      if (mean) {
        in.mean_est = &mean_est;
        in.weight = weight.data();
      }
      for (const size_t n : {1, 7, 8, 9, 15, 16, 17, 33, 120}) {
        // n records at random places of the codes.
        std::vector<const uint8_t*> rec(n);
        for (const uint8_t*& r : rec) {
          r = reinterpret_cast<const uint8_t*>(codes.data()) +
              (rng() % pool) * shape.bytes_per_token();
        }
        std::vector<float> got(n, -1.0f), got_mean(n, -1.0f);
        ASSERT_TRUE(LaneTokenDensities(shape, q, terms, rec.data(), n,
                                       got.data(),
                                       mean ? got_mean.data() : nullptr));
        const bool same_ops = (c.h1 - c.h0) % 8 == 0 &&
                              ActiveTokenKernel().name == "avx2" &&
                              AvxDensities();
        for (size_t k = 0; k < n; ++k) {
          float want = 0, want_mean = 0;
          TokenDensities(shape, in, rec[k], 1, &want,
                         mean ? &want_mean : nullptr);
          if (same_ops) {
            ASSERT_EQ(got[k], want) << c.heads << "x" << c.head_dim << " "
                                    << c.vectors << " vectors, token " << k;
            if (mean) {
              ASSERT_EQ(got_mean[k], want_mean) << "token " << k;
            }
            ++bitwise;
          } else {
            ASSERT_NEAR(got[k], want, 1e-5f * want) << "token " << k;
            if (mean) {
              ASSERT_NEAR(got_mean[k], want_mean, 1e-5f * want_mean)
                  << "token " << k;
            }
          }
          ASSERT_GT(got[k], 0.0f);
        }
      }
    }
  }
  if (ActiveTokenKernel().name == "avx2" && AvxDensities()) {
    EXPECT_GT(bitwise, 0);
  }
}

// The largest products a code and a query byte make (every code 15 or 1,
// every query byte +-127): the AVX2 kernel's int16 pair sums stay exact,
// so the densities are TokenDensities'.
TEST(TokenLanesTest, ExtremeCodesAndQueriesSumExactly) {
  const std::vector<std::string> kernels = LaneKernels();
  if (kernels.empty()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  for (const uint32_t head_dim : {64u, 256u}) {
    const TokenCodeShape shape{8, head_dim};
    const size_t pool = 9;
    std::vector<float> keys(pool * 8 * head_dim);
    for (size_t i = 0; i < keys.size(); ++i) {
      keys[i] = (i / (8 * head_dim)) % 2 == 0 ? 1.0f : -1.0f;  // 15 or 1.
    }
    const std::string codes = EncodeTokenCodes(shape, keys.data(), pool);
    std::vector<float> query(2 * 8 * head_dim, 1.0f);
    for (size_t i = 8 * head_dim; i < query.size(); ++i) query[i] = -1.0f;
    TokenQuery q;
    PrepareTokenQuery(shape, query.data(), 2, &q);
    ASSERT_EQ(q.q[0], 127);
    MassEstimate est;
    est.heads = 8;
    est.vectors = 2;
    est.log_norm.assign(16, 30.0f);
    const float logit_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    DensityTerms terms;
    PrepareDensityTerms(est, 0, 8, logit_scale, nullptr, nullptr, &terms);
    TokenStageInput in;
    in.query = &q;
    in.est = &est;
    in.h0 = 0;
    in.h1 = 8;
    in.logit_scale = logit_scale;
    in.terms = &terms;
    std::vector<const uint8_t*> rec(pool);
    for (size_t k = 0; k < pool; ++k) {
      rec[k] = reinterpret_cast<const uint8_t*>(codes.data()) +
               k * shape.bytes_per_token();
    }
    std::vector<float> want(pool);
    TokenDensities(shape, in, rec[0], pool, want.data());
    for (const std::string& name : kernels) {
      LaneKernelOn on(name);
      std::vector<float> got(pool, -1.0f);
      ASSERT_TRUE(LaneTokenDensities(shape, q, terms, rec.data(), pool,
                                     got.data(), nullptr));
      for (size_t k = 0; k < pool; ++k) {
        ASSERT_NEAR(got[k], want[k], 1e-5f * want[k])
            << name << " head_dim " << head_dim << " token " << k;
        ASSERT_GT(got[k], 0.0f);
      }
    }
  }
}

// Off, it scores nothing and says so: the token stage then scores through
// TokenDensities.
TEST(TokenLanesTest, OffLeavesTheWorkToTokenDensities) {
  const std::string had = LaneTokenKernel();
  ASSERT_TRUE(SelectLaneTokenKernel("off"));
  EXPECT_EQ(LaneTokenKernel(), "off");
  const TokenCodeShape shape{8, 64};
  const std::string codes(shape.bytes_per_token(), '\x88');
  const uint8_t* rec = reinterpret_cast<const uint8_t*>(codes.data());
  TokenQuery q;
  const std::vector<float> query(8 * 64, 1.0f);
  PrepareTokenQuery(shape, query.data(), 1, &q);
  MassEstimate est;
  est.heads = 8;
  est.vectors = 1;
  est.log_norm.assign(8, 1.0f);
  DensityTerms terms;
  PrepareDensityTerms(est, 0, 8, 0.125f, nullptr, nullptr, &terms);
  float out = -1.0f;
  EXPECT_FALSE(LaneTokenDensities(shape, q, terms, &rec, 1, &out, nullptr));
  EXPECT_EQ(out, -1.0f);
  EXPECT_FALSE(SelectLaneTokenKernel("no-such-kernel"));
  for (const std::string& name : LaneKernels()) {
    ASSERT_TRUE(SelectLaneTokenKernel(name));
    EXPECT_TRUE(LaneTokenDensities(shape, q, terms, &rec, 1, &out, nullptr));
    EXPECT_GT(out, 0.0f);
  }
  ASSERT_TRUE(SelectLaneTokenKernel(had));
}

}  // namespace
}  // namespace kvmem
