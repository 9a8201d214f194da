// Reliability against the real kvmem-server: index configs that used to
// crash FAISS (and, committed, every restart) are refused and the server
// restarts healthy after each; every allowed index kind serves recalls
// before and after a kill -9; a stored stream this build cannot serve is
// quarantined (listed, answered with its reason, deletable) instead of
// keeping the server down, and --recovery=strict refuses to start on it.
#include <random>
#include <string>
#include <vector>

#include "client/kvmem_client.h"
#include "client/server_process.h"
#include "engine/record_codec.h"
#include "engine/stream_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocks_cold_store.h"
#include "tests/stream_model.h"
#include "tests/test_util.h"
#include "tests/wire_fixture.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;

// The geometry of the report: 2 layers x 1 KV head x 6 dims, so the
// summary index has 12 dimensions and each per-layer index (score SUMMED)
// has 6.
testing::TestGeometry SmallGeometry() {
  testing::TestGeometry g;
  g.layers = 2;
  g.kv_heads = 1;
  g.head_dim = 6;
  return g;
}

v1::StreamConfig SummedConfig(const std::string& factory) {
  v1::StreamConfig c =
      testing::WireConfig(SmallGeometry(), /*window=*/8, /*fpb=*/1, {0, 1});
  c.mutable_index_policy()->set_index_factory(factory);
  c.mutable_recall_policy()->set_score(v1::SCORE_MODE_SUMMED);
  return c;
}

std::string StreamId(std::string kind) {
  for (char& ch : kind) ch = ch == ',' ? '.' : ch;
  return "cam-" + kind;
}

class ReliabilityTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_ == nullptr) return;
    client_.reset();
    EXPECT_EQ(server_->Stop(), 0);
    const std::string log = testing::ReadFile(dir_.path() + "/server.log");
    EXPECT_EQ(log.find("Sanitizer"), std::string::npos) << log;
  }

  bool StartServer(std::vector<std::string> extra = {},
                   std::string* error = nullptr) {
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = dir_.path() + "/data";
    o.unix_socket = dir_.path() + "/kvmem.sock";
    o.log_file = dir_.path() + "/server.log";
    o.extra_args = std::move(extra);
    client_.reset();
    server_ = std::make_unique<ServerProcess>(o);
    std::string e;
    if (!server_->Start(std::chrono::seconds(30), error ? error : &e)) {
      server_.reset();
      return false;
    }
    client_ = KvmemClient::Connect(server_->target());
    return true;
  }

  void RestartServer(bool kill) {
    client_.reset();
    if (kill) {
      server_->Kill();
    } else {
      ASSERT_EQ(server_->Stop(), 0);
    }
    ASSERT_TRUE(StartServer());
  }

  // Appends n one-frame blocks of 4 tokens; returns the model.
  void Append(const std::string& id, testing::StreamModel* m, uint64_t n) {
    std::mt19937_64 rng(7);
    std::vector<OutgoingFrame> frames;
    for (uint64_t i = 0; i < n; ++i) {
      frames.push_back(testing::ToOutgoing(m->AddFrame(rng, 4), i));
    }
    v1::AppendFramesResponse resp;
    grpc::Status s = client_->AppendFrames(id, frames, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.frames_written(), n);
  }

  // Block ids of a few recalls (all layers, and per layer).
  std::vector<std::vector<uint64_t>> Recalls(const std::string& id) {
    std::mt19937_64 rng(11);
    std::vector<std::vector<uint64_t>> out;
    for (int i = 0; i < 6; ++i) {
      v1::RecallRequest req;
      req.set_stream_id(id);
      for (float x : testing::RandomQuery(rng, 12)) req.add_query(x);
      req.mutable_budget()->set_max_tokens(40);
      req.set_per_layer(i % 2 == 1);
      v1::RecallResponse resp;
      grpc::Status s = client_->Recall(req, &resp);
      EXPECT_TRUE(s.ok()) << id << ": " << s.error_message();
      std::vector<uint64_t> ids;
      for (const auto& b : resp.blocks()) ids.push_back(b.block_id());
      for (const auto& set : resp.layer_sets()) {
        for (const auto& b : set.blocks()) ids.push_back(b.block_id());
      }
      EXPECT_FALSE(ids.empty()) << id;
      out.push_back(ids);
    }
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<KvmemClient> client_;
};

// The outside report's configs: "d % M == 0" thrown by FAISS at OpenStream
// (uncaught: abort), SIGFPE from NSG at the 64th block, PQ1x24's 255 MiB
// codebook. Each is INVALID_ARGUMENT naming the field, nothing is
// committed, and the server restarts healthy after each.
TEST_F(ReliabilityTest, IndexConfigsThatCrashedFaissAreRefused) {
  ASSERT_TRUE(StartServer());
  for (const char* factory :
       {"PQ4", "PQ12", "IVF2,PQ4", "OPQ4,PQ4", "HNSW4_PQ4", "PQ4x4fs",
        "IVF4,PQ4x4fs", "NSG8,Flat", "NSG16", "NSG32,Flat", "PQ1x24",
        "PQ1x27"}) {
    v1::OpenStreamResponse resp;
    grpc::Status s =
        client_->OpenStream("cam", SummedConfig(factory), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << factory;
    EXPECT_THAT(s.error_message(), HasSubstr("index_factory")) << factory;
    RestartServer(/*kill=*/false);
    v1::ListStreamsResponse list;
    ASSERT_TRUE(client_->ListStreams(&list).ok());
    EXPECT_EQ(list.streams_size(), 0) << factory;
    EXPECT_EQ(list.quarantined_size(), 0) << factory;
  }
}

// Every allowed kind, at dimensions 12 and 6, through 80 blocks (past the
// first FAISS build at 64, and trained where 80 vectors suffice), answers
// recalls (all layers and per layer, none empty) before and after a kill -9
// and recovers every acknowledged frame.
TEST_F(ReliabilityTest, EveryAllowedIndexKindServesAcrossRestart) {
  ASSERT_TRUE(StartServer());
  const std::vector<std::string> kinds = {
      "HNSW4", "HNSW16,Flat", "SQ4",      "SQ6",       "SQ8",
      "SQfp16", "PQ3x4",      "PQ6",      "IVF4,Flat", "IVF4,SQ8",
      "IVF2,PQ2x4"};
  std::map<std::string, std::vector<std::vector<uint64_t>>> before;
  for (const std::string& kind : kinds) {
    const std::string id = StreamId(kind);
    v1::OpenStreamResponse resp;
    grpc::Status s = client_->OpenStream(id, SummedConfig(kind), &resp);
    ASSERT_TRUE(s.ok()) << kind << ": " << s.error_message();
    testing::StreamModel m(SmallGeometry(), 1, 8, {0, 1});
    Append(id, &m, 80);
    before[kind] = Recalls(id);
  }
  RestartServer(/*kill=*/true);
  for (const std::string& kind : kinds) {
    const std::string id = StreamId(kind);
    v1::StreamStats st;
    ASSERT_TRUE(client_->GetStreamStats(id, &st).ok()) << kind;
    EXPECT_EQ(st.last_durable_frame(), 79) << kind;
    EXPECT_EQ(st.config().index_policy().index_factory(), kind);
    EXPECT_EQ(Recalls(id).size(), before[kind].size()) << kind;
  }
  v1::ListStreamsResponse list;
  ASSERT_TRUE(client_->ListStreams(&list).ok());
  EXPECT_EQ(list.streams_size(), static_cast<int>(kinds.size()));
  EXPECT_EQ(list.quarantined_size(), 0);
}

// A stored stream whose config this build refuses (NSG: FAISS accepts it
// and the process dies of SIGFPE at its first build) used to keep every
// restart down. Now: salvage starts, lists it as quarantined, answers its
// calls FAILED_PRECONDITION with the reason, deletes it on request, and the
// other streams serve; strict refuses to start, saying why.
TEST_F(ReliabilityTest, UnservableStoredStreamIsQuarantinedNotFatal) {
  ASSERT_TRUE(StartServer());
  v1::OpenStreamResponse resp;
  ASSERT_TRUE(client_->OpenStream("good", SummedConfig("Flat"), &resp).ok());
  testing::StreamModel m(SmallGeometry(), 1, 8, {0, 1});
  Append("good", &m, 20);
  client_.reset();
  ASSERT_EQ(server_->Stop(), 0);
  {
    RocksColdStoreOptions so;
    so.path = dir_.path() + "/data";
    auto store = OpenRocksColdStore(so);
    ASSERT_TRUE(store.ok()) << store.status();
    StreamConfig c;
    c.geometry = {2, 1, 6, DType::kFp16, 16};
    c.frames_per_block = 1;
    c.hot_window_tokens = 8;
    c = WithDefaults(c);
    c.index_factory = "NSG32,Flat";
    StreamWrite w;
    w.stream_id = "nsg";  // The default tenant's namespace is the id itself.
    w.config = EncodeConfig(c);
    w.state = EncodeState(StreamState());
    ASSERT_TRUE((*store)->Commit(w).ok());
  }
  std::string error;
  EXPECT_FALSE(StartServer({"--recovery=strict"}, &error));
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/server.log"),
              HasSubstr("strict recovery"));

  ASSERT_TRUE(StartServer());
  v1::ListStreamsResponse list;
  ASSERT_TRUE(client_->ListStreams(&list).ok());
  ASSERT_EQ(list.streams_size(), 1);
  EXPECT_EQ(list.streams(0).stream_id(), "good");
  ASSERT_EQ(list.quarantined_size(), 1);
  EXPECT_EQ(list.quarantined(0).stream_id(), "nsg");
  EXPECT_EQ(list.quarantined(0).code(), "FAILED_PRECONDITION");
  EXPECT_THAT(list.quarantined(0).reason(), HasSubstr("NSG32,Flat"));
  EXPECT_THAT(testing::ReadFile(dir_.path() + "/server.log"),
              HasSubstr("\"nsg\" is quarantined"));
  v1::StreamStats st;
  grpc::Status s = client_->GetStreamStats("nsg", &st);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("DeleteStream removes it"));
  EXPECT_EQ(Recalls("good").size(), 6u);

  ASSERT_TRUE(client_->DeleteStream("nsg").ok());
  RestartServer(/*kill=*/false);
  ASSERT_TRUE(client_->ListStreams(&list).ok());
  EXPECT_EQ(list.streams_size(), 1);
  EXPECT_EQ(list.quarantined_size(), 0);
  ASSERT_TRUE(client_->OpenStream("nsg", SummedConfig("HNSW8"), &resp).ok());
}

}  // namespace
}  // namespace kvmem
