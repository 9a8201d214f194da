// Recorded traces (tools/eval/trace_workload.h): a trace written from the
// evaluation's own workload reads back frame for frame and query for query,
// and replays to the same figures as the workload itself; damaged traces
// are refused with the file, frame and field named.
#include "tools/eval/trace_workload.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "gtest/gtest.h"
#include "kvmem/v1/trace.pb.h"
#include "tests/eval_fixture.h"
#include "tests/test_util.h"
#include "tools/eval/video_workload.h"

namespace kvmem {
namespace {

using testing::PolicyOf;
using testing::SmallEval;

// Probes too: short visits and gaps within the run.
EvalOptions WithProbes() {
  EvalOptions o = SmallEval();
  o.workload.frames = 300;
  o.workload.gap_min_s = 20;
  o.workload.gap_max_s = 40;
  o.workload.visit_min_s = 2;
  o.workload.visit_max_s = 5;
  return o;
}

TEST(TraceWorkloadTest, ReadsBackWhatWasWritten) {
  testing::TempDir dir;
  EvalOptions o = WithProbes();
  o.workload.query_heads_per_kv = 2;
  o.workload.frame_query_tokens = 4;
  const VideoWorkload w(o.workload);
  ASSERT_TRUE(WriteTrace(w, 0, dir.path(), {{"k", "v"}}).ok());
  auto t = OpenTraceWorkload(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  const WorkloadSource& r = **t;
  EXPECT_EQ(r.options().frames, o.workload.frames);
  EXPECT_EQ(r.options().layers, o.workload.layers);
  EXPECT_EQ(r.query_vectors(), w.query_vectors());
  EXPECT_EQ(r.bytes_per_token(), w.bytes_per_token());
  uint64_t queries = 0, probes = 0;
  for (uint64_t f = 0; f < o.workload.frames; ++f) {
    const WorkloadFrame a = w.Frame(0, f), b = r.Frame(0, f);
    ASSERT_EQ(a.frame.header.SerializeAsString(),
              b.frame.header.SerializeAsString())
        << f;
    ASSERT_EQ(a.frame.payload, b.frame.payload) << f;
    ASSERT_EQ(a.token_object, b.token_object) << f;
    const auto qa = w.Queries(0, f, a), qb = r.Queries(0, f, b);
    ASSERT_EQ(qa.size(), qb.size()) << f;
    for (size_t i = 0; i < qa.size(); ++i) {
      EXPECT_EQ(qa[i].kind, qb[i].kind);
      EXPECT_EQ(qa[i].position, qb[i].position);
      EXPECT_EQ(qa[i].object, qb[i].object);
      EXPECT_EQ(qa[i].earlier, qb[i].earlier);
      EXPECT_EQ(qa[i].q_heads, qb[i].q_heads);
      EXPECT_EQ(qa[i].q, qb[i].q);  // The mean, computed the same way.
      EXPECT_EQ(qa[i].signals.SerializeAsString(),
                qb[i].signals.SerializeAsString());
      ++queries;
      probes += qa[i].kind == QueryKind::kProbe;
    }
  }
  EXPECT_GT(queries, 0u);
  EXPECT_GT(probes, 0u);
}

TEST(TraceWorkloadTest, ReplaysToTheWorkloadsOwnFigures) {
  testing::TempDir dir;
  EvalOptions o = WithProbes();
  ASSERT_TRUE(WriteTrace(VideoWorkload(o.workload), 0, dir.path(), {}).ok());
  auto direct = RunEval(o);
  ASSERT_TRUE(direct.ok()) << direct.status();
  auto t = OpenTraceWorkload(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EvalOptions ot = o;
  ot.source = std::move(*t);
  ot.workload = ot.source->options();
  ot.trace_dir = dir.path();
  auto replay = RunEval(ot);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->frame_queries, direct->frame_queries);
  EXPECT_EQ(replay->probe_queries, direct->probe_queries);
  ASSERT_GT(direct->probe_queries, 0u);
  for (const std::string& name : direct->policy_names) {
    const PolicySummary &a = PolicyOf(*direct, name),
                        &b = PolicyOf(*replay, name);
    EXPECT_EQ(a.cold_mass_recalled, b.cold_mass_recalled) << name;
    EXPECT_EQ(a.output_rel_error, b.output_rel_error) << name;
    EXPECT_EQ(a.reid_success, b.reid_success) << name;
    EXPECT_EQ(a.reid_probes, b.reid_probes) << name;
    EXPECT_EQ(a.injected_tokens_mean, b.injected_tokens_mean) << name;
  }
  EXPECT_GT(PolicyOf(*replay, "kvmem").cold_mass_recalled, 0.0);
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(TraceWorkloadTest, DamagedTracesAreRefusedWithTheirPlace) {
  testing::TempDir dir;
  EvalOptions o = SmallEval();
  o.workload.frames = 8;
  ASSERT_TRUE(WriteTrace(VideoWorkload(o.workload), 0, dir.path(), {}).ok());
  const std::string header = dir.path() + "/trace.json",
                    frames = dir.path() + "/frames.bin";
  const std::string json = Slurp(header), bin = Slurp(frames);
  auto expect = [&](absl::StatusCode code, const std::string& part) {
    auto t = OpenTraceWorkload(dir.path());
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), code) << t.status();
    EXPECT_NE(t.status().message().find(part), std::string::npos) << t.status();
  };
  Spit(frames, bin.substr(0, bin.size() - 10));
  expect(absl::StatusCode::kInvalidArgument, "frame 7 is truncated");
  Spit(frames, bin + "x");
  expect(absl::StatusCode::kInvalidArgument, "bytes after");
  std::string huge = bin;  // A first record "length" of 2^40 bytes.
  for (int i = 0; i < 8; ++i) huge[i] = i == 5 ? 1 : 0;
  Spit(frames, huge);
  expect(absl::StatusCode::kInvalidArgument, "frame 0 is truncated");
  // Rewrites frame 0's record after `edit`.
  auto edited = [&](const std::function<void(v1::TraceFrame*)>& edit) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | uint8_t(bin[i]);
    v1::TraceFrame tf;
    EXPECT_TRUE(tf.ParseFromString(bin.substr(8, len)));
    edit(&tf);
    const std::string rec = tf.SerializeAsString();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = char((rec.size() >> (8 * i)) & 0xff);
    Spit(frames, out + rec + bin.substr(8 + len));
  };
  edited([](v1::TraceFrame* tf) {
    tf->mutable_header()->set_first_token_position(5);
  });
  expect(absl::StatusCode::kInvalidArgument,
         "frame 0: header.first_token_position is 5");
  edited([](v1::TraceFrame* tf) {
    ASSERT_GT(tf->queries_size(), 0);
    tf->mutable_queries(0)->add_earlier(6);
    tf->mutable_queries(0)->add_earlier(3);
  });
  expect(absl::StatusCode::kInvalidArgument, "earlier pair 0 [6, 3)");
  Spit(frames, bin);
  std::string v2 = json;
  v2.replace(v2.find("\"version\": 1"), 12, "\"version\": 2");
  Spit(header, v2);
  expect(absl::StatusCode::kInvalidArgument, "version 2");
  std::string wide = json;
  wide.replace(wide.find("\"head_dim\": 32"), 14, "\"head_dim\": 16");
  Spit(header, wide);
  expect(absl::StatusCode::kInvalidArgument, "frame 0: payload is");
  Spit(header, "{\"format\": \"kvmem-trace\", \"bogus\": 1}");
  expect(absl::StatusCode::kInvalidArgument, "not a TraceHeader");
  std::filesystem::remove(header);
  expect(absl::StatusCode::kNotFound, "no trace at");
}

}  // namespace
}  // namespace kvmem
