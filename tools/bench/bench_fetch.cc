#include "tools/bench/bench_fetch.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/kvmem_client.h"
#include "engine/codec/dtype.h"
#include "storage/rocks_cold_store.h"
#include "tools/bench/bench_inproc.h"

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

// n fp16 values in [-1, 1].
std::string RandomFp16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = u(rng);
  std::string out(2 * n, '\0');
  EncodeFromFloat(f.data(), n, DType::kFp16,
                  reinterpret_cast<uint8_t*>(out.data()));
  return out;
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
      size_t{g.layers} * 2 * g.kv_heads * g.head_dim * g.tokens_per_frame;
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

// Median seconds of FetchBlocks of ids through client; each call's bytes
// checked against want_bytes.
absl::StatusOr<double> TimeFetch(KvmemClient* client, const std::string& id,
                                 const std::vector<uint64_t>& ids, int calls,
                                 uint64_t want_bytes, bool drop_cache) {
  std::vector<double> secs;
  for (int i = 0; i < calls; ++i) {
    if (drop_cache && !DropPageCache()) {
      return absl::PermissionDeniedError("cannot drop the page cache");
    }
    std::vector<FetchedBlock> blocks;
    const auto t0 = Clock::now();
    grpc::Status s = client->FetchBlocks(id, ids, &blocks);
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!s.ok())
      return absl::InternalError("FetchBlocks: " + s.error_message());
    uint64_t got = 0;
    for (const FetchedBlock& b : blocks) got += b.payload.size();
    if (got != want_bytes) {
      return absl::DataLossError(absl::StrCat(
          "FetchBlocks of ", id, " gave ", got, " bytes, want ", want_bytes));
    }
  }
  return Median(secs);
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
                                       const std::string& scratch) {
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
  absl::StatusOr<double> secs = TimeFetch(client.get(), "trivial", ids, calls,
                                          g.block_bytes() * g.blocks, false);
  client.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  ::unlink(path.c_str());
  if (!secs.ok()) return secs.status();
  return MbPerS(g.block_bytes() * g.blocks, *secs);
}

// The storage engine alone: the set's layer records (a cold block's durable
// form, one per layer) put into a RocksDB store of the server's default
// options in scratch, pushed out of the memtable into blob files, then read
// back with one Get per record, as a cold FetchBlocks must.
absl::StatusOr<double> StoreGetMbps(const FetchGeometry& g, int calls,
                                    const std::string& scratch) {
  RocksColdStoreOptions so;
  so.path = scratch + "/get-reference";
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

// One geometry: references, then the three tiers.
absl::StatusOr<FetchFigures> MeasureGeometry(const BenchOptions& o, int calls,
                                             const FetchGeometry& g, bool drop,
                                             KvmemClient* client) {
  FetchFigures f;
  f.g = g;
  f.set_bytes = g.block_bytes() * g.blocks;
  f.memcpy = MemcpyMbps(f.set_bytes, calls);
  f.unix_socket = UnixSocketMbps(f.set_bytes, calls);
  absl::StatusOr<double> trivial = TrivialGrpcMbps(g, calls, o.scratch_dir);
  if (!trivial.ok()) return trivial.status();
  f.trivial_grpc = *trivial;
  absl::StatusOr<double> get = StoreGetMbps(g, calls, o.scratch_dir);
  if (!get.ok()) return get.status();
  f.store_get = *get;
  std::vector<uint64_t> ids(g.blocks);
  for (uint32_t i = 0; i < g.blocks; ++i) ids[i] = i;
  for (FetchTier tier :
       {FetchTier::kWarm, FetchTier::kCold, FetchTier::kDegraded}) {
    const std::string id = absl::StrCat("fetch-", g.name, "-", TierName(tier));
    if (o.progress) o.progress(absl::StrCat("fetch: ", id));
    absl::Status s = LoadStream(client, id, g, tier, g.blocks + 1);
    if (!s.ok()) return s;
    absl::StatusOr<double> secs =
        TimeFetch(client, id, ids, calls, f.set_bytes, false);
    if (!secs.ok()) return secs.status();
    const double mbps = MbPerS(f.set_bytes, *secs);
    (tier == FetchTier::kWarm   ? f.warm_grpc
     : tier == FetchTier::kCold ? f.cold
                                : f.degraded) = mbps;
    if (tier == FetchTier::kCold && drop) {
      secs =
          TimeFetch(client, id, ids, std::max(3, calls / 5), f.set_bytes, true);
      if (secs.ok()) f.cold_dropped = MbPerS(f.set_bytes, *secs);
    }
    client->DeleteStream(id);
  }
  return f;
}

// Recall of a 614-token budget + FetchBlocks of its set, warm tier.
absl::Status RecallFetch(KvmemClient* client, const FetchGeometry& g, int calls,
                         FetchReport* r) {
  const std::string id = "fetch-recall-" + g.name;
  absl::Status s = LoadStream(client, id, g, FetchTier::kWarm, 13);
  if (!s.ok()) return s;
  v1::StreamStats stats;
  grpc::Status st = client->GetStreamStats(id, &stats);
  if (!st.ok()) return absl::InternalError(st.error_message());
  const size_t dim =
      std::max<size_t>(1, stats.config().index_policy().indexed_layers_size()) *
      g.kv_heads * g.head_dim;
  std::vector<double> ms;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> n(0, 1);
  for (int i = 0; i < calls; ++i) {
    v1::RecallRequest req;
    req.set_stream_id(id);
    for (size_t j = 0; j < dim; ++j) req.add_query(n(rng));
    req.mutable_budget()->set_max_tokens(614);
    const auto t0 = Clock::now();
    v1::RecallResponse resp;
    st = client->Recall(req, &resp);
    if (!st.ok()) return absl::InternalError("Recall: " + st.error_message());
    std::vector<uint64_t> ids;
    for (const auto& b : resp.blocks()) ids.push_back(b.block_id());
    std::vector<FetchedBlock> blocks;
    st = client->FetchBlocks(id, ids, &blocks);
    ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!st.ok())
      return absl::InternalError("FetchBlocks: " + st.error_message());
    r->recall_fetch_bytes = 0;
    for (const FetchedBlock& b : blocks)
      r->recall_fetch_bytes += b.payload.size();
  }
  r->recall_fetch_ms = Summarize(&ms);
  client->DeleteStream(id);
  return absl::OkStatus();
}

}  // namespace

std::vector<FetchGeometry> DefaultFetchGeometries() {
  return {{"7b", 32, 8, 128, 16, 4, 8}, {"demo", 4, 2, 64, 128, 8, 8}};
}

absl::StatusOr<FetchReport> RunFetchBench(const BenchOptions& o, int calls) {
  FetchReport r;
  r.cpu = CpuModel();
  r.fp16_kernel = Fp16Kernel();
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

std::string FetchJson(const FetchReport& r) {
  std::string s = absl::StrFormat(
      "{\n  \"cpu\": \"%s\",\n  \"fp16_kernel\": \"%s\",\n  \"calls\": %d,\n",
      r.cpu, r.fp16_kernel, r.calls);
  for (const FetchFigures& f : r.geometries) {
    // The 7B geometry's figures carry the plain keys.
    const std::string p =
        f.g.name == "7b" ? "fetch_" : absl::StrCat("fetch_", f.g.name, "_");
    absl::StrAppendFormat(
        &s,
        "  \"%sset_mib\": %.1f,\n  \"%smemcpy_mb_per_s\": %.0f,\n"
        "  \"%sunix_socket_mb_per_s\": %.0f,\n"
        "  \"%strivial_grpc_mb_per_s\": %.0f,\n"
        "  \"%swarm_grpc_mb_per_s\": %.0f,\n"
        "  \"%swarm_shm_mb_per_s\": null,\n"
        "  \"%sstore_get_mb_per_s\": %.0f,\n"
        "  \"%scold_mb_per_s\": %.0f,\n  \"%scold_dropped_mb_per_s\": %s,\n"
        "  \"%sdegraded_mb_per_s\": %.0f,\n",
        p, f.set_bytes / 1048576.0, p, f.memcpy, p, f.unix_socket, p,
        f.trivial_grpc, p, f.warm_grpc, p, p, f.store_get, p, f.cold, p,
        r.page_cache_dropped ? absl::StrFormat("%.0f", f.cold_dropped) : "null",
        p, f.degraded);
  }
  absl::StrAppendFormat(
      &s,
      "  \"recall_fetch_7b_mib\": %.1f,\n  \"recall_fetch_7b_p50_ms\": %.2f,\n"
      "  \"recall_fetch_7b_p99_ms\": %.2f\n}\n",
      r.recall_fetch_bytes / 1048576.0, r.recall_fetch_ms.p50_us,
      r.recall_fetch_ms.p99_us);
  return s;
}

std::string FetchText(const FetchReport& r) {
  std::string s = absl::StrFormat(
      "kvmem bench --fetch (%s, fp16 %s; median of %d calls, MB/s)\n", r.cpu,
      r.fp16_kernel, r.calls);
  for (const FetchFigures& f : r.geometries) {
    absl::StrAppendFormat(
        &s,
        "  %-5s %u x %u x %u fp16, %u blocks = %.1f MiB\n"
        "        memcpy %.0f | unix socket %.0f | trivial gRPC %.0f | "
        "RocksDB Get %.0f\n"
        "        warm %.0f (%.2fx trivial) | cold %.0f (%.2fx Get) | cold, "
        "cache "
        "dropped %s | degraded %.0f (%.2fx cold's time)\n",
        f.g.name, f.g.layers, f.g.kv_heads, f.g.head_dim, f.g.blocks,
        f.set_bytes / 1048576.0, f.memcpy, f.unix_socket, f.trivial_grpc,
        f.store_get, f.warm_grpc,
        f.trivial_grpc > 0 ? f.warm_grpc / f.trivial_grpc : 0, f.cold,
        f.store_get > 0 ? f.cold / f.store_get : 0,
        r.page_cache_dropped ? absl::StrFormat("%.0f", f.cold_dropped)
                             : std::string("not permitted"),
        f.degraded, f.degraded > 0 ? f.cold / f.degraded : 0);
  }
  absl::StrAppendFormat(
      &s,
      "  recall + fetch, 7B, 614-token budget (%.1f MiB): p50 %.1f ms, p99 "
      "%.1f ms (a frame at 3 fps: 333 ms)\n",
      r.recall_fetch_bytes / 1048576.0, r.recall_fetch_ms.p50_us,
      r.recall_fetch_ms.p99_us);
  return s;
}

}  // namespace kvmem
