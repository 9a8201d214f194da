// The token path against the real kvmem-server: shared-memory
// delivery (memfd + SCM_RIGHTS, leases), fetches into a reused buffer, and
// recall with delivery and deltas. Every path is checked byte for byte
// against the frames the test appended; then lease expiry, a client killed
// while holding leases, a server restart under a client's mapping, and
// tenants that cannot reach each other's arenas.
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "client/cpp/kvmem_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/stream_model.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

extern char** environ;

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToOutgoing;
using StatusCode = grpc::StatusCode;

constexpr uint32_t kFpb = 2;     // Frames per block.
constexpr uint32_t kTokens = 8;  // Tokens per frame.
constexpr char kKeyA[] = "key-of-tenant-a-0123456789";
constexpr char kKeyB[] = "key-of-tenant-b-9876543210";

enum class Tier { kWarm, kCold, kDegraded };

// groups: token groups per block (1: whole blocks, as StreamModel's
// oracles need; more: recall chooses single tokens).
v1::StreamConfig Config(const TestGeometry& g, Tier tier, uint32_t groups = 1) {
  v1::StreamConfig c = testing::WireConfig(g, kFpb * kTokens, kFpb, {1});
  c.mutable_index_policy()->set_groups_per_block(groups);
  c.mutable_block_policy()->set_mode(v1::SEGMENT_MODE_FIXED);
  v1::TierPolicy* t = c.mutable_tier_policy();
  t->set_warm_budget_bytes(tier == Tier::kWarm ? (1ull << 30) : 1);
  if (tier == Tier::kDegraded) t->set_cold_budget_bytes(1);
  return c;
}

// A block's bytes as the test computes them from the frames it appended:
// the frames back to back, or (layer-major) K then V of each wanted layer,
// each [kv_heads][tokens][head_dim].
std::string Expected(const StreamModel& m, const TestGeometry& g,
                     uint64_t block, bool layer_major,
                     std::vector<uint32_t> layers = {}) {
  const auto& frames = m.frames();
  std::string out;
  if (!layer_major) {
    for (uint32_t f = 0; f < kFpb; ++f) out += frames[block * kFpb + f].bytes;
    return out;
  }
  if (layers.empty()) {
    for (uint32_t l = 0; l < g.layers; ++l) layers.push_back(l);
  }
  const size_t row = size_t{g.head_dim} * 2;  // fp16
  for (uint32_t l : layers) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t f = 0; f < kFpb; ++f) {
          const std::string& b = frames[block * kFpb + f].bytes;
          const size_t slice = size_t{g.kv_heads} * kTokens * row;
          out.append(b, (2 * l + kv) * slice + h * kTokens * row,
                     kTokens * row);
        }
      }
    }
  }
  return out;
}

// TOKEN_LAYER_MAJOR bytes of some tokens of a block, from the frames the
// test appended: per wanted layer K then V, each [kv_heads][tokens][dim].
std::string ExpectedTokens(const StreamModel& m, const TestGeometry& g,
                           uint64_t block, const std::vector<uint32_t>& tokens,
                           std::vector<uint32_t> layers = {}) {
  if (layers.empty()) {
    for (uint32_t l = 0; l < g.layers; ++l) layers.push_back(l);
  }
  const size_t row = size_t{g.head_dim} * 2;  // fp16
  const size_t slice = size_t{g.kv_heads} * kTokens * row;
  std::string out;
  for (uint32_t l : layers) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t o : tokens) {
          const std::string& f = m.frames()[block * kFpb + o / kTokens].bytes;
          out.append(
              f, (2 * l + kv) * slice + (h * kTokens + o % kTokens) * row, row);
        }
      }
    }
  }
  return out;
}

std::string Bytes(const BlockView& v) {
  return std::string(reinterpret_cast<const char*>(v.data), v.size);
}

class ShmTest : public ::testing::Test {
 protected:
  void TearDown() override {
    clients_.clear();
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(), 0);
    }
  }

  void Start(std::vector<std::string> args = {}) {
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = dir_.path() + "/data";
    o.unix_socket = dir_.path() + "/kvmem.sock";
    o.listen = "127.0.0.1:0";
    o.log_file = dir_.path() + "/server.log";
    o.extra_args = std::move(args);
    server_ = std::make_unique<ServerProcess>(o);
    std::string error;
    ASSERT_TRUE(server_->Start(std::chrono::seconds(30), &error)) << error;
  }

  KvmemClient* Client(const std::string& key = "", bool tcp = false,
                      uint64_t arena_bytes = 0) {
    ClientOptions o;
    o.api_key = key;
    o.own_connection = true;
    if (arena_bytes != 0) o.shm_arena_bytes = arena_bytes;
    clients_.push_back(KvmemClient::Connect(
        tcp ? server_->tcp_target() : server_->target(), o));
    return clients_.back().get();
  }

  // Opens `id` in `tier` and appends `blocks` blocks (+1 frame, so the last
  // block is sealed and past nothing); waits until block 0 is in the tier.
  void Load(KvmemClient* c, const std::string& id, Tier tier, uint32_t blocks,
            uint32_t groups = 1) {
    v1::OpenStreamResponse opened;
    ASSERT_TRUE(c->OpenStream(id, Config(g_, tier, groups), &opened).ok());
    std::vector<OutgoingFrame> frames;
    for (uint32_t f = 0; f < blocks * kFpb + 1; ++f) {
      frames.push_back(ToOutgoing(model_.AddFrame(rng_, kTokens), f));
    }
    v1::AppendFramesResponse resp;
    grpc::Status s = c->AppendFrames(id, frames, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const v1::Tier want = tier == Tier::kWarm   ? v1::TIER_WARM
                          : tier == Tier::kCold ? v1::TIER_COLD
                                                : v1::TIER_DEGRADED;
    for (int i = 0; i < 500; ++i) {
      std::vector<FetchedBlock> b;
      ASSERT_TRUE(c->FetchBlocks(id, {0}, &b).ok());
      if (b[0].info.tier() == want) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "block 0 of " << id << " never reached tier " << want;
  }

  v1::RecallRequest Query(const std::string& id, float seed) {
    v1::RecallRequest r;
    r.set_stream_id(id);
    std::mt19937_64 rng(static_cast<uint64_t>(seed * 1000));
    std::normal_distribution<float> n(0, 1);
    for (size_t i = 0; i < model_.summary_dim(); ++i) r.add_query(n(rng));
    r.mutable_budget()->set_max_tokens(2 * kFpb * kTokens);
    return r;
  }

  testing::TempDir dir_;
  TestGeometry g_;
  std::mt19937_64 rng_{18};
  StreamModel model_{g_, kFpb, kFpb* kTokens, {1}};
  std::unique_ptr<ServerProcess> server_;
  std::vector<std::unique_ptr<KvmemClient>> clients_;
};

// Warm and cold blocks come back byte-exact through every path (gRPC
// stream, the reused buffer, shared memory) in both layouts and for a
// subset of layers; degraded blocks equal through all paths.
TEST_F(ShmTest, EveryPathAndTierIsByteExact) {
  Start();
  KvmemClient* c = Client();
  const std::vector<uint64_t> ids = {2, 0, 1};
  std::vector<uint8_t> buffer;
  for (Tier tier : {Tier::kWarm, Tier::kCold, Tier::kDegraded}) {
    const std::string id = "cam-" + std::to_string(static_cast<int>(tier));
    model_ = StreamModel(g_, kFpb, kFpb * kTokens, {1});
    Load(c, id, tier, 3);
    for (int layout = 0; layout < 3; ++layout) {
      FetchOptions o;
      std::vector<uint32_t> layers;
      if (layout > 0) o.layout = v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR;
      if (layout == 2) layers = o.layers = {2, 0};
      SCOPED_TRACE(id + " layout " + std::to_string(layout));
      std::vector<BlockView> into;
      grpc::Status s = c->FetchInto(id, ids, o, &buffer, &into);
      ASSERT_TRUE(s.ok()) << s.error_message();
      Delivery shared;
      s = c->FetchShared(id, ids, o, &shared);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_TRUE(shared.shared_memory());
      ASSERT_EQ(shared.blocks().size(), ids.size());
      ASSERT_EQ(into.size(), ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(shared.blocks()[i].info.block_id(), ids[i]);
        EXPECT_EQ(Bytes(shared.blocks()[i]), Bytes(into[i]));
        if (tier != Tier::kDegraded) {
          EXPECT_EQ(Bytes(into[i]),
                    Expected(model_, g_, ids[i], layout > 0, layers));
        } else {
          EXPECT_EQ(into[i].size,
                    Expected(model_, g_, ids[i], layout > 0, layers).size());
        }
      }
      EXPECT_TRUE(shared.Release().ok());
    }
  }
}

// Recall with delivery: the recalled blocks' bytes in the same exchange,
// inline and through shared memory, unary and over a Session; a recall that
// says which blocks it holds gets only the others.
TEST_F(ShmTest, RecallDeliversItsSetAndDeltasMoveOnlyNewBlocks) {
  Start();
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kWarm, 6);
  for (auto mode : {v1::RecallDelivery::MODE_INLINE,
                    v1::RecallDelivery::MODE_SHARED_MEMORY}) {
    SCOPED_TRACE(mode);
    v1::RecallRequest req = Query("cam", 1);
    req.mutable_delivery()->set_mode(mode);
    req.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
    v1::RecallResponse resp;
    Delivery d;
    grpc::Status s = c->RecallDelivered(req, &resp, &d);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_GE(resp.blocks_size(), 2);
    ASSERT_EQ(d.blocks().size(), static_cast<size_t>(resp.blocks_size()));
    EXPECT_EQ(d.shared_memory(),
              mode == v1::RecallDelivery::MODE_SHARED_MEMORY);
    uint64_t bytes = 0;
    for (int i = 0; i < resp.blocks_size(); ++i) {
      EXPECT_EQ(d.blocks()[i].block_id, resp.blocks(i).block_id());
      EXPECT_EQ(Bytes(d.blocks()[i]),
                Expected(model_, g_, resp.blocks(i).block_id(), true));
      bytes += d.blocks()[i].size;
    }
    EXPECT_EQ(resp.delivered_bytes(), bytes);

    // The next frame's recall: the client holds the first block of the set
    // (and one the set does not have): only the rest moves.
    v1::RecallRequest next = req;
    next.mutable_delivery()->add_held_block_ids(resp.blocks(0).block_id());
    next.mutable_delivery()->add_held_block_ids(999);
    v1::RecallResponse again;
    Delivery delta;
    s = c->RecallDelivered(next, &again, &delta);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(again.blocks_size(), resp.blocks_size());
    EXPECT_EQ(again.held_blocks(), 1u);
    ASSERT_EQ(delta.blocks().size(),
              static_cast<size_t>(resp.blocks_size() - 1));
    for (const BlockView& v : delta.blocks()) {
      EXPECT_NE(v.block_id, resp.blocks(0).block_id());
      EXPECT_EQ(Bytes(v), Expected(model_, g_, v.block_id, true));
    }
    EXPECT_EQ(again.delivered_bytes(), bytes - d.blocks()[0].size);

    // Over a Session.
    std::unique_ptr<SessionClient> session;
    ASSERT_TRUE(c->StartSession("cam", nullptr, &session).ok());
    v1::RecallResponse sresp;
    Delivery sd;
    v1::RecallRequest sreq = next;
    sreq.clear_stream_id();
    s = session->RecallDelivered(sreq, &sresp, &sd);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(sd.blocks().size(), delta.blocks().size());
    for (size_t i = 0; i < sd.blocks().size(); ++i) {
      EXPECT_EQ(Bytes(sd.blocks()[i]), Bytes(delta.blocks()[i]));
    }
    EXPECT_TRUE(sd.Release().ok());
    EXPECT_TRUE(session->Finish().ok());
  }
}

// Each recalled block's tokens over the response's sets (all its tokens
// where a set takes it whole), in the order blocks first appear.
std::vector<std::pair<uint64_t, std::vector<uint32_t>>> RecalledTokens(
    const v1::RecallResponse& resp) {
  std::vector<std::pair<uint64_t, std::vector<uint32_t>>> out;
  auto add = [&](const v1::RecalledBlock& b) {
    std::vector<uint32_t>* t = nullptr;
    for (auto& [id, tokens] : out) {
      if (id == b.block_id()) t = &tokens;
    }
    if (t == nullptr) {
      t = &out.emplace_back(b.block_id(), std::vector<uint32_t>()).second;
    }
    if (b.token_offsets().empty()) {
      for (uint32_t j = 0; j < b.token_count(); ++j) t->push_back(j);
    } else {
      t->insert(t->end(), b.token_offsets().begin(), b.token_offsets().end());
    }
    std::sort(t->begin(), t->end());
    t->erase(std::unique(t->begin(), t->end()), t->end());
  };
  for (const auto& b : resp.blocks()) add(b);
  for (const auto& set : resp.layer_sets()) {
    for (const auto& b : set.blocks()) add(b);
  }
  return out;
}

// TOKEN_LAYER_MAJOR: a recall delivers exactly its tokens' rows (bytes =
// recalled tokens x bytes per token), inline and through shared memory,
// for one set and for per-head sets (their union); tokens the client holds
// are left out, a block wholly held is not delivered.
TEST_F(ShmTest, TokenDeliveryMovesOnlyTheRecalledTokens) {
  Start();
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kCold, 6, /*groups=*/4);
  const uint64_t token_bytes =
      uint64_t{g_.layers} * 2 * g_.kv_heads * g_.head_dim * 2;  // fp16
  bool partial = false;
  for (bool per_head : {false, true}) {
    for (auto mode : {v1::RecallDelivery::MODE_INLINE,
                      v1::RecallDelivery::MODE_SHARED_MEMORY}) {
      SCOPED_TRACE(std::to_string(mode) + (per_head ? " per_head" : ""));
      v1::RecallRequest req = Query("cam", 2);
      req.set_per_head(per_head);
      req.mutable_delivery()->set_mode(mode);
      req.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR);
      v1::RecallResponse resp;
      Delivery d;
      grpc::Status s = c->RecallDelivered(req, &resp, &d);
      ASSERT_TRUE(s.ok()) << s.error_message();
      const auto want = RecalledTokens(resp);
      ASSERT_GE(want.size(), 2u);
      ASSERT_EQ(d.blocks().size(), want.size());
      uint64_t tokens = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const auto& [id, offsets] = want[i];
        EXPECT_EQ(d.blocks()[i].block_id, id);
        EXPECT_EQ(d.blocks()[i].token_offsets, offsets);
        EXPECT_EQ(Bytes(d.blocks()[i]), ExpectedTokens(model_, g_, id, offsets))
            << "block " << id;
        partial = partial || offsets.size() < kFpb * kTokens;
        tokens += offsets.size();
      }
      // Bytes moved are the recalled tokens' bytes, exactly.
      EXPECT_EQ(resp.delivered_bytes(), tokens * token_bytes);

      // The next frame: the client holds all but the last token of the
      // first block and the whole second block.
      v1::RecallRequest next = req;
      v1::BlockTokens* h = next.mutable_delivery()->add_held_tokens();
      h->set_block_id(want[0].first);
      h->mutable_token_offsets()->Assign(want[0].second.begin(),
                                         want[0].second.end() - 1);
      next.mutable_delivery()->add_held_block_ids(want[1].first);
      v1::BlockTokens* other = next.mutable_delivery()->add_held_tokens();
      other->set_block_id(999);  // Not in the set: ignored.
      v1::RecallResponse again;
      Delivery delta;
      s = c->RecallDelivered(next, &again, &delta);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_EQ(RecalledTokens(again), want);
      EXPECT_EQ(again.held_blocks(), 1u);
      ASSERT_EQ(delta.blocks().size(), want.size() - 1);
      EXPECT_THAT(delta.blocks()[0].token_offsets,
                  ::testing::ElementsAre(want[0].second.back()));
      EXPECT_EQ(
          Bytes(delta.blocks()[0]),
          ExpectedTokens(model_, g_, want[0].first, {want[0].second.back()}));
      EXPECT_EQ(again.delivered_bytes(),
                (tokens - want[0].second.size() + 1 - want[1].second.size()) *
                    token_bytes);
      EXPECT_TRUE(d.Release().ok());
      EXPECT_TRUE(delta.Release().ok());
    }
  }
  EXPECT_TRUE(partial) << "every recalled block was whole: nothing gathered";

  // Held tokens are checked, and need the token layout.
  v1::RecallRequest bad = Query("cam", 2);
  bad.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_INLINE);
  bad.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
  bad.mutable_delivery()->add_held_tokens()->set_block_id(0);
  v1::RecallResponse resp;
  Delivery d;
  grpc::Status s = c->RecallDelivered(bad, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("needs delivery.layout"));
  bad.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR);
  bad.mutable_delivery()->mutable_held_tokens(0)->add_token_offsets(3);
  bad.mutable_delivery()->mutable_held_tokens(0)->add_token_offsets(3);
  s = c->RecallDelivered(bad, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("held_tokens of block 0 has 3 after 3"));
  // An offset past a recalled block's tokens.
  v1::RecallResponse plain;
  ASSERT_TRUE(c->Recall(Query("cam", 2), &plain).ok());
  ASSERT_GT(plain.blocks_size(), 0);
  const uint64_t first = plain.blocks(0).block_id();
  bad.mutable_delivery()->mutable_held_tokens(0)->set_block_id(first);
  bad.mutable_delivery()->mutable_held_tokens(0)->clear_token_offsets();
  bad.mutable_delivery()->mutable_held_tokens(0)->add_token_offsets(kFpb *
                                                                    kTokens);
  s = c->RecallDelivered(bad, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("delivery.held_tokens of block " +
                        std::to_string(first) + " has offset 16"));
  bad.mutable_delivery()->mutable_held_tokens(0)->set_block_id(0);
  bad.mutable_delivery()->mutable_held_tokens(0)->clear_token_offsets();
  bad.mutable_delivery()->add_held_tokens()->set_block_id(0);
  s = c->RecallDelivered(bad, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("names block 0 twice"));
}

// FetchBlocks in TOKEN_LAYER_MAJOR: the named tokens of each block (all
// for a block not named), byte-exact through the byte stream and shared
// memory, for a subset of layers; bad token lists are refused.
TEST_F(ShmTest, FetchBlocksSendsTheTokensItNames) {
  Start();
  KvmemClient* c = Client();
  std::vector<uint8_t> buffer;
  for (Tier tier : {Tier::kWarm, Tier::kDegraded}) {
    const std::string id = "tok-" + std::to_string(static_cast<int>(tier));
    model_ = StreamModel(g_, kFpb, kFpb * kTokens, {1});
    Load(c, id, tier, 3);
    FetchOptions o;
    o.layout = v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR;
    o.layers = {2, 0};
    const std::vector<uint64_t> ids = {2, 0, 1};
    const std::vector<std::vector<uint32_t>> tokens = {
        {0, 5, 6, 7, 15}, {3}, {}};  // Block 1 not named: all 16.
    for (size_t i = 0; i < 2; ++i) {
      v1::BlockTokens& t = o.tokens.emplace_back();
      t.set_block_id(ids[i]);
      t.mutable_token_offsets()->Assign(tokens[i].begin(), tokens[i].end());
    }
    std::vector<BlockView> into;
    grpc::Status s = c->FetchInto(id, ids, o, &buffer, &into);
    ASSERT_TRUE(s.ok()) << s.error_message();
    Delivery shared;
    s = c->FetchShared(id, ids, o, &shared);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(into.size(), ids.size());
    ASSERT_EQ(shared.blocks().size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<uint32_t> want = tokens[i];
      for (uint32_t j = 0; tokens[i].empty() && j < kFpb * kTokens; ++j) {
        want.push_back(j);
      }
      EXPECT_EQ(Bytes(into[i]), Bytes(shared.blocks()[i]));
      EXPECT_EQ(into[i].token_offsets, want);
      EXPECT_EQ(shared.blocks()[i].token_offsets, want);
      if (tier == Tier::kWarm) {
        EXPECT_EQ(Bytes(into[i]),
                  ExpectedTokens(model_, g_, ids[i], want, o.layers));
      } else {
        EXPECT_EQ(into[i].size,
                  ExpectedTokens(model_, g_, ids[i], want, o.layers).size());
      }
    }
    EXPECT_TRUE(shared.Release().ok());
  }
  FetchOptions o;
  o.layout = v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR;
  v1::BlockTokens& t = o.tokens.emplace_back();
  t.set_block_id(0);
  t.add_token_offsets(16);
  std::vector<BlockView> into;
  grpc::Status s = c->FetchInto("tok-0", {0, 1}, o, &buffer, &into);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("tokens of block 0 has offset 16; the block holds 16"));
  t.set_block_id(2);
  s = c->FetchInto("tok-0", {0, 1}, o, &buffer, &into);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not in block_ids"));
  t.set_block_id(0);
  t.clear_token_offsets();
  o.tokens.push_back(t);
  s = c->FetchInto("tok-0", {0, 1}, o, &buffer, &into);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("tokens names block 0 twice"));
  o.tokens.pop_back();
  o.layout = v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR;
  s = c->FetchInto("tok-0", {0, 1}, o, &buffer, &into);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("needs layout"));
}

// Inline delivery is bounded by what one response may carry: beyond it,
// RESOURCE_EXHAUSTED naming the sizes, and shared memory still delivers.
TEST_F(ShmTest, InlineDeliveryBeyondAResponseIsResourceExhausted) {
  Start({"--max_message_bytes=65536", "--max_chunk_bytes=32768"});
  g_.head_dim = 64;  // 24 KiB blocks: two exceed the 32 KiB left inline.
  model_ = StreamModel(g_, kFpb, kFpb * kTokens, {1});
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kWarm, 6);
  v1::RecallRequest req = Query("cam", 3);
  req.mutable_budget()->set_max_tokens(4 * kFpb * kTokens);
  req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_INLINE);
  v1::RecallResponse resp;
  Delivery d;
  grpc::Status s = c->RecallDelivered(req, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("at most 32768"));
  req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
  s = c->RecallDelivered(req, &resp, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GE(d.blocks().size(), 2u);
  for (const BlockView& v : d.blocks()) {
    EXPECT_EQ(Bytes(v), Expected(model_, g_, v.block_id, false));
  }
}

// A recall whose sets would not fit one message is refused by the server
// with the answer's size and what to ask for instead, with and without
// delivery (before 2026-12-07 the transport refused it after the work, with
// "Sent message larger than max"); the same query with fewer sets fits.
TEST_F(ShmTest, ARecallOverAMessageIsRefusedWithItsSize) {
  Start({"--max_message_bytes=65536", "--max_chunk_bytes=32768"});
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kWarm, 800);
  v1::RecallRequest req = Query("cam", 5);
  req.set_per_head(true);  // Two sets (one layer, two KV heads).
  req.mutable_budget()->set_max_tokens(800 * kFpb * kTokens);
  v1::RecallResponse resp;
  grpc::Status s = c->Recall(req, &resp);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("2 sets"));
  EXPECT_THAT(s.error_message(), HasSubstr("--max_message_bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr("per_layer sets instead of"));
  for (auto mode : {v1::RecallDelivery::MODE_SHARED_MEMORY,
                    v1::RecallDelivery::MODE_INLINE}) {
    req.mutable_delivery()->set_mode(mode);
    Delivery d;
    s = c->RecallDelivered(req, &resp, &d);
    EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
        << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("--max_message_bytes"));
  }
  // One set of 700 blocks fits (~31 KB), but not beside the descriptors of
  // its 700 blocks delivered (58 bytes each at most): refused before any
  // lease is taken.
  req.set_per_head(false);
  req.mutable_budget()->set_max_tokens(700 * kFpb * kTokens);
  req.clear_delivery();
  s = c->Recall(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.blocks_size(), 700);
  req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
  Delivery d;
  s = c->RecallDelivered(req, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("700 blocks delivered"));
  // 200 blocks and their delivery fit.
  req.mutable_budget()->set_max_tokens(200 * kFpb * kTokens);
  s = c->RecallDelivered(req, &resp, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.blocks_size(), 200);
  EXPECT_EQ(d.blocks().size(), 200u);
}

// A request's release_lease_ids go back before it runs, whatever becomes
// of it: a refused recall or fetch (an unknown stream, a block that is not
// there) used to leave those leases live until --shm_lease_ms, the arena's
// room held by leases the client had let go of. A call the server never
// read (over its message limit) leaves them to the client's next delivery.
TEST_F(ShmTest, ARefusedDeliveryStillReleasesItsLeases) {
  Start({"--max_message_bytes=65536", "--max_chunk_bytes=32768"});
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kWarm, 4);
  // Whether the server holds `lease` as released (a second release is
  // refused as such).
  auto released = [&](uint64_t lease) {
    v1::ReleaseLeasesResponse r;
    grpc::Status s = c->ReleaseLeases(c->shm_arena_id(), {lease}, &r);
    return s.error_code() == StatusCode::INVALID_ARGUMENT &&
           s.error_message().find("released already") != std::string::npos;
  };
  auto lease_later = [&](uint64_t block) {
    Delivery d;
    EXPECT_TRUE(c->FetchShared("cam", {block}, {}, &d).ok());
    const uint64_t lease = d.lease_id();
    EXPECT_NE(lease, 0u);
    d.ReleaseLater();  // Rides on the client's next delivery.
    return lease;
  };
  const uint64_t first = lease_later(0);
  v1::RecallRequest req = Query("nope", 1);
  req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
  v1::RecallResponse resp;
  Delivery d;
  grpc::Status s = c->RecallDelivered(req, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_TRUE(released(first));
  const uint64_t second = lease_later(1);
  s = c->FetchShared("cam", {99}, {}, &d);
  EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_TRUE(released(second));
  const uint64_t unread = lease_later(3);
  v1::RecallRequest large = Query("cam", 2);
  for (int i = 0; i < 20000; ++i) large.add_query(0.0f);  // 80 KB.
  large.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
  s = c->RecallDelivered(large, &resp, &d);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  ASSERT_TRUE(c->FetchShared("cam", {0}, {}, &d).ok());  // Carries it again.
  EXPECT_TRUE(released(unread));
  // A delivery that goes through releases them as before.
  const uint64_t third = lease_later(2);
  s = c->FetchShared("cam", {0, 1, 2, 3}, {}, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(released(third));
}

// A lease held past --shm_lease_ms is reclaimed when the arena needs the
// room, and its holder hears so (DATA_LOSS) on release; before that, a
// full arena answers RESOURCE_EXHAUSTED and takes nothing.
TEST_F(ShmTest, LeasesExpireOnlyWhenTheRoomIsNeeded) {
  Start({"--shm_lease_ms=300"});
  const uint64_t block =
      uint64_t{kFpb} * g_.layers * 2 * g_.kv_heads * kTokens * g_.head_dim * 2;
  // Room for one lease of two blocks (leases take whole 4 KiB pages), not
  // two.
  KvmemClient* c = Client("", false, 3 * block);
  Load(c, "cam", Tier::kWarm, 4);
  Delivery a, b;
  ASSERT_TRUE(c->FetchShared("cam", {0, 1}, {}, &a).ok());
  grpc::Status s = c->FetchShared("cam", {2, 3}, {}, &b);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("live leases"));
  EXPECT_EQ(Bytes(a.blocks()[1]), Expected(model_, g_, 1, false));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  s = c->FetchShared("cam", {2, 3}, {}, &b);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Bytes(b.blocks()[0]), Expected(model_, g_, 2, false));
  s = a.Release();
  EXPECT_EQ(s.error_code(), StatusCode::DATA_LOSS) << s.error_message();
  const uint64_t lease = b.lease_id();
  EXPECT_TRUE(b.Release().ok());
  // A released lease cannot be released twice.
  v1::ReleaseLeasesResponse r;
  s = c->ReleaseLeases(c->shm_arena_id(), {lease}, &r);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("released already"));
  // A set larger than the arena: RESOURCE_EXHAUSTED, until a larger arena
  // is attached in its place.
  const uint64_t small = c->shm_arena_id();
  Delivery all;
  s = c->FetchShared("cam", {0, 1, 2, 3}, {}, &all);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  ASSERT_TRUE(c->AttachSharedMemory(8 * block).ok());
  EXPECT_NE(c->shm_arena_id(), small);
  s = c->FetchShared("cam", {0, 1, 2, 3}, {}, &all);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Bytes(all.blocks()[3]), Expected(model_, g_, 3, false));
}

// A front end releases each frame's lease with the next frame's delivery:
// the room comes back without a ReleaseLeases round trip (the arena holds
// one set at a time here, so the second fetch needs the first's room).
TEST_F(ShmTest, DeferredReleasesRideOnTheNextDelivery) {
  Start();
  const uint64_t block =
      uint64_t{kFpb} * g_.layers * 2 * g_.kv_heads * kTokens * g_.head_dim * 2;
  KvmemClient* c = Client("", false, 3 * block);
  Load(c, "cam", Tier::kWarm, 6);
  Delivery a;
  ASSERT_TRUE(c->FetchShared("cam", {0, 1}, {}, &a).ok());
  const uint64_t first = a.lease_id();
  a.ReleaseLater();
  EXPECT_TRUE(a.blocks().empty());
  Delivery b;
  grpc::Status s = c->FetchShared("cam", {2, 3}, {}, &b);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Bytes(b.blocks()[1]), Expected(model_, g_, 3, false));
  v1::ReleaseLeasesResponse r;
  EXPECT_EQ(c->ReleaseLeases(c->shm_arena_id(), {first}, &r).error_code(),
            StatusCode::INVALID_ARGUMENT);  // Released already.
  // The same through recalls: each frame's delivery releases the last.
  v1::RecallRequest req = Query("cam", 4);
  req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
  b.ReleaseLater();
  for (int frame = 0; frame < 5; ++frame) {
    v1::RecallResponse resp;
    Delivery d;  // Its destructor defers its release to the next frame.
    s = c->RecallDelivered(req, &resp, &d);
    ASSERT_TRUE(s.ok()) << frame << ": " << s.error_message();
    ASSERT_EQ(d.blocks().size(), 2u);
  }
}

// Attaches an arena that fills the server's shared memory, fetches under a
// lease, says "holding" and waits to be killed. Run by the test below as a
// child process (the same binary).
TEST(ShmChild, HoldLeasesUntilKilled) {
  const char* target = std::getenv("KVMEM_SHM_CHILD_TARGET");
  if (target == nullptr) GTEST_SKIP() << "run by ClientKilledHoldingLeases";
  ClientOptions o;
  o.shm_arena_bytes = 8 << 20;
  auto c = KvmemClient::Connect(target, o);
  Delivery d;
  grpc::Status s = c->FetchShared("cam", {0, 1}, {}, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::printf("holding %zu blocks\n", d.blocks().size());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

// A client whose default arena (256 MiB) is past what it may have attaches
// the largest that fits instead of failing every shared-memory call: here
// its tenant's share (1 GiB of arenas split among 8 tenants: 128 MiB) and
// a server whose arenas hold at most 64 MiB. Asked for by size, an arena
// past the room is refused as before.
TEST_F(ShmTest, ADefaultArenaPastTheRoomTakesWhatFits) {
  const std::string keys = dir_.path() + "/keys";
  {
    std::ofstream out(keys);
    for (int t = 0; t < 8; ++t) {
      out << "tenant-" << t << ":" << kKeyA << t << "\n";
    }
  }
  Start({"--api_keys_file=" + keys, "--shm_max_total_bytes=1073741824",
         "--shm_max_arena_bytes=536870912"});
  KvmemClient* c = Client(std::string(kKeyA) + "0");
  Load(c, "cam", Tier::kWarm, 2);
  Delivery d;
  grpc::Status s = c->FetchShared("cam", {0, 1}, {}, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Bytes(d.blocks()[1]), Expected(model_, g_, 1, false));
  s = c->AttachSharedMemory(512ull << 20);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
}

TEST_F(ShmTest, ADefaultArenaPastTheLargestTakesTheLargest) {
  Start({"--shm_max_total_bytes=67108864", "--shm_max_arena_bytes=67108864"});
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kWarm, 2);
  Delivery d;
  grpc::Status s = c->FetchShared("cam", {0, 1}, {}, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Bytes(d.blocks()[0]), Expected(model_, g_, 0, false));
  s = c->AttachSharedMemory(128ull << 20);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
}

// A client killed while it holds an arena and a lease frees both at once
// (its hand-off connection closes with it): the server's whole shared
// memory, which the dead client held, is free for the next client.
TEST_F(ShmTest, ClientKilledHoldingLeasesFreesItsArena) {
  Start({"--shm_max_total_bytes=8388608", "--shm_max_arena_bytes=8388608"});
  KvmemClient* c = Client("", false, 8 << 20);
  Load(c, "cam", Tier::kWarm, 2);
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const std::string target = "KVMEM_SHM_CHILD_TARGET=" + server_->target();
  std::vector<char*> env = {const_cast<char*>(target.c_str())};
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(nullptr);
  char filter[] = "--gtest_filter=ShmChild.HoldLeasesUntilKilled";
  char self[] = "/proc/self/exe";
  char* argv[] = {self, filter, nullptr};
  pid_t child;
  const int spawned = posix_spawn(&child, self, &fa, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&fa);
  ASSERT_EQ(spawned, 0);
  ::close(out[1]);
  std::string said;
  char buf[256];
  while (said.find("holding 2 blocks") == std::string::npos) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    ASSERT_GT(n, 0) << "the child ended early: " << said;
    said.append(buf, static_cast<size_t>(n));
  }
  // While the child lives, its arena holds all the server allows.
  grpc::Status s = c->AttachSharedMemory();
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(out[0]);
  for (int i = 0; i < 100 && !s.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = c->AttachSharedMemory();
  }
  ASSERT_TRUE(s.ok()) << s.error_message();
  Delivery d;
  s = c->FetchShared("cam", {0, 1}, {}, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Bytes(d.blocks()[1]), Expected(model_, g_, 1, false));
}

// A server restart under a client's mapping: the bytes it holds stay as
// they were, its release is quietly done, and its next fetch attaches a
// new arena by itself and is byte-exact.
TEST_F(ShmTest, ServerRestartKeepsHeldBytesAndReattaches) {
  Start();
  KvmemClient* c = Client();
  Load(c, "cam", Tier::kCold, 3);
  Delivery held;
  ASSERT_TRUE(c->FetchShared("cam", {0, 1, 2}, {}, &held).ok());
  const uint64_t arena = c->shm_arena_id();
  EXPECT_EQ(server_->Stop(), 0);
  Start();
  ASSERT_TRUE(c->WaitForReady(std::chrono::seconds(10)));
  for (uint64_t b = 0; b < 3; ++b) {
    EXPECT_EQ(Bytes(held.blocks()[b]), Expected(model_, g_, b, false));
  }
  EXPECT_TRUE(held.Release().ok());
  Delivery d;
  grpc::Status s = c->FetchShared("cam", {2, 1}, {}, &d);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(c->shm_arena_id(), arena);
  EXPECT_EQ(Bytes(d.blocks()[0]), Expected(model_, g_, 2, false));
  EXPECT_EQ(Bytes(d.blocks()[1]), Expected(model_, g_, 1, false));
}

// Tenants: one cannot place bytes in, or release leases of, another's
// arena, nor pick up its descriptor with a made-up token; a TCP caller
// gets no shared memory at all.
TEST_F(ShmTest, ArenasBelongToTheirTenantAndToThisHost) {
  const std::string keys = dir_.path() + "/keys";
  std::ofstream(keys) << "tenant-a:" << kKeyA << "\ntenant-b:" << kKeyB << "\n";
  Start({"--api_keys_file=" + keys});
  KvmemClient* a = Client(kKeyA);
  KvmemClient* b = Client(kKeyB);
  Load(a, "cam", Tier::kWarm, 2);
  Load(b, "cam", Tier::kWarm, 2);  // Same name, b's own stream.
  Delivery da;
  ASSERT_TRUE(a->FetchShared("cam", {0}, {}, &da).ok());
  ASSERT_TRUE(b->AttachSharedMemory().ok());
  // b's request naming a's arena (the stream is b's own "cam") and a's
  // lease as one to release: refused, and a's lease stays a's.
  grpc::ClientContext ctx;
  KvmemClient::Authorize(b->options(), &ctx, "cam");
  v1::FetchBlocksRequest req;
  req.set_stream_id("cam");
  req.add_block_ids(0);
  req.set_shm_arena_id(a->shm_arena_id());
  req.add_release_lease_ids(da.lease_id());
  auto reader = b->stub()->FetchBlocks(&ctx, req);
  v1::FetchBlocksResponse r;
  EXPECT_FALSE(reader->Read(&r));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND) << s.error_message();
  v1::ReleaseLeasesResponse rel;
  s = b->ReleaseLeases(a->shm_arena_id(), {da.lease_id()}, &rel);
  EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND);
  // The same through a recall delivered into a's arena.
  v1::RecallRequest recall = Query("cam", 1);
  recall.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
  recall.mutable_delivery()->set_shm_arena_id(a->shm_arena_id());
  recall.mutable_delivery()->add_release_lease_ids(da.lease_id());
  grpc::ClientContext recall_ctx;
  KvmemClient::Authorize(b->options(), &recall_ctx, "cam");
  v1::RecallResponse recalled;
  s = b->stub()->Recall(&recall_ctx, recall, &recalled);
  EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND) << s.error_message();
  // A made-up token gets no descriptor: the server just hangs up.
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = dir_.path() + "/kvmem.sock.shm";
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::write(fd, std::string(32, '0').data(), 32), 32);
  char got[16];
  EXPECT_EQ(::read(fd, got, sizeof got), 0);
  ::close(fd);
  // a's bytes are untouched and its release works.
  EXPECT_EQ(Bytes(da.blocks()[0]), Expected(model_, g_, 0, false));
  EXPECT_TRUE(da.Release().ok());
  // Over TCP: no shared memory.
  KvmemClient* remote = Client(kKeyA, /*tcp=*/true);
  s = remote->AttachSharedMemory();
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("unix socket"));
}

}  // namespace
}  // namespace kvmem
