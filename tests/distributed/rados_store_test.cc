// What only the RADOS store does (storage/rados_cold_store.h), on the test
// cluster (tests/distributed/ceph_cluster.sh, KVMEM_CEPH_CONF): a second
// store instance takes a stream over and the first one's commits are
// refused by RADOS itself; a reopened store sees everything committed;
// deletes leave no object behind. The ColdStore contract itself is the
// conformance suite, built for RADOS beside this file.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <rados/librados.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/layer_trailer.h"
#include "storage/rados_cold_store.h"
#include "storage/rados_io.h"
#include "tests/distributed/ceph_env.h"

namespace kvmem {
namespace {

using testing::CephConf;

class RadosStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CephConf().empty()) {
      GTEST_SKIP() << testing::kNoCephCluster;
    }
    options_.pool = "kvmem";
    options_.ceph_conf = CephConf();
    options_.prefix = testing::UniquePrefix("r");
    options_.op_timeout = absl::Seconds(20);
  }

  std::unique_ptr<ColdStore> Open(uint64_t token = 0) {
    RadosColdStoreOptions o = options_;
    o.fencing_token = token;
    auto s = OpenRadosColdStore(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Objects in the stream's namespace, as RADOS lists them.
  std::vector<std::string> Objects(const std::string& stream) {
    librados::Rados cluster;
    EXPECT_EQ(cluster.init2("client.admin", "ceph", 0), 0);
    EXPECT_EQ(cluster.conf_read_file(options_.ceph_conf.c_str()), 0);
    EXPECT_EQ(cluster.connect(), 0);
    librados::IoCtx io;
    EXPECT_EQ(cluster.ioctx_create("kvmem", io), 0);
    io.set_namespace(options_.prefix + stream);
    std::vector<std::string> out;
    for (auto it = io.nobjects_begin(); it != io.nobjects_end(); ++it) {
      out.push_back(it->get_oid());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  static StreamWrite Frame(uint64_t index, const std::string& payload) {
    StreamWrite w;
    w.stream_id = "cam";
    w.config = "cfg";
    w.state = absl::StrCat("state-", index);
    w.frame.emplace(index, payload);
    w.frame_meta = absl::StrCat("meta-", index);
    return w;
  }

  // The stream's namespace, through a client of its own.
  librados::IoCtx Namespace(librados::Rados* cluster,
                            const std::string& stream) {
    librados::IoCtx io;
    EXPECT_EQ(cluster->init2("client.admin", "ceph", 0), 0);
    EXPECT_EQ(cluster->conf_read_file(options_.ceph_conf.c_str()), 0);
    EXPECT_EQ(cluster->connect(), 0);
    EXPECT_EQ(cluster->ioctx_create("kvmem", io), 0);
    io.set_namespace(options_.prefix + stream);
    return io;
  }

  // The head's ref of layer `layer` of block `block`.
  static rados_io::Ref LayerRef(librados::IoCtx& io, uint64_t block,
                                uint32_t layer) {
    const std::string key = rados_io::LayerKey(block, layer);
    std::map<std::string, librados::bufferlist> vals;
    EXPECT_EQ(io.omap_get_vals_by_keys(rados_io::kHead, {key}, &vals), 0);
    rados_io::Ref ref;
    EXPECT_TRUE(vals.count(key) > 0 &&
                rados_io::DecodeRef(vals[key].to_str(), &ref));
    return ref;
  }

  RadosColdStoreOptions options_;
};

// Layer records carry the CRC32C trailer RocksColdStore writes (of their
// logical key and bytes): one byte changed in the object, or the head's ref
// pointed at another layer's bytes, reads as DATA_LOSS naming the layer,
// never wrong bytes; a record stored before trailers (a ref without the
// "t:" mark) reads as stored.
TEST_F(RadosStoreTest, DamagedOrMisplacedLayerRecordsAreDataLoss) {
  auto s = Open();
  ASSERT_NE(s, nullptr);
  StreamWrite seal;
  seal.stream_id = "cam";
  seal.blocks.emplace_back(0, "block-0");
  for (uint32_t l = 0; l < 3; ++l) {
    seal.block_layers.push_back({0, l, std::string(1000 + l, char('a' + l))});
  }
  ASSERT_TRUE(s->Commit(seal).ok());
  librados::Rados cluster;
  librados::IoCtx io = Namespace(&cluster, "cam");
  const rados_io::Ref ref0 = LayerRef(io, 0, 0), ref1 = LayerRef(io, 0, 1);
  EXPECT_TRUE(ref0.trailer);
  EXPECT_EQ(ref0.length, 1000 + kTrailerBytes);
  ASSERT_EQ(ref0.object, ref1.object);  // One object per block and write.
  const std::string object = rados_io::Stripes(ref0.object)[0];

  // A byte of layer 1 flipped in the object: layer 1 is DATA_LOSS, layer 0
  // (same object, untouched bytes) still reads.
  librados::bufferlist flip;
  flip.append("Z", 1);
  ASSERT_EQ(io.write(object, flip, 1, ref1.offset + 10), 0);
  auto bad = s->GetBlockLayers("cam", 0, {0, 1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find("layer 1 of block 0"),
            std::string::npos)
      << bad.status();
  auto good = s->GetBlockLayer("cam", 0, 0);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, std::string(1000, 'a'));

  // Layer 2's ref pointed at layer 0's bytes (a stale or damaged manifest),
  // seen by a store opened afterwards: its key is in the CRC, so the check
  // fails.
  std::map<std::string, librados::bufferlist> set;
  set[rados_io::LayerKey(0, 2)].append(rados_io::EncodeRef(ref0));
  // A record as written before trailers: the ref without the mark, the
  // bytes without a trailer (layer 3, at layer 0's offset, its 1000 bytes).
  rados_io::Ref old = ref0;
  old.trailer = false;
  old.length = 1000;
  set[rados_io::LayerKey(0, 3)].append(rados_io::EncodeRef(old));
  librados::ObjectWriteOperation op;
  op.omap_set(set);
  ASSERT_EQ(io.operate(rados_io::kHead, &op), 0);
  s.reset();
  auto reopened = Open();
  ASSERT_NE(reopened, nullptr);
  ASSERT_TRUE(reopened->ListStreams().ok());
  auto misplaced = reopened->GetBlockLayer("cam", 0, 2);
  EXPECT_EQ(misplaced.status().code(), absl::StatusCode::kDataLoss)
      << misplaced.status();
  auto older = reopened->GetBlockLayer("cam", 0, 3);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(*older, std::string(1000, 'a'));
  io.close();
  cluster.shutdown();
}

// Payloads larger than a stripe (rados_io.h kStripeBytes, 4 MiB) are
// stored as several objects; records spanning two stripes read back whole.
TEST_F(RadosStoreTest, AReopenedStoreSeesEveryCommit) {
  std::string payload(9 << 20, 'x');
  for (size_t i = 0; i < payload.size(); i += 4093) payload[i] = char(i >> 12);
  const uint64_t layer_bytes = 3 << 20;
  {
    auto a = Open();
    ASSERT_NE(a, nullptr);
    for (uint64_t f = 0; f < 3; ++f)
      ASSERT_TRUE(a->Commit(Frame(f, payload)).ok());
    StreamWrite seal;
    seal.stream_id = "cam";
    seal.blocks.emplace_back(0, "block-0");
    for (uint32_t l = 0; l < 4; ++l) {
      seal.block_layers.push_back(
          {0, l, std::string(layer_bytes + l, char('a' + l))});
    }
    seal.delete_frames.emplace_back(0, 1);
    ASSERT_TRUE(a->Commit(seal).ok());
    ASSERT_TRUE(a->RecordAcknowledged({{"cam", 3}}).ok());
  }
  auto b = Open();
  ASSERT_NE(b, nullptr);
  auto list = b->ListStreams();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].state, "state-2");
  EXPECT_EQ(b->GetFrame("cam", 0).status().code(), absl::StatusCode::kNotFound);
  auto f2 = b->GetFrame("cam", 2);
  ASSERT_TRUE(f2.ok()) << f2.status();
  EXPECT_EQ(*f2, payload);
  auto layers = b->GetBlockLayers("cam", 0, {3, 0, 1});
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ((*layers)[0], std::string(layer_bytes + 3, 'd'));
  EXPECT_EQ((*layers)[1], std::string(layer_bytes, 'a'));
  EXPECT_EQ((*layers)[2], std::string(layer_bytes + 1, 'b'));  // 2 stripes.
  auto acked = b->Acknowledged();
  ASSERT_TRUE(acked.ok()) << acked.status();
  EXPECT_EQ(acked->at("cam"), 3u);
  // Frames, layers (each with its 8-byte CRC32C trailer) and block
  // records, as stored.
  EXPECT_EQ(b->ApproximatePayloadBytes(), payload.size() + 4 * layer_bytes + 6 +
                                              4 * kTrailerBytes +
                                              std::string("block-0").size());
  // The frames replaced by the block's layers are gone from RADOS too:
  // the head, frame 2's 3 stripes, the layer object's 4 and the block
  // record's 1.
  EXPECT_EQ(Objects("cam").size(), 9u);
}

// The fencing the ownership design rests on: once another instance claims
// the stream, the first one's next commit is refused by the compare on the
// head's epoch inside RADOS, changes nothing, and the instance stops
// serving the stream.
TEST_F(RadosStoreTest, ATakeoverFencesTheEarlierOwner) {
  auto a = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Commit(Frame(0, "zero")).ok());
  auto b = Open();
  ASSERT_NE(b, nullptr);
  auto f0 = b->GetFrame("cam", 0);  // The first touch claims the stream.
  ASSERT_TRUE(f0.ok()) << f0.status();
  const absl::Status refused = a->Commit(Frame(1, "one-from-a"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
  EXPECT_NE(refused.message().find("newer store instance"), std::string::npos)
      << refused;
  EXPECT_EQ(a->GetFrame("cam", 0).status().code(), absl::StatusCode::kAborted);
  // Nothing of a's refused commit is visible, and b goes on.
  EXPECT_EQ(b->GetFrame("cam", 1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(b->Commit(Frame(1, "one-from-b")).ok());
  auto c = Open();
  ASSERT_NE(c, nullptr);
  auto f1 = c->GetFrame("cam", 1);
  ASSERT_TRUE(f1.ok()) << f1.status();
  EXPECT_EQ(*f1, "one-from-b");
  // a's payload object was removed when its head commit failed.
  for (const std::string& o : Objects("cam")) {
    EXPECT_EQ(o.find("f.1.1."), std::string::npos) << o;
  }
}

// A coordinator's fencing token: a claim with a token not above the
// stream's epoch is refused; a larger one wins.
TEST_F(RadosStoreTest, FencingTokensOnlyGoUp) {
  auto a = Open(/*token=*/100);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Commit(Frame(0, "zero")).ok());
  auto stale = Open(/*token=*/50);
  ASSERT_NE(stale, nullptr);
  EXPECT_EQ(stale->Commit(Frame(1, "one")).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(a->Commit(Frame(1, "one")).ok());  // a still owns it.
  auto next = Open(/*token=*/101);
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(next->Commit(Frame(2, "two")).ok());
  EXPECT_EQ(a->Commit(Frame(3, "three")).code(), absl::StatusCode::kAborted);
}

// ClaimStream (a coordinator's token per stream): a new stream's head is
// created with the token; the same holding claims again after
// ReleaseStream and reads what it wrote; a larger claim elsewhere fences
// it; a smaller one is refused. ReadStream gives the records and the mark.
TEST_F(RadosStoreTest, PerStreamClaimsCarryTheCoordinatorsToken) {
  auto a = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->ClaimStream("cam", 7).ok());
  uint64_t acked = 0;
  EXPECT_EQ(a->ReadStream("cam", &acked).status().code(),
            absl::StatusCode::kNotFound);
  StreamWrite w = Frame(0, "zero");
  w.config = "config";
  w.state = "state";
  ASSERT_TRUE(a->Commit(w).ok());
  ASSERT_TRUE(a->RecordAcknowledged({{"cam", 1}}).ok());
  a->ReleaseStream("cam");
  ASSERT_TRUE(a->ClaimStream("cam", 7).ok());  // The same holding again.
  absl::StatusOr<StreamRecord> r = a->ReadStream("cam", &acked);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config, "config");
  EXPECT_EQ(r->state, "state");
  EXPECT_EQ(acked, 1u);
  EXPECT_EQ(*a->GetFrame("cam", 0), "zero");
  auto b = Open();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->ClaimStream("cam", 6).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(b->ClaimStream("cam", 9).ok());
  EXPECT_EQ(a->Commit(Frame(1, "one")).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(b->Commit(Frame(1, "one")).ok());
  EXPECT_EQ(*b->GetFrame("cam", 0), "zero");
}

// Once an instance claims streams with tokens, a stream it released is
// never claimed again behind the coordinator's back: reads, writes and the
// acknowledgement record leave it alone (ABORTED, nothing changed).
TEST_F(RadosStoreTest, AReleasedStreamIsNotTouchedAgain) {
  auto a = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->ClaimStream("cam", 5).ok());
  StreamWrite w = Frame(0, "zero");
  w.config = "config";
  ASSERT_TRUE(a->Commit(w).ok());
  ASSERT_TRUE(a->RecordAcknowledged({{"cam", 1}}).ok());
  a->ReleaseStream("cam");
  EXPECT_EQ(a->GetFrame("cam", 0).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(a->Commit(Frame(1, "one")).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(a->RecordAcknowledged({}).ok());
  auto b = Open();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->ClaimStream("cam", 6).ok());
  uint64_t acked = 0;
  ASSERT_TRUE(b->ReadStream("cam", &acked).ok());
  EXPECT_EQ(acked, 1u);  // a's empty record did not remove the mark.
  EXPECT_EQ(b->GetFrame("cam", 1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(b->Commit(Frame(1, "one")).ok());
}

// DeleteStream removes the records in one operation and then every object,
// also ones no record names (a crashed commit's leftovers); the head keeps
// the epoch so an old owner stays fenced.
TEST_F(RadosStoreTest, DeleteLeavesOnlyTheFencedHead) {
  auto a = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->Commit(Frame(0, "zero")).ok());
  {
    librados::Rados cluster;
    ASSERT_EQ(cluster.init2("client.admin", "ceph", 0), 0);
    ASSERT_EQ(cluster.conf_read_file(options_.ceph_conf.c_str()), 0);
    ASSERT_EQ(cluster.connect(), 0);
    librados::IoCtx io;
    ASSERT_EQ(cluster.ioctx_create("kvmem", io), 0);
    io.set_namespace(options_.prefix + "cam");
    librados::bufferlist bl;
    bl.append("orphan");
    ASSERT_EQ(io.write_full("f.9.1.9", bl), 0);
  }
  EXPECT_EQ(Objects("cam").size(), 3u);
  auto b = Open();
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->DeleteStream("cam").ok());
  EXPECT_EQ(Objects("cam"), std::vector<std::string>{"head"});
  auto list = b->ListStreams();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  EXPECT_EQ(a->Commit(Frame(1, "one")).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(b->Commit(Frame(0, "again")).ok());
  auto f = b->GetFrame("cam", 0);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, "again");
}

TEST_F(RadosStoreTest, AMissingPoolIsAPreconditionNamingIt) {
  RadosColdStoreOptions o = options_;
  o.pool = "no-such-pool";
  auto s = OpenRadosColdStore(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("no-such-pool"), std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace kvmem
