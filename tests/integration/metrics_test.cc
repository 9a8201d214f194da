// /metrics of a real kvmem-server: after appends, recalls (unary
// and Session), a failed call and a deleted stream, the scrape holds per
// stream and global figures equal to what the test did and to the streams'
// own stats; streams beyond --metrics_max_streams are summed into
// stream="~other"; counters count from the server's start and never go
// down; every name the Grafana dashboard uses
// (deploy/grafana/metrics.txt) is served.

#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "client/cpp/kvmem_client.h"
#include "gtest/gtest.h"
#include "tests/metrics_scrape.h"
#include "tests/stream_model.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

namespace kvmem {
namespace {

using testing::Parse;
using testing::Scrape;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToOutgoing;

TEST(MetricsTest, ScrapeMatchesTheWorkDone) {
  testing::TempDir dir;
  ServerProcessOptions o;
  o.binary = KVMEM_SERVER_BINARY;
  o.data_dir = dir.path() + "/data";
  o.unix_socket = dir.path() + "/kvmem.sock";
  o.log_file = dir.path() + "/server.log";
  const std::string port_file = dir.path() + "/metrics.port";
  o.extra_args = {"--metrics_listen=127.0.0.1:0",
                  "--metrics_port_file=" + port_file,
                  "--metrics_max_streams=2"};
  ServerProcess server(o);
  std::string error;
  ASSERT_TRUE(server.Start(std::chrono::seconds(30), &error)) << error;
  int port = 0;
  std::ifstream(port_file) >> port;
  ASSERT_GT(port, 0);
  auto client = KvmemClient::Connect(server.target());

  // Streams a, b, c (c beyond the cap of 2), and d (deleted at the end).
  const TestGeometry g;
  const v1::StreamConfig config = testing::WireConfig(g, 32, 2, {1});
  std::mt19937_64 rng(5);
  const std::map<std::string, int> frames = {
      {"a", 10}, {"b", 6}, {"c", 8}, {"d", 4}};
  std::map<std::string, int> recalls;
  int unary = 0, session = 0;
  for (const auto& [id, n] : frames) {
    StreamModel m(g, 2, 32, {1});
    v1::OpenStreamResponse opened;
    ASSERT_TRUE(client->OpenStream(id, config, &opened).ok());
    std::vector<OutgoingFrame> batch;
    for (int f = 0; f < n; ++f)
      batch.push_back(ToOutgoing(m.AddFrame(rng, 8), f));
    v1::AppendFramesResponse resp;
    ASSERT_TRUE(client->AppendFrames(id, batch, &resp).ok());
    v1::RecallRequest q;
    q.set_stream_id(id);
    for (size_t i = 0; i < m.summary_dim(); ++i) q.add_query(0.5f);
    q.mutable_budget()->set_max_tokens(32);
    v1::RecallResponse r;
    for (int k = 0; k < n / 2; ++k, ++unary) {
      ASSERT_TRUE(client->Recall(q, &r).ok());
    }
    std::unique_ptr<SessionClient> s;
    ASSERT_TRUE(client->StartSession(id, nullptr, &s).ok());
    ASSERT_TRUE(s->Recall(q, &r).ok());
    ASSERT_TRUE(s->Finish().ok());
    ++session;
    recalls[id] = n / 2 + 1;
  }
  v1::RecallRequest unknown;
  unknown.set_stream_id("nope");
  v1::RecallResponse r;
  ASSERT_EQ(client->Recall(unknown, &r).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(client->DeleteStream("d").ok());

  // GetStreamStats seals a block an ack completed if its seal is still
  // queued (--seal_after_ack); the scrape, like ListStreams, shows blocks
  // as they stand. Settle them first, so both see the same blocks.
  for (const char* id : {"a", "b", "c"}) {
    v1::StreamStats settled;
    ASSERT_TRUE(client->GetStreamStats(id, &settled).ok());
  }
  const std::string text = Scrape(port);
  const auto m = Parse(text);
  auto at = [&](const std::string& key) {
    auto it = m.find(key);
    EXPECT_NE(it, m.end()) << key << " missing from /metrics";
    return it == m.end() ? -1.0 : it->second;
  };
  // Per stream: a and b have labels, c is "~other"; d is gone.
  for (const char* id : {"a", "b"}) {
    const std::string l = std::string("{stream=\"") + id + "\"}";
    EXPECT_EQ(at("kvmem_stream_frames_total" + l), frames.at(id));
    EXPECT_EQ(at("kvmem_stream_recalls_total" + l), recalls.at(id));
    v1::StreamStats st;
    ASSERT_TRUE(client->GetStreamStats(id, &st).ok());
    EXPECT_EQ(at("kvmem_stream_recalled_tokens_total" + l),
              st.recalled_tokens());
    EXPECT_EQ(at("kvmem_stream_demotions_total" + l), st.policy().demotions());
    EXPECT_EQ(at("kvmem_stream_index_rebuilds_total" + l),
              st.policy().rebuilds());
    double blocks = 0;
    for (const char* tier : {"warm", "cold", "degraded", "evicted"}) {
      blocks += at(std::string("kvmem_stream_blocks{stream=\"") + id +
                   "\",tier=\"" + tier + "\"}");
    }
    EXPECT_EQ(blocks, st.sealed_blocks()) << id;
    EXPECT_EQ(at(std::string("kvmem_stream_bytes{stream=\"") + id +
                 "\",tier=\"warm\"}"),
              st.warm().bytes());
  }
  EXPECT_EQ(at("kvmem_stream_frames_total{stream=\"~other\"}"), frames.at("c"));
  EXPECT_EQ(m.count("kvmem_stream_frames_total{stream=\"c\"}"), 0u);
  EXPECT_EQ(m.count("kvmem_stream_frames_total{stream=\"d\"}"), 0u);
  // Global counters keep the deleted stream's work.
  EXPECT_EQ(at("kvmem_frames_total"), 10 + 6 + 8 + 4);
  EXPECT_EQ(at("kvmem_recalls_total"), unary + session);
  EXPECT_EQ(at("kvmem_streams{state=\"open\"}"), 3);
  // Recall metadata over the streams held (a, b, c), as their stats say.
  double summaries = 0, codes = 0, indexes = 0;
  for (const char* id : {"a", "b", "c"}) {
    v1::StreamStats st;
    ASSERT_TRUE(client->GetStreamStats(id, &st).ok());
    summaries += static_cast<double>(st.summary_bytes());
    codes += static_cast<double>(st.token_code_bytes());
    indexes += static_cast<double>(st.index().bytes());
  }
  EXPECT_GT(summaries, 0);
  EXPECT_GT(indexes, 0);
  EXPECT_EQ(at("kvmem_metadata_bytes{kind=\"summaries\"}"), summaries);
  EXPECT_EQ(at("kvmem_metadata_bytes{kind=\"token_codes\"}"), codes);
  EXPECT_EQ(at("kvmem_metadata_bytes{kind=\"indexes\"}"), indexes);
  // Calls: recall latency by method, errors by method and code.
  EXPECT_EQ(at("kvmem_recall_latency_seconds_count{method=\"Recall\"}"),
            unary + 1);  // The NOT_FOUND one was timed too.
  EXPECT_EQ(at("kvmem_recall_latency_seconds_count{method=\"Session\"}"),
            session);
  EXPECT_EQ(at("kvmem_rpc_requests_total{method=\"Recall\"}"), unary + 1);
  EXPECT_EQ(at("kvmem_rpc_errors_total{code=\"NOT_FOUND\",method=\"Recall\"}"),
            1);
  EXPECT_EQ(at("kvmem_rpc_requests_total{method=\"AppendFrames\"}"), 4);
  EXPECT_EQ(
      m.count(
          "kvmem_rpc_errors_total{code=\"NOT_FOUND\",method=\"AppendFrames\"}"),
      0u);

  // Every metric the dashboard queries is served (a family is served when
  // a "# TYPE <name>" line is present).
  std::ifstream names(KVMEM_DASHBOARD_METRICS);
  ASSERT_TRUE(names.good()) << KVMEM_DASHBOARD_METRICS;
  std::string name;
  int checked = 0;
  while (std::getline(names, name)) {
    if (name.empty() || name[0] == '#') continue;
    ++checked;
    EXPECT_NE(text.find("# TYPE " + name + " "), std::string::npos)
        << name << " (deploy/grafana/metrics.txt) is not served";
  }
  EXPECT_GT(checked, 20);

  // Shared memory: an arena with a live lease, then released.
  Delivery held;
  ASSERT_TRUE(client->FetchShared("a", {0, 1}, {}, &held).ok());
  auto shm = Parse(Scrape(port));
  EXPECT_EQ(shm["kvmem_shm_arenas"], 1);
  EXPECT_EQ(shm["kvmem_shm_arena_bytes"], client->options().shm_arena_bytes);
  EXPECT_EQ(shm["kvmem_shm_leases"], 1);
  EXPECT_GE(shm["kvmem_shm_leased_bytes"], held.bytes());
  EXPECT_EQ(shm["kvmem_shm_reclaimed_leases_total"], 0);
  ASSERT_TRUE(held.Release().ok());
  EXPECT_EQ(Parse(Scrape(port))["kvmem_shm_leases"], 0);

  // Deleting the stream in "~other" takes nothing back from any counter.
  ASSERT_TRUE(client->DeleteStream("c").ok());
  auto after = Parse(Scrape(port));
  EXPECT_EQ(after["kvmem_stream_frames_total{stream=\"~other\"}"],
            frames.at("c"));
  EXPECT_EQ(after["kvmem_frames_total"], 10 + 6 + 8 + 4);
  EXPECT_EQ(after["kvmem_streams{state=\"open\"}"], 2);

  // After a restart counters start from zero (a counter reset), though the
  // recovered streams keep their frames; new work counts from there.
  client.reset();  // An idle channel would slow the graceful shutdown.
  EXPECT_EQ(server.Stop(), 0);
  ASSERT_TRUE(server.Start(std::chrono::seconds(30), &error)) << error;
  std::ifstream(port_file) >> port;
  client = KvmemClient::Connect(server.target());
  v1::StreamStats a_stats;
  ASSERT_TRUE(client->GetStreamStats("a", &a_stats).ok());
  EXPECT_EQ(a_stats.frames(), 10u);
  StreamModel more(g, 2, 32, {1});
  for (int f = 0; f < 10; ++f) more.AddFrame(rng, 8);
  std::vector<OutgoingFrame> two;
  for (int f = 10; f < 12; ++f) {
    OutgoingFrame o2 = ToOutgoing(more.AddFrame(rng, 8), f);
    o2.header.set_first_token_position(a_stats.next_token_position() +
                                       (f - 10) * 8);
    two.push_back(o2);
  }
  v1::AppendFramesResponse appended;
  ASSERT_TRUE(client->AppendFrames("a", two, &appended).ok());
  ASSERT_TRUE(client->GetStreamStats("a", &a_stats).ok());  // Settles seals.
  auto restarted = Parse(Scrape(port));
  EXPECT_EQ(restarted["kvmem_stream_frames_total{stream=\"a\"}"], 2);
  EXPECT_EQ(restarted["kvmem_frames_total"], 2);
  EXPECT_EQ(
      restarted["kvmem_stream_blocks{stream=\"a\",tier=\"warm\"}"] +
          restarted["kvmem_stream_blocks{stream=\"a\",tier=\"cold\"}"] +
          restarted["kvmem_stream_blocks{stream=\"a\",tier=\"degraded\"}"] +
          restarted["kvmem_stream_blocks{stream=\"a\",tier=\"evicted\"}"],
      6);  // Gauges: the state, not work since start.
  client.reset();
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace kvmem
