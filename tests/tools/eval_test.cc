// The evaluation harness: its oracle against a direct computation, and what
// the policies must score on small workloads (full KV is exact; a sliding
// window cannot re-identify an object whose earlier visit left it).
#include "tools/eval/eval.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/eval_fixture.h"
#include "tools/eval/eval_metrics.h"

namespace kvmem {
namespace {

// engine/recall/query_reduction.h's kMaxScoredVectors: a whole-frame cell
// sends more, so the reduction runs.
constexpr uint32_t kMaxScoredVectorsForTests = 16;

TEST(EvalOracleTest, MatchesDirectSoftmaxAttention) {
  const uint32_t heads = 2, d = 4, n = 5;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  CameraTokens cam;
  cam.tokens = n;
  cam.per_token = heads * d;
  for (uint32_t i = 0; i < n * heads * d; ++i) {
    cam.keys.push_back(g(rng));
    cam.values.push_back(g(rng));
  }
  std::vector<float> q(heads * d);
  for (auto& x : q) x = 2 * g(rng);
  std::vector<std::vector<float>> probs;
  std::vector<std::vector<double>> outs;
  OracleAttention(cam, n, {q}, heads, d, &probs, &outs);
  for (uint32_t h = 0; h < heads; ++h) {
    // Direct: logits q.k / sqrt(d), softmax, weighted sum of values.
    std::vector<double> logit(n);
    double mx = -1e300, sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
      double s = 0;
      for (uint32_t j = 0; j < d; ++j)
        s += double(q[h * d + j]) * cam.keys[i * heads * d + h * d + j];
      logit[i] = s / std::sqrt(double(d));
      mx = std::max(mx, logit[i]);
    }
    for (auto& l : logit) sum += std::exp(l - mx);
    std::vector<double> out(d, 0.0);
    for (uint32_t i = 0; i < n; ++i) {
      const double p = std::exp(logit[i] - mx) / sum;
      EXPECT_NEAR(probs[h][i], p, 1e-6) << "head " << h << " token " << i;
      for (uint32_t j = 0; j < d; ++j)
        out[j] += p * cam.values[i * heads * d + h * d + j];
    }
    for (uint32_t j = 0; j < d; ++j) EXPECT_NEAR(outs[h][j], out[j], 1e-5);
  }
}

// With an int8 camera, the recalled tokens' weights are their int8 keys'
// logits under the full softmax's normaliser and their values the int8
// ones; the sinks and the window stay exact. Against a direct computation.
TEST(EvalOracleTest, Int8OutputsMatchADirectComputation) {
  const uint32_t d = 4, n = 8;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  CameraTokens cam;
  cam.tokens = n;
  cam.per_token = d;
  for (uint32_t i = 0; i < n * d; ++i) {
    cam.keys.push_back(g(rng));
    cam.values.push_back(g(rng));
  }
  CameraTokens int8 = cam;
  for (float& x : int8.keys) x += 0.05f * g(rng);
  for (float& x : int8.values) x += 0.05f * g(rng);
  std::vector<float> q(d);
  for (auto& x : q) x = 2 * g(rng);
  QueryTruth t;
  t.query_heads = 1;
  t.head_dim = d;
  const std::vector<std::vector<float>> q_heads = {q};
  t.q_heads = &q_heads;
  OracleAttention(cam, n, q_heads, 1, d, &t.probs, &t.outs);
  // Window: tokens 6 and 7; recalled: 1 and 2.
  t.base_mass = {t.probs[0][6] + t.probs[0][7]};
  t.base_out.assign(1, std::vector<double>(d, 0.0));
  for (uint32_t i : {6u, 7u})
    for (uint32_t j = 0; j < d; ++j)
      t.base_out[0][j] += t.probs[0][i] * cam.values[i * d + j];
  Selection sel;
  sel.recalled = {{1, 3}};
  QueryRow row;
  ScoreOutputs(t, cam, &int8, nullptr, sel, &row);
  auto logit = [&](const CameraTokens& c, uint32_t i) {
    double s = 0;
    for (uint32_t j = 0; j < d; ++j) s += double(q[j]) * c.keys[i * d + j];
    return s / std::sqrt(double(d));
  };
  double lse = 0;
  for (uint32_t i = 0; i < n; ++i) lse += std::exp(logit(cam, i));
  lse = std::log(lse);
  auto rel_error = [&](const CameraTokens& c) {
    std::vector<double> y(d, 0.0);
    double m = 0;
    for (uint32_t i : {1u, 2u, 6u, 7u}) {
      const bool window = i >= 6;
      const double w = std::exp(logit(window ? cam : c, i) - lse);
      m += w;
      for (uint32_t j = 0; j < d; ++j)
        y[j] += w * (window ? cam : c).values[i * d + j];
    }
    double diff = 0, norm = 0;
    for (uint32_t j = 0; j < d; ++j) {
      diff += std::pow(y[j] / m - t.outs[0][j], 2);
      norm += t.outs[0][j] * t.outs[0][j];
    }
    return std::sqrt(diff / norm);
  };
  EXPECT_NEAR(row.rel_error, rel_error(cam), 1e-5);
  EXPECT_NEAR(row.int8_rel_error, rel_error(int8), 1e-5);
  EXPECT_NE(row.int8_rel_error, row.rel_error);
  EXPECT_EQ(row.int4_rel_error, row.rel_error);  // No int4 tier given.
  ScoreOutputs(t, cam, &cam, &int8, sel, &row);  // An exact int8 tier.
  EXPECT_NEAR(row.int8_rel_error, row.rel_error, 1e-6);
  EXPECT_NEAR(row.int4_rel_error, rel_error(int8), 1e-5);
}

using testing::SmallEval;

const PolicySummary& Policy(const EvalResult& r, const std::string& name) {
  return testing::PolicyOf(r, name);
}

TEST(EvalTest, FullKvIsExactAndEveryPolicyReportsMetrics) {
  auto r = RunEval(SmallEval());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->configs.size(), 1u);
  EXPECT_EQ(r->policy_names, (std::vector<std::string>{
                                 "full", "streaming_llm", "window_lru", "h2o",
                                 "mean_key_topk", "kvmem", "kvmem_summed",
                                 "oracle_tokens", "exact_keys_per_head"}));
  const PolicySummary& full = Policy(*r, "full");
  EXPECT_GT(full.queries, 200u);
  EXPECT_NEAR(full.mass_recalled, 1.0, 1e-5);
  EXPECT_NEAR(full.output_cosine, 1.0, 1e-6);
  EXPECT_NEAR(full.output_rel_error, 0.0, 1e-6);
  EXPECT_NEAR(full.cold_mass_recalled, 1.0, 1e-5);
  // An int8 cold tier: full KV reads nothing from it; kvmem's recalled
  // tokens read from it move its output a little.
  EXPECT_EQ(full.int8_output_rel_error, full.output_rel_error);
  const PolicySummary& k = Policy(*r, "kvmem");
  EXPECT_NE(k.int8_output_rel_error, k.output_rel_error);
  EXPECT_LT(k.int8_output_rel_error, 1.2 * k.output_rel_error);
  EXPECT_NE(k.int4_output_rel_error, k.int8_output_rel_error);
  // Bounded policies never hold more than sinks + W + R tokens.
  const uint64_t bpt = 1 * 2 * 2 * 32 * 2;
  for (const char* name :
       {"streaming_llm", "window_lru", "h2o", "mean_key_topk", "kvmem"}) {
    const PolicySummary& p = Policy(*r, name);
    EXPECT_EQ(p.queries, full.queries) << name;
    EXPECT_LE(p.resident_bytes_peak, (4 + 256 + 77) * bpt) << name;
    EXPECT_LT(p.mass_recalled, 1.0) << name;
    EXPECT_GT(p.output_cosine, 0.5) << name;
    EXPECT_LE(p.injected_tokens_mean, 77.0) << name;
  }
  EXPECT_GT(full.stored_bytes_peak,
            Policy(*r, "streaming_llm").stored_bytes_peak);
  EXPECT_GT(r->rebuild_periods, 0.0);
}

TEST(EvalTest, StreamingLlmCannotReidentifyAfterAGapBeyondItsWindow) {
  EvalOptions o = SmallEval();
  // Every absence lasts 100-110 s (300+ frames, 4800+ tokens): far beyond
  // W + R = 333 tokens. Visits are short.
  o.workload.frames = 420;
  o.workload.gap_min_s = 100;
  o.workload.gap_max_s = 110;
  o.workload.visit_min_s = 2;
  o.workload.visit_max_s = 4;
  auto r = RunEval(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const PolicySummary& s = Policy(*r, "streaming_llm");
  ASSERT_GT(s.reid_probes, 0u);
  EXPECT_EQ(s.reid_success, 0.0);
  EXPECT_EQ(Policy(*r, "full").reid_success, 1.0);
  EXPECT_GT(Policy(*r, "kvmem").reid_success, 0.5);
}

TEST(EvalTest, ReferencesBoundEverySharedSet) {
  // oracle_tokens takes the R cold tokens of most attention: no set of R
  // tokens shared by every head holds more. With one query head per KV
  // head, the query kvmem receives is the oracle's, so exact_keys_per_head
  // picks the same tokens.
  auto r = RunEval(SmallEval());
  ASSERT_TRUE(r.ok()) << r.status();
  const PolicySummary& oracle = Policy(*r, "oracle_tokens");
  EXPECT_NEAR(Policy(*r, "exact_keys_per_head").cold_mass_recalled,
              oracle.cold_mass_recalled, 1e-6);
  for (const auto& p : r->configs[r->primary].policies) {
    if (p.name == "full" || p.name == "kvmem_per_head") continue;
    EXPECT_LE(p.cold_mass_recalled, oracle.cold_mass_recalled + 1e-6) << p.name;
  }
  // A set per head can hold more than any shared set.
  EXPECT_GE(r->oracle_per_head_cold_mass, r->oracle_shared_cold_mass);
  EXPECT_NEAR(r->oracle_shared_cold_mass, oracle.cold_mass_recalled, 1e-6);
  // kvmem keeps its budget and its window, and its gates are reported.
  const PolicySummary& k = Policy(*r, "kvmem");
  EXPECT_EQ(k.budget_violations, 0u);
  EXPECT_EQ(k.window_violations, 0u);
  EXPECT_GT(k.gated_output_cosine, 0.5);
  EXPECT_GT(k.estimated_mass, 0.0);
  EXPECT_LE(k.budget_used, 1.0);
}

// Whole-frame queries carry every read token's query heads, a re-entry
// frame's query is its object's probe (the object in view); textures take
// their patches in every frame; bad knobs are refused.
TEST(VideoWorkloadTest, WholeFrameQueriesTexturesAndAppearance) {
  VideoWorkloadOptions w = SmallEval().workload;
  w.frame_query_tokens = 8;
  w.query_heads_per_kv = 2;
  w.textures = 3;
  w.texture_tokens = 2;
  w.appearance_change = 1.0f;
  ASSERT_EQ(CheckVideoWorkloadOptions(w), "");
  const VideoWorkload wl(w);
  EXPECT_EQ(wl.query_vectors(), 16u);
  uint64_t probes = 0, frames = 0;
  for (uint64_t f = 0; f < w.frames; ++f) {
    const WorkloadFrame fr = wl.Frame(0, f);
    EXPECT_EQ(std::count_if(fr.token_texture.begin(), fr.token_texture.end(),
                            [](int t) { return t >= 0; }),
              2);
    for (const WorkloadQuery& q : wl.Queries(0, f, fr)) {
      EXPECT_EQ(q.q_heads.size(), 16u);
      (q.kind == QueryKind::kProbe ? probes : frames)++;
      if (q.kind == QueryKind::kProbe) {
        EXPECT_FALSE(q.earlier.empty());
        EXPECT_NE(
            std::find(fr.token_object.begin(), fr.token_object.end(), q.object),
            fr.token_object.end());
      }
    }
  }
  EXPECT_GT(probes, 0u);
  EXPECT_GT(frames, w.frames / 2);
  // Too many vectors, or textures without patches, are refused.
  w.frame_query_tokens = w.tokens_per_frame + 1;
  EXPECT_NE(CheckVideoWorkloadOptions(w), "");
  w.frame_query_tokens = 8;
  w.texture_tokens = 0;
  EXPECT_NE(CheckVideoWorkloadOptions(w), "");
}

TEST(EvalMatrixTest, CellsChangeOnePropertyAndReportEveryPolicy) {
  EvalOptions base = SmallEval();
  base.workload.frames = 120;
  std::vector<MatrixCell> cells = MatrixCells(base);
  ASSERT_GE(cells.size(), 14u);
  EXPECT_EQ(cells[0].name, "base");
  // Every cell but the last differs from the base in its workload alone.
  for (const MatrixCell& c : cells) {
    EXPECT_EQ(c.options.window, base.window) << c.name;
    EXPECT_EQ(c.options.recall_fractions,
              std::vector<double>{base.primary_fraction});
  }
  EXPECT_EQ(cells[4].name, "gqa_4x32");
  EXPECT_EQ(cells[4].options.workload.query_heads_per_kv, 4u);
  // The cells of the recall issue's properties, and the channel settings
  // (the mass-vs-re-ID plot) and the mean-query client in every cell.
  auto cell = [&](const std::string& name) -> const MatrixCell* {
    for (const MatrixCell& c : cells)
      if (c.name == name) return &c;
    return nullptr;
  };
  for (const char* name : {"peaked_tokens", "whole_frame",
                           "lookalike_attention", "whole_frame_128"}) {
    ASSERT_NE(cell(name), nullptr) << name;
  }
  EXPECT_GT(cell("peaked_tokens")->options.workload.texture_tokens, 0u);
  EXPECT_EQ(cell("whole_frame")->options.workload.frame_query_tokens, 32u);
  EXPECT_GT(cell("lookalike_attention")->options.workload.appearance_change,
            0.0f);
  EXPECT_GT(cell("whole_frame_128")->options.workload.frame_query_tokens,
            kMaxScoredVectorsForTests);
  for (const MatrixCell& c : cells) {
    for (const char* v :
         {"kvmem_attention_only", "kvmem_identity_only", "kvmem_mean_query"}) {
      EXPECT_TRUE(std::any_of(c.options.kvmem_variants.begin(),
                              c.options.kvmem_variants.end(),
                              [&](const auto& x) { return x.first == v; }))
          << c.name << " " << v;
    }
  }
  // Two cells through the runner: one table row and JSON summary each.
  const std::vector<MatrixCell> two = {cells[0], cells[4]};
  auto m = RunEvalMatrix(two, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->summaries.size(), 2u);
  const std::string table = MatrixTable(*m), json = MatrixJson(*m);
  EXPECT_NE(table.find("| base |"), std::string::npos) << table;
  EXPECT_NE(table.find("| gqa_4x32 |"), std::string::npos) << table;
  EXPECT_NE(json.find("\"summary\""), std::string::npos);
  EXPECT_NE(json.find("\"kvmem_vs_exact_keys_per_head\""), std::string::npos);
  EXPECT_NE(json.find("\"met_vs_oracle\""), std::string::npos);
  EXPECT_NE(json.find("\"reid_goal\""), std::string::npos);
  EXPECT_NE(json.find("\"met_mean_query_within_5_points\""), std::string::npos);
  // The GQA cell also runs kvmem with each group's mean query.
  EXPECT_TRUE(std::any_of(
      m->summaries[1].policies.begin(), m->summaries[1].policies.end(),
      [](const PolicySummary& p) { return p.name == "kvmem_group_mean"; }));
  for (const ConfigSummary& c : m->summaries) {
    for (const auto& p : c.policies) {
      EXPECT_EQ(p.budget_violations + p.window_violations, 0u) << p.name;
    }
  }
}

}  // namespace
}  // namespace kvmem
