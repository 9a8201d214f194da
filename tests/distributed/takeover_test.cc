// A stream outlives its server: real kvmem-servers on the RADOS store
// (--store=rados:kvmem, the test cluster KVMEM_CEPH_CONF names, each test
// under its own --rados_prefix). A server is killed with SIGKILL, during a
// quiet moment or in the middle of ingest; another server, with its own
// (empty) data directory, opens the same pool and serves every acknowledged
// frame byte-exact and the same recall sets. A paused owner (SIGSTOP) that
// wakes after a takeover is fenced by RADOS. A killed OSD does not stop
// ingest. With ownership through etcd (OwnershipTest: an etcd the test
// starts, servers on TCP with --etcd): a client at the wrong server ends up
// at the owner, a killed owner's streams are taken over once its lease
// expires (at once when its address refuses connections), a paused owner
// is not taken over before its lease expires, stops serving before its lease
// can expire and is fenced, and an etcd restart leaves owners their streams.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/kvmem_client.h"
#include "gtest/gtest.h"
#include "tests/distributed/ceph_env.h"
#include "tests/distributed/etcd_process.h"
#include "tests/metrics_scrape.h"
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

  // Server i on the shared pool, with a data directory of its own. With
  // etcd_: on TCP (its fixed port, advertised), owning streams through etcd.
  std::unique_ptr<KvmemClient> Start(int i, const ClientOptions& client = {}) {
    std::filesystem::create_directories(Dir(i));
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = Dir(i) + "/data";
    o.log_file = Dir(i) + "/server.log";
    o.extra_args = {"--store=rados:kvmem", "--ceph_conf=" + CephConf(),
                    "--rados_prefix=" + prefix_, "--rados_timeout_ms=20000"};
    o.extra_args.insert(o.extra_args.end(), extra_args_.begin(),
                        extra_args_.end());
    if (etcd_ != nullptr) {
      o.listen = Address(i);
      o.extra_args.push_back("--etcd=" + etcd_->endpoint());
      o.extra_args.push_back("--etcd_prefix=" + prefix_ + "/");
      o.extra_args.push_back("--ownership_ttl_s=" + std::to_string(ttl_s_));
    } else {
      o.unix_socket = Dir(i) + "/kvmem.sock";
    }
    servers_[i] = std::make_unique<ServerProcess>(o);
    std::string error;
    if (!servers_[i]->Start(std::chrono::seconds(60), &error)) {
      ADD_FAILURE() << "server " << i << ": " << error;
      return nullptr;
    }
    return KvmemClient::Connect(servers_[i]->target(), client);
  }

  std::string Address(int i) {
    if (ports_[i] == 0) ports_[i] = testing::FreeLoopbackPort();
    return absl::StrCat("127.0.0.1:", ports_[i]);
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

  std::chrono::milliseconds KillOwnerAndServeAtB(
      KvmemClient& b, const std::vector<std::vector<uint64_t>>& before,
      uint64_t frames, std::chrono::seconds limit);

  static constexpr uint64_t kFrames = 120;
  static constexpr int kTtlS = 3;  // The servers' ownership lease TTL.
  int ttl_s_ = kTtlS;              // A test may lengthen it.
  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  int ports_[2] = {0, 0};
  std::string prefix_;
  std::unique_ptr<testing::StreamModel> model_;
  std::vector<OutgoingFrame> frames_;
  std::vector<std::string> extra_args_;  // More flags for every server.
  std::unique_ptr<ServerProcess> servers_[2];
};

class OwnershipTest : public TakeoverTest {
 protected:
  void SetUp() override {
    TakeoverTest::SetUp();
    if (IsSkipped()) return;
    if (!testing::EtcdProcess::Installed()) {
      GTEST_SKIP() << testing::EtcdProcess::Missing();
    }
    etcd_ = std::make_unique<testing::EtcdProcess>(dir_.path() + "/etcd");
    ASSERT_TRUE(etcd_->Start()) << "etcd did not start";
  }

  // Both servers up (clients a and b), the stream opened at server 0 with
  // its first `frames` frames.
  void StartPair(std::unique_ptr<KvmemClient>* a,
                 std::unique_ptr<KvmemClient>* b, uint64_t frames) {
    *a = Start(0);
    ASSERT_NE(*a, nullptr);
    *b = Start(1);
    ASSERT_NE(*b, nullptr);
    Open(**a);
    v1::AppendFramesResponse resp;
    const grpc::Status s = (*a)->AppendFrames(
        "cam", {frames_.begin(), frames_.begin() + frames}, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // Appends frames [from, to) one call each; the count acknowledged.
  static uint64_t AppendEach(KvmemClient& c,
                             const std::vector<OutgoingFrame>& frames,
                             uint64_t from, uint64_t to, grpc::Status* last) {
    uint64_t n = 0;
    for (uint64_t i = from; i < to; ++i) {
      v1::AppendFramesResponse r;
      *last = c.AppendFrames("cam", {frames[i]}, &r);
      if (!last->ok()) break;
      ++n;
    }
    return n;
  }

  // Appends frame i, retrying while the answer is UNAVAILABLE (a server
  // between losing and renewing its lease) for up to 4 TTLs.
  static grpc::Status AppendEventually(KvmemClient& c,
                                       const std::vector<OutgoingFrame>& frames,
                                       uint64_t i) {
    const auto t0 = std::chrono::steady_clock::now();
    grpc::Status s;
    while (AppendEach(c, frames, i, i + 1, &s) == 0 &&
           s.error_code() == grpc::StatusCode::UNAVAILABLE &&
           std::chrono::steady_clock::now() - t0 <
               std::chrono::seconds(4 * kTtlS)) {
      absl::SleepFor(absl::Milliseconds(200));
    }
    return s;
  }
};

// (e): a client pointed at the server that does not own the stream is
// redirected (UNAVAILABLE + kvmem-owner) and follows by itself; with
// redirects off it sees the refusal naming the owner.
TEST_F(OwnershipTest, AClientAtTheWrongServerEndsUpAtTheOwner) {
  std::unique_ptr<KvmemClient> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b, 40));
  v1::AppendFramesResponse resp;
  ClientOptions stay;
  stay.max_redirects = 0;
  auto stuck = KvmemClient::Connect(servers_[1]->target(), stay);
  v1::StreamStats st;
  const grpc::Status refused = stuck->GetStreamStats("cam", &st);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.error_message().find(Address(0)), std::string::npos)
      << refused.error_message();
  // b follows to a: reads, appends and recalls all land at the owner.
  ASSERT_TRUE(b->GetStreamStats("cam", &st).ok());
  EXPECT_EQ(b->RouteOf("cam"), Address(0));
  EXPECT_EQ(st.last_durable_frame(), 39);
  ASSERT_TRUE(
      b->AppendFrames("cam", {frames_.begin() + 40, frames_.end()}, &resp)
          .ok());
  ExpectFrames(*b, kFrames);
  EXPECT_EQ(Recalls(*b), Recalls(*a));
  std::unique_ptr<SessionClient> session;
  ASSERT_TRUE(b->StartSession("cam", nullptr, &session).ok());
  ASSERT_TRUE(session->Finish().ok());
}

// Kills server 0, which owns the stream (its recall sets before are `before`),
// and polls b until the other server answers for it (at most `limit`); then
// b serves every frame, the same recall sets, and the rest of the frames.
// The time from the kill to the answer.
std::chrono::milliseconds TakeoverTest::KillOwnerAndServeAtB(
    KvmemClient& b, const std::vector<std::vector<uint64_t>>& before,
    uint64_t frames, std::chrono::seconds limit) {
  servers_[0]->Kill();
  servers_[0].reset();
  const auto t0 = std::chrono::steady_clock::now();
  v1::StreamStats st;
  grpc::Status s;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    s = b.GetStreamStats("cam", &st);
  } while (!s.ok() && std::chrono::steady_clock::now() - t0 < limit);
  EXPECT_TRUE(s.ok()) << s.error_message();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - t0);
  EXPECT_EQ(b.RouteOf("cam"), servers_[1]->target());
  ExpectFrames(b, frames);
  EXPECT_EQ(Recalls(b), before);
  v1::AppendFramesResponse resp;
  EXPECT_TRUE(
      b.AppendFrames("cam", {frames_.begin() + frames, frames_.end()}, &resp)
          .ok());
  ExpectFrames(b, kFrames);
  return took;
}

// (a) with etcd, the probe off (--ownership_probe_ms=0): the owner killed;
// the other server answers the stream's calls once the dead owner's lease
// has expired (at most its TTL, at least two thirds of it after its last
// renewal), with every frame and the same recall sets.
TEST_F(OwnershipTest, AKilledOwnersStreamIsTakenOverAfterItsLease) {
  extra_args_.push_back("--ownership_probe_ms=0");
  std::unique_ptr<KvmemClient> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b, 80));
  const auto took = KillOwnerAndServeAtB(*b, Recalls(*a), 80,
                                         std::chrono::seconds(4 * kTtlS));
  std::cout << "stream answered by the other server " << took.count()
            << " ms after the owner's kill (lease TTL " << kTtlS
            << " s, no probe)\n";
  EXPECT_GE(took.count(), 2 * kTtlS * 1000 / 3 - 200);
}

// (a) with etcd and the default probe: a killed owner's address refuses
// connections, so the server asked revokes its lease and takes the stream
// over at once, long before the lease (30 s here) could expire, with every
// frame and the same recall sets.
TEST_F(OwnershipTest, AKilledOwnersStreamIsTakenOverAtOnce) {
  ttl_s_ = 30;
  std::unique_ptr<KvmemClient> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b, 80));
  const auto took = KillOwnerAndServeAtB(*b, Recalls(*a), 80,
                                         std::chrono::seconds(2 * ttl_s_));
  std::cout << "stream answered by the other server " << took.count()
            << " ms after the owner's kill (lease TTL " << ttl_s_
            << " s, the owner's address probed)\n";
  EXPECT_LT(took.count(), 10'000);
  EXPECT_NE(testing::ReadFile(Dir(1) + "/server.log")
                .find("refuses connections (gone)"),
            std::string::npos);
}

// A paused owner (SIGSTOP) still completes connections from its listening
// socket's backlog: the probe does not find it gone, and the other server
// goes on redirecting to it until its lease expires (30 s here). Resumed
// within the lease, it still owns the stream.
TEST_F(OwnershipTest, APausedOwnerIsNotTakenOverBeforeItsLease) {
  ttl_s_ = 30;
  std::unique_ptr<KvmemClient> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b, 40));
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGSTOP), 0);
  ClientOptions stay;
  stay.max_redirects = 0;
  auto at_b = KvmemClient::Connect(servers_[1]->target(), stay);
  for (int i = 0; i < 3; ++i) {  // Each past the probe's 250 ms memory.
    v1::StreamStats st;
    const grpc::Status s = at_b->GetStreamStats("cam", &st);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(s.error_message().find(Address(0)), std::string::npos)
        << s.error_message();
    absl::SleepFor(absl::Milliseconds(1200));
  }
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGCONT), 0);
  ExpectFrames(*a, 40);
  EXPECT_EQ(a->RouteOf("cam"), servers_[0]->target());
  EXPECT_EQ(testing::ReadFile(Dir(1) + "/server.log")
                .find("refuses connections (gone)"),
            std::string::npos);
}

// (b) with etcd: the owner paused past its lease; the other server takes
// the stream over. Resumed, the old owner serves nothing of it (its lease
// lapsed: it stopped before expiry; the head's epoch fences any write in
// flight) and redirects to the new owner; no acknowledged frame is lost.
TEST_F(OwnershipTest, APausedOwnerStopsServingAndHandsOver) {
  std::unique_ptr<KvmemClient> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b, 40));
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGSTOP), 0);
  absl::SleepFor(absl::Seconds(kTtlS + 1));
  grpc::Status s;
  ClientOptions stay;
  stay.max_redirects = 0;
  auto at_b = KvmemClient::Connect(servers_[1]->target(), stay);
  EXPECT_EQ(AppendEach(*at_b, frames_, 40, 60, &s), 20u) << s.error_message();
  ASSERT_EQ(::kill(servers_[0]->pid(), SIGCONT), 0);
  auto at_a = KvmemClient::Connect(servers_[0]->target(), stay);
  EXPECT_EQ(AppendEach(*at_a, frames_, 60, 61, &s), 0u);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // The client that followed a to its old stream goes on at b once a has
  // learnt its lease is gone and redirects.
  ExpectFrames(*b, 60);
  s = AppendEventually(*a, frames_, 60);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(AppendEach(*a, frames_, 61, kFrames, &s), kFrames - 61)
      << s.error_message();
  EXPECT_EQ(a->RouteOf("cam"), Address(1));
  ExpectFrames(*b, kFrames);
}

// (d): etcd restarted under an owner. A short outage: the owner keeps its
// lease (etcd restores leases on restart) and its stream, and ingest goes
// on. An outage past the TTL: the owner stops acknowledging before its
// lease could expire, and once etcd is back the stream is served again by
// one owner, with every acknowledged frame.
TEST_F(OwnershipTest, OwnersKeepTheirStreamsAcrossAnEtcdRestart) {
  std::unique_ptr<KvmemClient> a, b;
  ASSERT_NO_FATAL_FAILURE(StartPair(&a, &b, 20));
  grpc::Status s;
  etcd_->Stop();
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(etcd_->Start());
  s = AppendEventually(*a, frames_, 20);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(AppendEach(*a, frames_, 21, 40, &s), 19u) << s.error_message();
  v1::StreamStats st;
  ASSERT_TRUE(b->GetStreamStats("cam", &st).ok());
  EXPECT_EQ(b->RouteOf("cam"), Address(0)) << "the owner changed";
  // The long outage.
  etcd_->Stop();
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t acked = 40;
  while (std::chrono::steady_clock::now() - t0 <
         std::chrono::seconds(kTtlS + 2)) {
    if (acked < kFrames && AppendEach(*a, frames_, acked, acked + 1, &s) == 1) {
      ++acked;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "still acknowledging " << kTtlS + 2
      << " s into an etcd outage: " << s.error_message();
  ASSERT_TRUE(etcd_->Start());
  // Served again (by a, whose lease etcd kept, or after a hand-over).
  s = AppendEventually(*a, frames_, acked);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ++acked;
  EXPECT_EQ(AppendEach(*a, frames_, acked, kFrames, &s), kFrames - acked)
      << s.error_message();
  ExpectFrames(*a, kFrames);
  ExpectFrames(*b, kFrames);
}

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

// The local read cache (--store_cache): blocks read once are served again
// while every OSD is paused (SIGSTOP: RADOS cannot answer), byte-exact;
// blocks never read fail within the RADOS deadline instead of hanging.
// Every sealed block leaves RAM at once (a 1-byte warm budget), so the
// fetches read the store.
TEST_F(TakeoverTest, TheReadCacheServesWhatItHoldsWhileCephIsDown) {
  const std::string cluster =
      std::filesystem::path(CephConf()).parent_path().string();
  const std::string port_file = dir_.path() + "/metrics.port";
  extra_args_ = {"--store_cache=" + dir_.path() + "/cache",
                 "--store_cache_mib=64",
                 "--global_warm_budget_bytes=1",
                 "--rados_timeout_ms=3000",
                 "--metrics_listen=127.0.0.1:0",
                 "--metrics_port_file=" + port_file};
  auto a = Start(0);
  ASSERT_NE(a, nullptr);
  Open(*a);
  constexpr uint64_t kRead = 60, kAll = 100;  // Frames read; frames in all.
  for (uint64_t i = 0; i < kAll; ++i) {
    v1::AppendFramesResponse r;
    ASSERT_TRUE(a->AppendFrames("cam", {frames_[i]}, &r).ok());
    if (i + 1 == kRead) ExpectFrames(*a, kRead);  // Read through the cache.
  }
  // The last block's seal follows its frame's ack (--seal_after_ack): let
  // it commit first, so the reads below are timed with no commit in flight
  // (a commit RADOS cannot take holds the stream's reads back until its
  // own deadline passes: 5 s a read here instead of 3).
  for (int tries = 0;; ++tries) {
    v1::StreamStats st;
    ASSERT_TRUE(a->GetStreamStats("cam", &st).ok());
    if (st.sealed_blocks() == kAll / 2) break;
    ASSERT_LT(tries, 200) << "the last block was not sealed within 10 s";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<int> osds;
  for (const auto& e : std::filesystem::directory_iterator(cluster + "/run")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("osd.", 0) == 0 && e.path().extension() == ".pid") {
      osds.push_back(std::stoi(testing::ReadFile(e.path().string())));
    }
  }
  ASSERT_EQ(osds.size(), 3u);
  for (int pid : osds) ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  ExpectFrames(*a, kRead);  // Every block of the first 60 frames, from disk.
  const double cached_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  // Blocks sealed after that read were never read: none is in the cache.
  int failed = 0;
  const auto t1 = std::chrono::steady_clock::now();
  for (uint64_t b = kRead / 2; b < kRead / 2 + 3; ++b) {
    std::vector<FetchedBlock> got;
    const grpc::Status s = a->FetchBlocks("cam", {b}, &got);
    if (!s.ok()) {
      ++failed;
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << s.error_message();
    }
  }
  const double uncached_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1)
          .count();
  for (int pid : osds) ::kill(pid, SIGCONT);
  EXPECT_EQ(failed, 3);
  // The cache's own account of it.
  std::map<std::string, double> m =
      testing::Parse(testing::Scrape(std::stoi(testing::ReadFile(port_file))));
  EXPECT_GE(m["kvmem_store_cache_hits_total"], kRead / 2);
  EXPECT_GE(m["kvmem_store_cache_misses_total"], kRead / 2);
  EXPECT_GE(m["kvmem_store_cache_inner_errors_total"], 3);
  EXPECT_GT(m["kvmem_store_cache_hit_bytes_total"], 0);
  EXPECT_LT(uncached_s, 3 * 3.0 + 6);  // Each within the RADOS deadline.
  std::cout << "with every OSD paused: " << kRead / 2
            << " cached blocks served in " << cached_s * 1000
            << " ms; 3 uncached blocks failed in " << uncached_s << " s\n";
  // And once RADOS answers again, the rest is read.
  ExpectFrames(*a, kAll);
  EXPECT_EQ(
      std::system(("bash " KVMEM_CEPH_SCRIPT " wait-clean " + cluster + " 120")
                      .c_str()),
      0);
}

}  // namespace
}  // namespace kvmem
