#include "tools/bench/bench_fetch.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"
#include "client/cpp/kvmem_client.h"
#include "engine/codec/dtype.h"
#include "storage/rocks_cold_store.h"
#include "tools/bench/bench_inproc.h"
#include "tools/bench/bench_util.h"
#include "tools/common/json_writer.h"

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

enum class FetchTier { kWarm, kCold, kDegraded };

const char* TierName(FetchTier t) {
  return t == FetchTier::kWarm   ? "warm"
         : t == FetchTier::kCold ? "cold"
                                 : "degraded";
}

// The median, as Summarize (bench.h) computes it.
double Median(std::vector<double> v) { return Summarize(&v).p50_us; }

double MbPerS(uint64_t bytes, double seconds) {
  return seconds > 0 ? bytes / 1e6 / seconds : 0;
}

v1::StreamConfig FetchConfig(const FetchGeometry& g, FetchTier tier) {
  v1::StreamConfig c;
  v1::StreamGeometry* geo = c.mutable_geometry();
  geo->set_layers(g.layers);
  geo->set_kv_heads(g.kv_heads);
  geo->set_head_dim(g.head_dim);
  geo->set_dtype(v1::DTYPE_FP16);
  geo->set_max_tokens_per_frame(g.tokens_per_frame);
  // One block of hot window: every block but the newest is recallable.
  c.set_hot_window_tokens(g.tokens_per_frame * g.frames_per_block);
  c.mutable_block_policy()->set_mode(v1::SEGMENT_MODE_FIXED);
  c.mutable_block_policy()->set_frames_per_block(g.frames_per_block);
  v1::TierPolicy* t = c.mutable_tier_policy();
  t->set_warm_budget_bytes(tier == FetchTier::kWarm ? (1ull << 30) : 1);
  if (tier == FetchTier::kDegraded) t->set_cold_budget_bytes(1);
  return c;
}

// A fresh stream of `blocks` sealed blocks in the given tier.
absl::Status LoadStream(KvmemClient* client, const std::string& id,
                        const FetchGeometry& g, FetchTier tier,
                        uint32_t blocks) {
  client->DeleteStream(id);
  v1::OpenStreamResponse opened;
  grpc::Status s = client->OpenStream(id, FetchConfig(g, tier), &opened);
  if (!s.ok()) return absl::InternalError("OpenStream: " + s.error_message());
  const size_t values =
      KvValuesPerToken(g.layers, g.kv_heads, g.head_dim) * g.tokens_per_frame;
  std::vector<OutgoingFrame> frames;
  for (uint32_t f = 0; f < blocks * g.frames_per_block; ++f) {
    OutgoingFrame fr;
    fr.header.set_frame_index(f);
    fr.header.set_first_token_position(uint64_t{f} * g.tokens_per_frame);
    fr.header.set_token_count(g.tokens_per_frame);
    fr.payload = RandomFp16(values, f + 1);
    frames.push_back(std::move(fr));
    if (frames.size() == 16 || f + 1 == blocks * g.frames_per_block) {
      v1::AppendFramesResponse resp;
      s = client->AppendFrames(id, frames, &resp);
      if (!s.ok()) {
        return absl::InternalError("AppendFrames: " + s.error_message());
      }
      frames.clear();
    }
  }
  return absl::OkStatus();
}

// Drops the page cache (root on this host); false where not permitted.
bool DropPageCache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "1\n";
  return static_cast<bool>(f.flush());
}

// One fetch of the set: the bytes it brought (a shared-memory fetch
// releases its lease before returning, as a front end done with them
// would).
using FetchOp = std::function<absl::StatusOr<uint64_t>()>;

// Median seconds of `calls` runs of op, each checked to bring want_bytes.
absl::StatusOr<double> TimeFetch(const FetchOp& op, int calls,
                                 uint64_t want_bytes, bool drop_cache) {
  std::vector<double> secs;
  for (int i = 0; i < calls; ++i) {
    if (drop_cache && !DropPageCache()) {
      return absl::PermissionDeniedError("cannot drop the page cache");
    }
    const auto t0 = Clock::now();
    absl::StatusOr<uint64_t> got = op();
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!got.ok()) return got.status();
    if (*got != want_bytes) {
      return absl::DataLossError(
          absl::StrCat("a fetch gave ", *got, " bytes, want ", want_bytes));
    }
  }
  return Median(secs);
}

absl::Status Failed(const char* what, const grpc::Status& s) {
  return absl::InternalError(absl::StrCat(what, ": ", s.error_message()));
}

uint64_t Sum(const std::vector<BlockView>& views) {
  uint64_t n = 0;
  for (const BlockView& v : views) n += v.size;
  return n;
}

FetchOptions Layout(FetchPath p) {
  FetchOptions o;
  if (p == FetchPath::kGrpc || p == FetchPath::kShm) {
    o.layout = v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR;
  }
  return o;
}

// A fetch of ids from stream id along path p; the reused buffer is *buffer.
FetchOp PathOp(KvmemClient* c, const std::string& id,
               const std::vector<uint64_t>& ids, FetchPath p,
               std::vector<uint8_t>* buffer) {
  return [=]() -> absl::StatusOr<uint64_t> {
    if (p == FetchPath::kGrpcFrames) {
      std::vector<FetchedBlock> blocks;
      grpc::Status s = c->FetchBlocks(id, ids, &blocks);
      if (!s.ok()) return Failed("FetchBlocks", s);
      uint64_t n = 0;
      for (const FetchedBlock& b : blocks) n += b.payload.size();
      return n;
    }
    if (p == FetchPath::kGrpc) {
      std::vector<BlockView> views;
      grpc::Status s = c->FetchInto(id, ids, Layout(p), buffer, &views);
      if (!s.ok()) return Failed("FetchInto", s);
      return Sum(views);
    }
    Delivery d;
    grpc::Status s = c->FetchShared(id, ids, Layout(p), &d);
    if (!s.ok()) return Failed("FetchShared", s);
    const uint64_t n = Sum(d.blocks());
    d.ReleaseLater();  // With the next fetch, as a front end would.
    return n;
  };
}

// The shared-memory bytes of the set equal the gRPC ones (once per tier
// and layout, outside the timing).
absl::Status CheckShmBytes(KvmemClient* c, const std::string& id,
                           const std::vector<uint64_t>& ids, FetchPath p) {
  std::vector<uint8_t> buffer;
  std::vector<BlockView> views;
  FetchOptions o = Layout(p);
  grpc::Status s = c->FetchInto(id, ids, o, &buffer, &views);
  if (!s.ok()) return Failed("FetchInto", s);
  Delivery d;
  s = c->FetchShared(id, ids, o, &d);
  if (!s.ok()) return Failed("FetchShared", s);
  for (size_t i = 0; i < views.size(); ++i) {
    if (d.blocks().size() != views.size() ||
        d.blocks()[i].size != views[i].size ||
        std::memcmp(d.blocks()[i].data, views[i].data, views[i].size) != 0) {
      return absl::DataLossError(absl::StrCat("shared-memory bytes of block ",
                                              ids[i], " of ", id,
                                              " differ from FetchBlocks'"));
    }
  }
  return absl::OkStatus();
}

double MemcpyMbps(uint64_t bytes, int calls) {
  std::string src(bytes, 'x'), dst(bytes, '\0');  // Both faulted in.
  std::vector<double> secs;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return MbPerS(bytes, Median(secs));
}

// A raw unix stream socket between two threads: 1 MiB writes into a
// reused, faulted-in receive buffer.
double UnixSocketMbps(uint64_t bytes, int calls) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  const std::string src(1 << 20, 'x');
  std::string dst(bytes, '\0');
  std::vector<double> secs;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = Clock::now();
    std::thread writer([&] {
      for (uint64_t sent = 0; sent < bytes;) {
        const ssize_t n = ::write(fds[0], src.data(),
                                  std::min<uint64_t>(src.size(), bytes - sent));
        if (n <= 0) return;
        sent += n;
      }
    });
    for (uint64_t got = 0; got < bytes;) {
      const ssize_t n = ::read(fds[1], dst.data() + got, bytes - got);
      if (n <= 0) break;
      got += n;
    }
    writer.join();
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return MbPerS(bytes, Median(secs));
}

// The cheapest FetchBlocks server: every message of the answer built once,
// written back to back.
class TrivialFetchService final : public v1::KvMemory::CallbackService {
 public:
  explicit TrivialFetchService(const FetchGeometry& g) {
    const std::string payload = RandomFp16(g.block_bytes() / 2, 7);
    for (uint32_t b = 0; b < g.blocks; ++b) {
      for (uint64_t off = 0; off < payload.size(); off += 1 << 20) {
        v1::FetchBlocksResponse m;
        m.set_block_id(b);
        m.set_offset(off);
        if (off == 0) {
          m.mutable_block()->set_block_id(b);
          m.mutable_block()->set_payload_bytes(payload.size());
        }
        m.set_data(payload.substr(off, 1 << 20));
        m.set_last_chunk_of_block(off + (1 << 20) >= payload.size());
        messages_.push_back(std::move(m));
      }
    }
  }
  grpc::ServerWriteReactor<v1::FetchBlocksResponse>* FetchBlocks(
      grpc::CallbackServerContext*, const v1::FetchBlocksRequest*) override {
    class Writer final
        : public grpc::ServerWriteReactor<v1::FetchBlocksResponse> {
     public:
      explicit Writer(const std::vector<v1::FetchBlocksResponse>* m) : m_(m) {
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (ok) return Next();
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (i_ == m_->size()) return Finish(grpc::Status::OK);
        StartWrite(&(*m_)[i_++]);
      }
      const std::vector<v1::FetchBlocksResponse>* m_;
      size_t i_ = 0;
    };
    return new Writer(&messages_);
  }

 private:
  std::vector<v1::FetchBlocksResponse> messages_;
};

// The same set from the trivial server, through the same client call.
absl::StatusOr<double> TrivialGrpcMbps(const FetchGeometry& g, int calls,
                                       const std::string& scratch,
                                       FetchPath path_kind) {
  TrivialFetchService service(g);
  const std::string path = scratch + "/trivial-fetch.sock";
  ::unlink(path.c_str());
  grpc::ServerBuilder b;
  b.SetMaxSendMessageSize(64 << 20);
  b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server) return absl::InternalError("cannot start the trivial server");
  auto client = KvmemClient::Connect("unix:" + path);
  std::vector<uint64_t> ids(g.blocks);
  for (uint32_t i = 0; i < g.blocks; ++i) ids[i] = i;
  std::vector<uint8_t> buffer;
  const uint64_t bytes = g.block_bytes() * g.blocks;
  absl::StatusOr<double> secs =
      TimeFetch(PathOp(client.get(), "trivial", ids, path_kind, &buffer), calls,
                bytes, false);
  client.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  ::unlink(path.c_str());
  if (!secs.ok()) return secs.status();
  return MbPerS(bytes, *secs);
}

// The storage engine alone: the set's layer records (a cold block's durable
// form, one per layer) put into a RocksDB store of the server's default
// options in scratch, pushed out of the memtable into blob files, then read
// back with one Get per record, as a cold FetchBlocks must.
absl::StatusOr<double> StoreGetMbps(const FetchGeometry& g, int calls,
                                    const std::string& scratch,
                                    bool rocksdb_check) {
  RocksColdStoreOptions so;
  so.path = scratch +
            (rocksdb_check ? "/get-reference-rocksdb-crc" : "/get-reference");
  so.layer_checksums = !rocksdb_check;
  so.verify_layers_with_rocksdb = rocksdb_check;
  std::filesystem::remove_all(so.path);
  auto store = OpenRocksColdStore(so);
  if (!store.ok()) return store.status();
  const uint64_t layer_bytes = g.block_bytes() / g.layers;
  for (uint32_t b = 0; b < g.blocks; ++b) {
    StreamWrite w;
    w.stream_id = "get-reference";
    for (uint32_t l = 0; l < g.layers; ++l) {
      w.block_layers.push_back(
          {b, l, RandomFp16(layer_bytes / 2, b * 1000 + l)});
    }
    if (absl::Status s = (*store)->Commit(w); !s.ok()) return s;
  }
  // Then twice the write buffer of other records: the set leaves the
  // memtable for blob files, where an old (cold) block's records are.
  const std::string filler = RandomFp16(layer_bytes / 2, 99);
  for (uint64_t put = 0, b = 0; put < 2 * so.write_buffer_bytes; ++b) {
    StreamWrite w;
    w.stream_id = "get-filler";
    for (uint32_t l = 0; l < g.layers; ++l, put += filler.size()) {
      w.block_layers.push_back({b, l, filler});
    }
    if (absl::Status s = (*store)->Commit(w); !s.ok()) return s;
  }
  std::vector<double> secs;
  for (int i = 0; i < calls; ++i) {
    uint64_t got = 0;
    const auto t0 = Clock::now();
    for (uint32_t b = 0; b < g.blocks; ++b) {
      for (uint32_t l = 0; l < g.layers; ++l) {
        absl::StatusOr<std::string> rec =
            (*store)->GetBlockLayer("get-reference", b, l);
        if (!rec.ok()) return rec.status();
        got += rec->size();
      }
    }
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (got != g.block_bytes() * g.blocks) {
      return absl::DataLossError("the Get reference read the wrong size");
    }
  }
  return MbPerS(g.block_bytes() * g.blocks, Median(secs));
}

// One geometry: references, then every path of the three tiers.
absl::StatusOr<FetchFigures> MeasureGeometry(const BenchOptions& o, int calls,
                                             const FetchGeometry& g, bool drop,
                                             KvmemClient* client) {
  FetchFigures f;
  f.g = g;
  f.set_bytes = g.block_bytes() * g.blocks;
  f.memcpy = MemcpyMbps(f.set_bytes, calls);
  f.unix_socket = UnixSocketMbps(f.set_bytes, calls);
  for (FetchPath p : {FetchPath::kGrpc, FetchPath::kGrpcFrames}) {
    absl::StatusOr<double> t = TrivialGrpcMbps(g, calls, o.scratch_dir, p);
    if (!t.ok()) return t.status();
    (p == FetchPath::kGrpc ? f.trivial_grpc : f.trivial_grpc_strings) = *t;
  }
  for (bool rocksdb_check : {false, true}) {
    absl::StatusOr<double> get =
        StoreGetMbps(g, calls, o.scratch_dir, rocksdb_check);
    if (!get.ok()) return get.status();
    (rocksdb_check ? f.store_get_rocksdb_crc : f.store_get) = *get;
  }
  std::vector<uint64_t> ids(g.blocks);
  for (uint32_t i = 0; i < g.blocks; ++i) ids[i] = i;
  std::vector<uint8_t> buffer;
  for (FetchTier tier :
       {FetchTier::kWarm, FetchTier::kCold, FetchTier::kDegraded}) {
    const std::string id = absl::StrCat("fetch-", g.name, "-", TierName(tier));
    if (o.progress) o.progress(absl::StrCat("fetch: ", id));
    absl::Status s = LoadStream(client, id, g, tier, g.blocks + 1);
    if (!s.ok()) return s;
    for (FetchPath p : kFetchPaths) {
      if (p == FetchPath::kShm || p == FetchPath::kShmFrames) {
        s = CheckShmBytes(client, id, ids, p);
        if (!s.ok()) return s;
      }
      absl::StatusOr<double> secs = TimeFetch(
          PathOp(client, id, ids, p, &buffer), calls, f.set_bytes, false);
      if (!secs.ok()) return secs.status();
      f.tier[static_cast<int>(tier)][static_cast<int>(p)] =
          MbPerS(f.set_bytes, *secs);
    }
    if (tier == FetchTier::kCold && drop) {
      absl::StatusOr<double> secs =
          TimeFetch(PathOp(client, id, ids, FetchPath::kGrpc, &buffer),
                    std::max(3, calls / 5), f.set_bytes, true);
      if (secs.ok()) f.cold_dropped = MbPerS(f.set_bytes, *secs);
    }
    client->DeleteStream(id);
  }
  return f;
}

v1::RecallRequest RecallQuery(const std::string& id, size_t dim,
                              const std::vector<float>& q) {
  v1::RecallRequest req;
  req.set_stream_id(id);
  for (size_t j = 0; j < dim; ++j) req.add_query(q[j]);
  req.mutable_budget()->set_max_tokens(614);
  return req;
}

// A camera's recalls frame after frame, its query turning slowly (each
// frame's = 0.95 x the last + 0.31 x fresh noise: variance stays ~1), each
// naming what it holds from the frame before (the blocks, or with `tokens`
// the recalled tokens, TOKEN_LAYER_MAJOR): bytes delivered per recall
// against the whole set's (its blocks', or its tokens').
absl::Status CameraDeltas(KvmemClient* c, const std::string& id, size_t dim,
                          bool tokens, uint64_t token_bytes, FetchReport* r) {
  constexpr int kFrames = 30;
  std::mt19937_64 rng(29);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> q(dim);
  for (float& x : q) x = n(rng);
  std::vector<uint64_t> held;
  std::vector<v1::BlockTokens> held_tokens;
  double delta = 0, full = 0, delta_blocks = 0, full_blocks = 0;
  for (int f = 0; f < kFrames; ++f) {
    for (float& x : q) x = 0.95f * x + 0.31f * n(rng);
    v1::RecallRequest req = RecallQuery(id, dim, q);
    v1::RecallDelivery* d = req.mutable_delivery();
    d->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
    d->set_layout(tokens ? v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR
                         : v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
    for (uint64_t b : held) d->add_held_block_ids(b);
    for (const v1::BlockTokens& t : held_tokens) *d->add_held_tokens() = t;
    v1::RecallResponse resp;
    Delivery got;
    grpc::Status st = c->RecallDelivered(req, &resp, &got);
    if (!st.ok()) return Failed("RecallDelivered", st);
    delta += resp.delivered_bytes();
    delta_blocks += got.blocks().size();
    held.clear();
    if (tokens) {
      held_tokens = RecalledTokens(resp);
      full += TokenCount(held_tokens) * token_bytes;
    } else {
      for (const v1::RecalledBlock& b : resp.blocks()) {
        full += b.payload_bytes();
        held.push_back(b.block_id());
      }
    }
    full_blocks += resp.blocks_size();
  }
  if (tokens) {
    r->token_delta_mean_mib = delta / kFrames / 1048576.0;
    r->token_full_mean_mib = full / kFrames / 1048576.0;
    return absl::OkStatus();
  }
  r->delta_mean_mib = delta / kFrames / 1048576.0;
  r->full_mean_mib = full / kFrames / 1048576.0;
  r->delta_mean_blocks = delta_blocks / kFrames;
  r->full_mean_blocks = full_blocks / kFrames;
  return absl::OkStatus();
}

// Recall of a 614-token budget with its set's bytes, warm tier: delivered
// in the same exchange through shared memory, and Recall + FetchInto.
absl::Status RecallFetch(KvmemClient* client, const FetchGeometry& g, int calls,
                         FetchReport* r) {
  const std::string id = "fetch-recall-" + g.name;
  absl::Status s = LoadStream(client, id, g, FetchTier::kWarm, 13);
  if (!s.ok()) return s;
  v1::StreamStats stats;
  grpc::Status st = client->GetStreamStats(id, &stats);
  if (!st.ok()) return Failed("GetStreamStats", st);
  const size_t dim =
      std::max<size_t>(1, stats.config().index_policy().indexed_layers_size()) *
      g.kv_heads * g.head_dim;
  std::vector<double> shm_ms, grpc_ms, recall_ms, token_ms, engine_ms,
      token_stage_ms;
  const uint64_t token_bytes =
      KvValuesPerToken(g.layers, g.kv_heads, g.head_dim) * 2;  // fp16
  std::mt19937_64 rng(11);
  std::normal_distribution<float> n(0, 1);
  std::vector<uint8_t> buffer;
  auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (int i = 0; i < calls; ++i) {
    std::vector<float> q(dim);
    for (float& x : q) x = n(rng);
    v1::RecallRequest req = RecallQuery(id, dim, q);
    v1::RecallResponse resp;
    auto t0 = Clock::now();
    st = client->Recall(req, &resp);
    recall_ms.push_back(ms_since(t0));
    if (!st.ok()) return Failed("Recall", st);
    engine_ms.push_back(resp.timing().total_us() / 1000.0);
    token_stage_ms.push_back(resp.timing().token_us() / 1000.0);

    t0 = Clock::now();
    st = client->Recall(req, &resp);
    if (!st.ok()) return Failed("Recall", st);
    std::vector<uint64_t> ids;
    for (const auto& b : resp.blocks()) ids.push_back(b.block_id());
    std::vector<BlockView> views;
    FetchOptions fo;
    fo.layout = v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR;
    st = client->FetchInto(id, ids, fo, &buffer, &views);
    grpc_ms.push_back(ms_since(t0));
    if (!st.ok()) return Failed("FetchInto", st);

    req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
    req.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_BLOCK_LAYER_MAJOR);
    Delivery d;
    t0 = Clock::now();
    st = client->RecallDelivered(req, &resp, &d);
    d.ReleaseLater();  // With the next frame's recall.
    shm_ms.push_back(ms_since(t0));
    if (!st.ok()) return Failed("RecallDelivered", st);
    if (Sum(views) != resp.delivered_bytes()) {
      return absl::DataLossError(
          absl::StrCat("recall delivered ", resp.delivered_bytes(),
                       " bytes; FetchInto of ", "its set ", Sum(views)));
    }
    r->recall_fetch_bytes = resp.delivered_bytes();

    // Only the recalled tokens.
    req.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR);
    Delivery td;
    t0 = Clock::now();
    st = client->RecallDelivered(req, &resp, &td);
    td.ReleaseLater();
    token_ms.push_back(ms_since(t0));
    if (!st.ok()) return Failed("RecallDelivered", st);
    r->recall_tokens_bytes = resp.delivered_bytes();
    r->recalled_token_bytes = TokenCount(RecalledTokens(resp)) * token_bytes;
  }
  r->recall_fetch_ms = Summarize(&shm_ms);
  r->recall_fetch_grpc_ms = Summarize(&grpc_ms);
  r->recall_only_ms = Summarize(&recall_ms);
  r->recall_tokens_ms = Summarize(&token_ms);
  r->recall_engine_ms = Summarize(&engine_ms);
  r->recall_token_stage_ms = Summarize(&token_stage_ms);
  s = CameraDeltas(client, id, dim, false, token_bytes, r);
  if (s.ok()) s = CameraDeltas(client, id, dim, true, token_bytes, r);
  client->DeleteStream(id);
  return s;
}

}  // namespace

std::vector<FetchGeometry> DefaultFetchGeometries() {
  return {{"7b", 32, 8, 128, 16, 4, 8}, {"demo", 4, 2, 64, 128, 8, 8}};
}

absl::StatusOr<FetchReport> RunFetchBench(const BenchOptions& o, int calls) {
  FetchReport r;
  r.cpu = CpuModel();
  r.fp16_kernel = Fp16Kernel();
  r.crc_kernel = Crc32cKernel();
  r.calls = calls;
  ClientOptions co;
  co.own_connection = true;
  auto client = KvmemClient::Connect(o.target, co);
  if (!client->WaitForReady(std::chrono::seconds(10))) {
    return absl::UnavailableError("cannot connect to " + o.target);
  }
  // Dropping the page cache only means something for a server on this host.
  r.page_cache_dropped = o.target.rfind("unix:", 0) == 0 &&
                         ::access("/proc/sys/vm/drop_caches", W_OK) == 0;
  for (const FetchGeometry& g : DefaultFetchGeometries()) {
    absl::StatusOr<FetchFigures> f =
        MeasureGeometry(o, calls, g, r.page_cache_dropped, client.get());
    if (!f.ok()) return f.status();
    r.geometries.push_back(*f);
  }
  absl::Status s =
      RecallFetch(client.get(), DefaultFetchGeometries()[0], calls, &r);
  if (!s.ok()) return s;
  return r;
}

const char* FetchPathName(FetchPath p) {
  switch (p) {
    case FetchPath::kGrpc:
      return "grpc";
    case FetchPath::kGrpcFrames:
      return "grpc_frame_major";
    case FetchPath::kShm:
      return "shm";
    case FetchPath::kShmFrames:
      return "shm_frame_major";
  }
  return "";
}

std::string FetchJson(const FetchReport& r) {
  JsonWriter w;
  w.Object(/*multiline=*/true);
  w.Key("cpu").Str(r.cpu);
  w.Key("fp16_kernel").Str(r.fp16_kernel);
  w.Key("crc32c_kernel").Str(r.crc_kernel);
  w.Key("calls").Int(r.calls);
  for (const FetchFigures& f : r.geometries) {
    // The 7B geometry's figures carry the plain keys.
    const std::string p =
        f.g.name == "7b" ? "fetch_" : absl::StrCat("fetch_", f.g.name, "_");
    auto mbps = [&](const std::string& name, double v) {
      w.Key(absl::StrCat(p, name, "_mb_per_s")).Num(v, 0);
    };
    w.Key(p + "set_mib").Num(f.set_bytes / 1048576.0, 1);
    mbps("memcpy", f.memcpy);
    mbps("unix_socket", f.unix_socket);
    mbps("trivial_grpc", f.trivial_grpc);
    mbps("trivial_grpc_strings", f.trivial_grpc_strings);
    mbps("store_get", f.store_get);
    mbps("store_get_rocksdb_crc", f.store_get_rocksdb_crc);
    w.Key(p + "cold_dropped_mb_per_s");
    if (r.page_cache_dropped) {
      w.Num(f.cold_dropped, 0);
    } else {
      w.Null();
    }
    for (int t = 0; t < 3; ++t) {
      for (FetchPath path : kFetchPaths) {
        // fetch_cold_mb_per_s is the cold tier's gRPC figure (the historic
        // key); the other tiers name theirs.
        const std::string tier = TierName(static_cast<FetchTier>(t));
        mbps(path == FetchPath::kGrpc && t > 0
                 ? tier
                 : absl::StrCat(tier, "_", FetchPathName(path)),
             f.tier[t][static_cast<int>(path)]);
      }
    }
  }
  w.Key("recall_fetch_7b_mib").Num(r.recall_fetch_bytes / 1048576.0, 1);
  w.Key("recall_fetch_7b_p50_ms").Num(r.recall_fetch_ms.p50_us, 2);
  w.Key("recall_fetch_7b_p99_ms").Num(r.recall_fetch_ms.p99_us, 2);
  w.Key("recall_fetch_7b_grpc_p50_ms").Num(r.recall_fetch_grpc_ms.p50_us, 2);
  w.Key("recall_fetch_7b_grpc_p99_ms").Num(r.recall_fetch_grpc_ms.p99_us, 2);
  w.Key("recall_only_7b_p50_ms").Num(r.recall_only_ms.p50_us, 2);
  w.Key("recall_engine_7b_p50_ms").Num(r.recall_engine_ms.p50_us, 2);
  w.Key("recall_token_stage_7b_p50_ms").Num(r.recall_token_stage_ms.p50_us, 2);
  w.Key("delta_recall_mean_mib").Num(r.delta_mean_mib, 2);
  w.Key("full_recall_mean_mib").Num(r.full_mean_mib, 2);
  w.Key("delta_recall_mean_blocks").Num(r.delta_mean_blocks, 2);
  w.Key("full_recall_mean_blocks").Num(r.full_mean_blocks, 2);
  w.Key("recall_tokens_7b_mib").Num(r.recall_tokens_bytes / 1048576.0, 1);
  w.Key("recalled_token_7b_mib").Num(r.recalled_token_bytes / 1048576.0, 1);
  w.Key("recall_tokens_7b_p50_ms").Num(r.recall_tokens_ms.p50_us, 2);
  w.Key("recall_tokens_7b_p99_ms").Num(r.recall_tokens_ms.p99_us, 2);
  w.Key("token_delta_recall_mean_mib").Num(r.token_delta_mean_mib, 2);
  w.Key("token_full_recall_mean_mib").Num(r.token_full_mean_mib, 2);
  w.EndObject();
  return w.Take();
}

std::string FetchText(const FetchReport& r) {
  std::string s = absl::StrFormat(
      "kvmem bench --fetch (%s, fp16 %s, crc32c %s; median of %d calls, "
      "MB/s)\n",
      r.cpu, r.fp16_kernel, r.crc_kernel, r.calls);
  for (const FetchFigures& f : r.geometries) {
    absl::StrAppendFormat(
        &s,
        "  %-5s %u x %u x %u fp16, %u blocks = %.1f MiB\n"
        "        memcpy %.0f | unix socket %.0f | trivial gRPC %.0f (into a "
        "buffer), %.0f (strings)\n"
        "        RocksDB Get %.0f (kvmem's CRC32C, %s), %.0f (RocksDB's own "
        "check)\n"
        "        %-9s %8s %9s %8s %9s   (gRPC and shm: layer-major; _f: "
        "frame-major)\n",
        f.g.name, f.g.layers, f.g.kv_heads, f.g.head_dim, f.g.blocks,
        f.set_bytes / 1048576.0, f.memcpy, f.unix_socket, f.trivial_grpc,
        f.trivial_grpc_strings, f.store_get, r.crc_kernel,
        f.store_get_rocksdb_crc, "tier", "gRPC", "gRPC_f", "shm", "shm_f");
    for (int t = 0; t < 3; ++t) {
      absl::StrAppendFormat(&s, "        %-9s %8.0f %9.0f %8.0f %9.0f\n",
                            TierName(static_cast<FetchTier>(t)), f.tier[t][0],
                            f.tier[t][1], f.tier[t][2], f.tier[t][3]);
    }
    const double cold = f.tier[1][0], degraded = f.tier[2][0];
    absl::StrAppendFormat(
        &s,
        "        warm gRPC %.2fx trivial | warm shm %.2fx memcpy | cold shm "
        "%.2fx Get | cold gRPC %.2fx min(Get, trivial), %.2fx RocksDB's own "
        "Get | degraded %.2fx cold's time | cold, cache dropped %s\n",
        f.trivial_grpc > 0 ? f.tier[0][0] / f.trivial_grpc : 0,
        f.memcpy > 0 ? f.tier[0][2] / f.memcpy : 0,
        f.store_get > 0 ? f.tier[1][2] / f.store_get : 0,
        std::min(f.store_get, f.trivial_grpc) > 0
            ? cold / std::min(f.store_get, f.trivial_grpc)
            : 0,
        f.store_get_rocksdb_crc > 0 ? cold / f.store_get_rocksdb_crc : 0,
        degraded > 0 ? cold / degraded : 0,
        r.page_cache_dropped ? absl::StrFormat("%.0f", f.cold_dropped)
                             : std::string("not permitted"));
  }
  absl::StrAppendFormat(
      &s,
      "  recall + fetch, 7B, 614-token budget (%.1f MiB), a frame at 3 fps "
      "is 333 ms:\n"
      "        shared memory, one exchange: p50 %.1f ms, p99 %.1f ms | Recall "
      "+ FetchInto: p50 %.1f ms, p99 %.1f ms | the recall alone: p50 %.1f "
      "ms (in the engine %.1f, its token stage %.1f)\n"
      "  a camera's recalls naming the blocks they hold (30 frames): %.2f "
      "MiB (%.2f blocks) delivered per recall, against %.2f MiB (%.2f "
      "blocks) for whole sets\n",
      r.recall_fetch_bytes / 1048576.0, r.recall_fetch_ms.p50_us,
      r.recall_fetch_ms.p99_us, r.recall_fetch_grpc_ms.p50_us,
      r.recall_fetch_grpc_ms.p99_us, r.recall_only_ms.p50_us,
      r.recall_engine_ms.p50_us, r.recall_token_stage_ms.p50_us,
      r.delta_mean_mib, r.delta_mean_blocks, r.full_mean_mib,
      r.full_mean_blocks);
  absl::StrAppendFormat(
      &s,
      "  the same recall delivering only its tokens (TOKEN_LAYER_MAJOR, "
      "shared memory): p50 %.1f ms, p99 %.1f ms, %.1f MiB moved for %.1f "
      "MiB of recalled tokens (%.3fx)\n"
      "  a camera's recalls naming the tokens they hold: %.2f MiB delivered "
      "per recall, against %.2f MiB for whole token sets\n",
      r.recall_tokens_ms.p50_us, r.recall_tokens_ms.p99_us,
      r.recall_tokens_bytes / 1048576.0, r.recalled_token_bytes / 1048576.0,
      r.recalled_token_bytes > 0
          ? static_cast<double>(r.recall_tokens_bytes) / r.recalled_token_bytes
          : 0.0,
      r.token_delta_mean_mib, r.token_full_mean_mib);
  return s;
}

}  // namespace kvmem
