// A stream outlives its server: real kvmem-servers on the RADOS store
// (--store=rados:kvmem, the test cluster KVMEM_CEPH_CONF names, each test
// under its own --rados_prefix). A server is killed with SIGKILL, during a
// quiet moment or in the middle of ingest; another server, with its own
// (empty) data directory, opens the same pool and serves every acknowledged
// frame byte-exact and the same recall sets. A paused owner (SIGSTOP) that
// wakes after a takeover is fenced by RADOS. A killed OSD does not stop
// ingest.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/kvmem_client.h"
#include "gtest/gtest.h"
#include "tests/distributed/ceph_env.h"
#include "tests/stream_model.h"
#include "tests/test_util.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

namespace kvmem {
namespace {

using testing::CephConf;

testing::TestGeometry Geometry() {
  testing::TestGeometry g;
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 8;
  return g;
}

class TakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CephConf().empty()) {
      GTEST_SKIP() << testing::kNoCephCluster;
    }
    prefix_ = testing::UniquePrefix("s");
    model_ = std::make_unique<testing::StreamModel>(
        Geometry(), 2, 8, std::vector<uint32_t>{0, 1});
    std::mt19937_64 rng(5);
    for (uint64_t i = 0; i < kFrames; ++i) {
      frames_.push_back(testing::ToOutgoing(model_->AddFrame(rng, 16), i));
    }
  }

  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (servers_[i] == nullptr) continue;
      servers_[i]->Stop();
      if (HasFailure()) {
        const std::string log = testing::ReadFile(Dir(i) + "/server.log");
        std::cerr << "server " << i << " log (last 3000 bytes):\n"
                  << log.substr(log.size() > 3000 ? log.size() - 3000 : 0);
      }
    }
  }

  std::string Dir(int i) { return absl::StrCat(dir_.path(), "/server", i); }

  // Server i on the shared pool, with a data directory of its own.
  std::unique_ptr<KvmemClient> Start(int i) {
    std::filesystem::create_directories(Dir(i));
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = Dir(i) + "/data";
    o.unix_socket = Dir(i) + "/kvmem.sock";
    o.log_file = Dir(i) + "/server.log";
    o.extra_args = {"--store=rados:kvmem", "--ceph_conf=" + CephConf(),
                    "--rados_prefix=" + prefix_, "--rados_timeout_ms=20000"};
    servers_[i] = std::make_unique<ServerProcess>(o);
    std::string error;
    if (!servers_[i]->Start(std::chrono::seconds(60), &error)) {
      ADD_FAILURE() << "server " << i << ": " << error;
      return nullptr;
    }
    return KvmemClient::Connect(servers_[i]->target());
  }

  void Open(KvmemClient& c) {
    v1::OpenStreamResponse opened;
    const grpc::Status s = c.OpenStream(
        "cam", testing::WireConfig(Geometry(), 8, 2, {0, 1}), &opened);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // Block ids of a few recalls, and the payloads of every sealed block.
  std::vector<std::vector<uint64_t>> Recalls(KvmemClient& c) {
    std::mt19937_64 rng(11);
    std::vector<std::vector<uint64_t>> out;
    for (int i = 0; i < 4; ++i) {
      v1::RecallRequest req;
      req.set_stream_id("cam");
      for (float x : testing::RandomQuery(rng, 2 * 2 * 8)) req.add_query(x);
      req.mutable_budget()->set_max_tokens(48);
      req.set_per_layer(i % 2 == 1);
      v1::RecallResponse resp;
      const grpc::Status s = c.Recall(req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      std::vector<uint64_t> ids;
      for (const auto& b : resp.blocks()) ids.push_back(b.block_id());
      for (const auto& set : resp.layer_sets()) {
        for (const auto& b : set.blocks()) ids.push_back(b.block_id());
      }
      out.push_back(ids);
    }
    return out;
  }

  // Every frame up to `acked` (exclusive) is served byte-exact: each
  // sealed block's payload is its frames' bytes, concatenated.
  void ExpectFrames(KvmemClient& c, uint64_t acked) {
    v1::StreamStats st;
    ASSERT_TRUE(c.GetStreamStats("cam", &st).ok());
    ASSERT_GE(st.last_durable_frame() + 1, static_cast<int64_t>(acked));
    const uint64_t blocks = acked / 2;  // Two frames per block.
    std::vector<uint64_t> ids;
    for (uint64_t b = 0; b < blocks; ++b) ids.push_back(b);
    std::vector<FetchedBlock> got;
    const grpc::Status s = c.FetchBlocks("cam", ids, &got);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(got.size(), ids.size());
    for (uint64_t b = 0; b < blocks; ++b) {
      EXPECT_EQ(got[b].payload,
                frames_[2 * b].payload + frames_[2 * b + 1].payload)
          << "block " << b;
    }
  }

  static constexpr uint64_t kFrames = 120;
  testing::TempDir dir_;
  std::string prefix_;
  std::unique_ptr<testing::StreamModel> model_;
  std::vector<OutgoingFrame> frames_;
  std::unique_ptr<ServerProcess> servers_[2];
};

// (a) of the issue, at a quiet moment: the same recall sets and every
// frame, from a server that never saw the stream.
TEST_F(TakeoverTest, AnotherServerServesTheStreamAfterAKill) {
  auto a = Start(0);
  ASSERT_NE(a, nullptr);
  Open(*a);
  v1::AppendFramesResponse resp;
  std::vector<OutgoingFrame> first(frames_.begin(), frames_.begin() + 80);
  ASSERT_TRUE(a->AppendFrames("cam", first, &resp).ok());
  const auto before = Recalls(*a);
  servers_[0]->Kill();
  servers_[0].reset();
  auto b = Start(1);
  ASSERT_NE(b, nullptr);
  ExpectFrames(*b, 80);
  EXPECT_EQ(Recalls(*b), before);
  // And it goes on from where the stream was.
  std::vector<OutgoingFrame> rest(frames_.begin() + 80, frames_.end());
  ASSERT_TRUE(b->AppendFrames("cam", rest, &resp).ok());
  ExpectFrames(*b, kFrames);
}

// (b): the owner paused (SIGSTOP) while another server takes the stream
// over; resumed (SIGCONT), its next append is refused (ABORTED: RADOS' own
// compare of the head's epoch) and changes nothing. No split brain, no
// acknowledged frame lost, and the new owner goes on.
TEST_F(TakeoverTest, APausedOwnerIsFencedWhenItWakes) {
  auto a = Start(0);
  ASSERT_NE(a, nullptr);
  Open(*a);
  v1::AppendFramesResponse resp;
  ASSERT_TRUE(
      a->AppendFrames("cam", {frames_.begin(), frames_.begin() + 40}, &resp)
          .ok());
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGSTOP), 0);
  auto b = Start(1);
  ASSERT_NE(b, nullptr);
  ExpectFrames(*b, 40);
  ASSERT_TRUE(b->AppendFrames(
                   "cam", {frames_.begin() + 40, frames_.begin() + 60}, &resp)
                  .ok());
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGCONT), 0);
  const grpc::Status refused = a->AppendFrames("cam", {frames_[40]}, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("newer store instance"),
            std::string::npos)
      << refused.error_message();
  ExpectFrames(*b, 60);
  ASSERT_TRUE(
      b->AppendFrames("cam", {frames_.begin() + 60, frames_.end()}, &resp)
          .ok());
  ExpectFrames(*b, kFrames);
}

// (a) during ingest: frames appended one by one while the owner is killed;
// every frame the client saw acknowledged is served by the next server.
TEST_F(TakeoverTest, EveryAcknowledgedFrameSurvivesAKillDuringIngest) {
  auto a = Start(0);
  ASSERT_NE(a, nullptr);
  Open(*a);
  std::atomic<uint64_t> acked{0};
  std::atomic<bool> failed{false};
  std::thread ingest([&] {
    for (uint64_t i = 0; i < kFrames && !failed; ++i) {
      v1::AppendFramesResponse r;
      if (!a->AppendFrames("cam", {frames_[i]}, &r).ok()) {
        failed = true;
        break;
      }
      acked = i + 1;
    }
  });
  while (acked < 30 && !failed) absl::SleepFor(absl::Milliseconds(5));
  servers_[0]->Kill();
  ingest.join();
  servers_[0].reset();
  ASSERT_GE(acked.load(), 30u);
  ASSERT_LT(acked.load(), kFrames) << "the kill came after all of ingest";
  auto b = Start(1);
  ASSERT_NE(b, nullptr);
  ExpectFrames(*b, acked.load() & ~uint64_t{1});
  v1::StreamStats st;
  ASSERT_TRUE(b->GetStreamStats("cam", &st).ok());
  EXPECT_GE(st.last_durable_frame() + 1, static_cast<int64_t>(acked.load()));
}

// (c): an OSD killed (SIGKILL) during ingest. With size 3 / min_size 2 the
// pool keeps taking writes: ingest goes on after a stall (the read lease,
// `osd pool default read lease ratio = 0.2` in the test cluster), every
// frame is acknowledged and served. The OSD is started again and the test
// waits for active+clean, so the next test finds a whole cluster.
TEST_F(TakeoverTest, IngestGoesOnWhenAnOsdDies) {
  const std::string cluster =
      std::filesystem::path(CephConf()).parent_path().string();
  const std::string script = KVMEM_CEPH_SCRIPT;
  auto a = Start(0);
  ASSERT_NE(a, nullptr);
  Open(*a);
  std::atomic<uint64_t> acked{0};
  std::atomic<int64_t> longest_us{0};
  grpc::Status failure;
  std::thread ingest([&] {
    for (uint64_t i = 0; i < kFrames; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      v1::AppendFramesResponse r;
      failure = a->AppendFrames("cam", {frames_[i]}, &r);
      if (!failure.ok()) break;
      const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
      if (us > longest_us) longest_us = us;
      acked = i + 1;
      absl::SleepFor(absl::Milliseconds(20));  // A camera's pace, roughly.
    }
  });
  while (acked < 20 && failure.ok()) absl::SleepFor(absl::Milliseconds(5));
  const int killed =
      std::system(("bash " + script + " kill-osd " + cluster + " 1").c_str());
  ingest.join();
  EXPECT_EQ(killed, 0);
  EXPECT_TRUE(failure.ok()) << failure.error_message();
  EXPECT_EQ(acked.load(), kFrames);
  std::cout << "longest append with an OSD killed: " << longest_us.load() / 1000
            << " ms\n";
  ExpectFrames(*a, kFrames);
  EXPECT_EQ(std::system(("bash " + script + " start-osd " + cluster + " 1 && " +
                         "bash " + script + " wait-clean " + cluster + " 120")
                            .c_str()),
            0);
}

}  // namespace
}  // namespace kvmem
