// `kvmem demo`: streams a synthetic multi-camera workload through a
// kvmem-server (a local one on a unix socket unless --addr is given), one
// Session per camera, recalling after every frame, and reports recall quality
// against the workload's ground truth, latency, throughput and memory.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/percentile.h"
#include "base/timing.h"
#include "client/cpp/kvmem_client.h"
#include "tools/bench/bench_util.h"
#include "tools/cli/cli.h"
#include "tools/common/demo_workload.h"
#include "tools/common/json_writer.h"
#include "tools/common/server_process.h"
#include "tools/common/terminal.h"

ABSL_FLAG(int, cameras, 4,
          "demo: camera streams run in parallel; bench: the most cameras "
          "bench --cameras tries.");
ABSL_FLAG(int, frames, 240, "demo: frames per camera.");
ABSL_FLAG(int, places, 6, "demo: distinct places each camera cuts between.");
ABSL_FLAG(std::string, data_dir, "./kvmem-data",
          "demo: RocksDB directory of the local server.");
ABSL_FLAG(uint64_t, seed, 7, "demo: workload seed.");
ABSL_FLAG(uint32_t, layers, 4, "demo: model layers.");
ABSL_FLAG(uint32_t, kv_heads, 2, "demo: KV heads per layer.");
ABSL_FLAG(uint32_t, head_dim, 64, "demo: elements per head.");
ABSL_FLAG(uint32_t, tokens_per_frame, 32, "demo: tokens per frame.");
ABSL_FLAG(uint32_t, hot_window_tokens, 512,
          "demo: the front end's hot window, in tokens.");
ABSL_FLAG(uint32_t, frames_per_block, 4,
          "demo: most frames a (shot) block may hold.");
ABSL_FLAG(uint64_t, warm_budget_bytes, 1 << 20,
          "demo: RAM for warm blocks, per camera.");
ABSL_FLAG(uint64_t, cold_budget_bytes, 4 << 20,
          "demo: full-precision bytes on disk per camera; beyond, blocks "
          "degrade to int8.");
ABSL_FLAG(uint32_t, recall_tokens, 160,
          "demo: recall token budget (V-Rex suggests 10-30 % of the window).");

namespace kvmem {
namespace {

struct CameraResult {
  grpc::Status status;
  uint64_t bytes = 0;
  double append_seconds = 0;  // Time inside Append calls (service time).
  std::vector<double> append_us;
  int reid_queries = 0, reid_hits = 0;
  int recalled = 0, recalled_relevant = 0;
  double random_precision_sum = 0;
  std::vector<double> rtt_us, engine_us;
  std::vector<uint64_t> last_blocks;
};

// Majority place of a block's frames.
int BlockPlace(const CameraWorkload& w, const v1::RecalledBlock& b) {
  std::vector<int> count(64, 0);
  int best = w.PlaceOf(static_cast<int>(b.first_frame()));
  for (uint64_t f = b.first_frame(); f <= b.last_frame(); ++f) {
    const int p = w.PlaceOf(static_cast<int>(f));
    if (++count[p] > count[best]) best = p;
  }
  return best;
}

void RunCamera(KvmemClient* client, int cam, const DemoGeometry& g, int frames,
               int places, uint64_t seed, ProgressBar* progress,
               CameraResult* out) {
  const std::string id = absl::StrCat("demo-cam-", cam);
  CameraWorkload w(seed * 1000 + cam, g, places, frames);
  const v1::StreamConfig config = DemoStreamConfig(g);
  std::unique_ptr<SessionClient> session;
  out->status = client->StartSession(id, &config, &session);
  if (!out->status.ok()) return;
  for (int i = 0; i < frames; ++i) {
    OutgoingFrame f = w.MakeFrame(i);
    out->bytes += f.payload.size();
    v1::AppendAck ack;
    const auto a0 = SteadyClock::now();
    out->status = session->Append(f, &ack);
    if (!out->status.ok()) return;
    const double us = MicrosSince(a0);
    out->append_us.push_back(us);
    out->append_seconds += us / 1e6;

    v1::RecallRequest req;
    for (float x : w.MakeQuery(i)) req.add_query(x);
    *req.mutable_signals() = f.header.signals();  // What the camera sees now.
    v1::RecallResponse resp;
    const auto r0 = SteadyClock::now();
    out->status = session->Recall(req, &resp);
    if (!out->status.ok()) return;
    out->rtt_us.push_back(MicrosSince(r0));
    out->engine_us.push_back(resp.timing().total_us());

    // Ground truth, per frame: frames whose blocks are surely sealed and out
    // of the hot window (a block holds at most frames_per_block frames), and
    // which of them show the place the camera sees now.
    const int64_t out_of_window =
        static_cast<int64_t>(i + 1) -
        static_cast<int64_t>(g.hot_window_tokens / g.tokens_per_frame) -
        static_cast<int64_t>(g.frames_per_block);
    int relevant = 0;
    for (int64_t j = 0; j < out_of_window; ++j) {
      relevant += w.PlaceOf(static_cast<int>(j)) == w.PlaceOf(i);
    }
    for (const auto& b : resp.blocks()) {
      ++out->recalled;
      out->recalled_relevant += BlockPlace(w, b) == w.PlaceOf(i);
    }
    if (relevant > 0) {
      ++out->reid_queries;
      out->random_precision_sum +=
          static_cast<double>(relevant) / out_of_window;
      if (resp.blocks_size() > 0 &&
          BlockPlace(w, resp.blocks(0)) == w.PlaceOf(i)) {
        ++out->reid_hits;
      }
    }
    out->last_blocks.clear();
    for (const auto& b : resp.blocks())
      out->last_blocks.push_back(b.block_id());
    progress->Add();
  }
  out->status = session->Finish();
}

void TierJson(const v1::TierStats& t, JsonWriter* w) {
  w->Object().Key("blocks").UInt(t.blocks()).Key("bytes").UInt(t.bytes());
  w->EndObject();
}

// One stream's tiers and policy counters, as `kvmem demo --json` prints them.
void StreamJson(const v1::StreamStats& s, JsonWriter* w) {
  const v1::PolicyStats& p = s.policy();
  w->Object();
  w->Key("stream_id").Str(s.stream_id());
  w->Key("sealed_blocks").UInt(s.sealed_blocks());
  w->Key("tiers").Object();
  TierJson(s.warm(), &w->Key("warm"));
  TierJson(s.cold(), &w->Key("cold"));
  TierJson(s.degraded(), &w->Key("degraded"));
  w->EndObject();
  TierJson(s.evicted(), &w->Key("evicted"));
  w->Key("policy").Object();
  w->Key("demotions").UInt(p.demotions());
  w->Key("degradations").UInt(p.degradations());
  w->Key("promotions").UInt(p.promotions());
  w->Key("promotions_declined").UInt(p.promotions_declined());
  w->Key("staged").UInt(p.staged());
  w->Key("stage_hits").UInt(p.stage_hits());
  w->Key("stage_misses").UInt(p.stage_misses());
  w->Key("rebuilds").UInt(p.rebuilds());
  w->Key("shot_cuts").UInt(p.shot_cuts());
  w->Key("recall_us_p50").UInt(p.recall_us_p50());
  w->Key("recall_us_p99").UInt(p.recall_us_p99());
  w->EndObject();
  w->EndObject();
}

uint64_t RssBytes(pid_t pid) {
  // KiB / 1024 in a double: times 2^20 gives the bytes exactly.
  return static_cast<uint64_t>(SampleProcess(pid).rss_mib * 1048576.0);
}

// What a demo run measured, over all cameras.
struct DemoFigures {
  int cameras = 0, frames = 0;
  DemoGeometry g;
  CameraResult total;
  double wall = 0;
  std::vector<v1::StreamStats> stats;
  v1::StreamStats sum;  // Tiers and counters over all cameras.
  uint64_t rss = 0;
  size_t fetched_blocks = 0;
  uint64_t fetched_bytes = 0, expected_bytes = 0;
};

// Starts a local kvmem-server unless --addr names one; *addr receives the
// target. Returns 0 or the exit status.
int StartDemoServer(std::unique_ptr<ServerProcess>* server, std::string* addr) {
  *addr = absl::GetFlag(FLAGS_addr);
  if (!addr->empty()) return 0;
  ServerProcessOptions opts;
  opts.binary = FindServerBinary();
  opts.data_dir = absl::GetFlag(FLAGS_data_dir);
  opts.unix_socket = absl::StrCat("/tmp/kvmem-demo-", ::getpid(), ".sock");
  opts.log_file = opts.data_dir + ".log";
  *server = std::make_unique<ServerProcess>(opts);
  std::string error;
  if (!(*server)->Start(std::chrono::seconds(60), &error)) {
    std::fprintf(stderr, "kvmem demo: %s (%s, log %s)\n", error.c_str(),
                 opts.binary.c_str(), opts.log_file.c_str());
    return 1;
  }
  *addr = (*server)->target();
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("started %s on %s (data in %s, log %s)\n", opts.binary.c_str(),
                addr->c_str(), opts.data_dir.c_str(), opts.log_file.c_str());
  }
  return 0;
}

DemoGeometry DemoGeometryFromFlags() {
  DemoGeometry g;
  g.layers = absl::GetFlag(FLAGS_layers);
  g.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  g.head_dim = absl::GetFlag(FLAGS_head_dim);
  g.tokens_per_frame = absl::GetFlag(FLAGS_tokens_per_frame);
  g.hot_window_tokens = absl::GetFlag(FLAGS_hot_window_tokens);
  g.frames_per_block = absl::GetFlag(FLAGS_frames_per_block);
  g.recall_max_tokens = absl::GetFlag(FLAGS_recall_tokens);
  g.warm_budget_bytes = absl::GetFlag(FLAGS_warm_budget_bytes);
  g.cold_budget_bytes = absl::GetFlag(FLAGS_cold_budget_bytes);
  return g;
}

// Every camera in its own thread; their results summed into f->total.
grpc::Status RunCameras(KvmemClient* client, int places, DemoFigures* f,
                        std::vector<CameraResult>* results) {
  results->resize(f->cameras);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  {
    ProgressBar progress(
        "kvmem demo", static_cast<uint64_t>(f->cameras) * f->frames, "frames");
    for (int c = 0; c < f->cameras; ++c) {
      threads.emplace_back(RunCamera, client, c, f->g, f->frames, places,
                           absl::GetFlag(FLAGS_seed), &progress,
                           &(*results)[c]);
    }
    for (auto& t : threads) t.join();
  }
  f->wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
  CameraResult& total = f->total;
  for (auto& r : *results) {
    if (!r.status.ok()) return r.status;
    total.bytes += r.bytes;
    total.append_seconds = std::max(total.append_seconds, r.append_seconds);
    total.append_us.insert(total.append_us.end(), r.append_us.begin(),
                           r.append_us.end());
    total.reid_queries += r.reid_queries;
    total.reid_hits += r.reid_hits;
    total.recalled += r.recalled;
    total.recalled_relevant += r.recalled_relevant;
    total.random_precision_sum += r.random_precision_sum;
    total.rtt_us.insert(total.rtt_us.end(), r.rtt_us.begin(), r.rtt_us.end());
    total.engine_us.insert(total.engine_us.end(), r.engine_us.begin(),
                           r.engine_us.end());
  }
  return grpc::Status::OK;
}

// Each camera's stats, and their tiers and counters summed.
grpc::Status CollectStats(KvmemClient* client, DemoFigures* f) {
  f->stats.resize(f->cameras);
  v1::StreamStats& sum = f->sum;
  for (int c = 0; c < f->cameras; ++c) {
    const v1::StreamStats& st = f->stats[c];
    grpc::Status s =
        client->GetStreamStats(absl::StrCat("demo-cam-", c), &f->stats[c]);
    if (!s.ok()) return s;
    for (auto [from, to] :
         {std::make_pair(&st.warm(), sum.mutable_warm()),
          std::make_pair(&st.cold(), sum.mutable_cold()),
          std::make_pair(&st.degraded(), sum.mutable_degraded())}) {
      to->set_blocks(to->blocks() + from->blocks());
      to->set_bytes(to->bytes() + from->bytes());
    }
    v1::PolicyStats* p = sum.mutable_policy();
    const v1::PolicyStats& q = st.policy();
    p->set_demotions(p->demotions() + q.demotions());
    p->set_degradations(p->degradations() + q.degradations());
    p->set_promotions(p->promotions() + q.promotions());
    p->set_promotions_declined(p->promotions_declined() +
                               q.promotions_declined());
    p->set_staged(p->staged() + q.staged());
    p->set_stage_hits(p->stage_hits() + q.stage_hits());
    p->set_shot_cuts(p->shot_cuts() + q.shot_cuts());
    sum.set_sealed_blocks(sum.sealed_blocks() + st.sealed_blocks());
  }
  return grpc::Status::OK;
}

// The derived figures both outputs print.
struct DemoRates {
  uint64_t bytes_per_token = 0;
  double window_mib = 0, budget_mib = 0, hit = 0, prec = 0, rnd = 0;
  double p50 = 0, p99 = 0, e50 = 0, e99 = 0, mbps = 0, service_mbps = 0;
  double a50 = 0, a99 = 0;
};

DemoRates RatesOf(DemoFigures& f) {
  CameraResult& total = f.total;
  const DemoGeometry& g = f.g;
  DemoRates d;
  d.bytes_per_token =
      static_cast<uint64_t>(g.layers) * 2 * g.kv_heads * g.head_dim * 2;
  d.window_mib = g.hot_window_tokens * d.bytes_per_token / 1048576.0;
  d.budget_mib = f.stats[0].config().recall_defaults().max_tokens() *
                 d.bytes_per_token / 1048576.0;
  d.hit = total.reid_queries ? 100.0 * total.reid_hits / total.reid_queries : 0;
  d.prec =
      total.recalled ? 100.0 * total.recalled_relevant / total.recalled : 0;
  d.rnd = total.reid_queries
              ? 100.0 * total.random_precision_sum / total.reid_queries
              : 0;
  d.p50 = Percentile(total.rtt_us, 0.50);
  d.p99 = Percentile(total.rtt_us, 0.99);
  d.e50 = Percentile(total.engine_us, 0.50);
  d.e99 = Percentile(total.engine_us, 0.99);
  d.mbps = total.bytes / 1048576.0 / f.wall;
  // Cameras append in parallel: service throughput is the bytes over the
  // longest time any camera spent inside Append calls.
  d.service_mbps = total.bytes / 1048576.0 / total.append_seconds;
  d.a50 = Percentile(total.append_us, 0.50);
  d.a99 = Percentile(total.append_us, 0.99);
  return d;
}

void PrintDemoJson(DemoFigures& f) {
  const DemoRates d = RatesOf(f);
  const CameraResult& total = f.total;
  const v1::StreamStats& s0 = f.stats[0];
  JsonWriter w;
  w.Object();
  w.Key("cameras").Int(f.cameras);
  w.Key("frames_per_camera").Int(f.frames);
  w.Key("wall_seconds").Num(f.wall, 3);
  w.Key("ingest_mib_per_s").Num(d.mbps, 2);
  w.Key("frames_per_s").Num(f.cameras * f.frames / f.wall, 1);
  w.Key("append_service_mib_per_s").Num(d.service_mbps, 2);
  w.Key("append_us_p50").Num(d.a50, 1);
  w.Key("append_us_p99").Num(d.a99, 1);
  w.Key("reid_queries").Int(total.reid_queries);
  w.Key("reid_top1_hits").Int(total.reid_hits);
  w.Key("reid_top1_pct").Num(d.hit, 2);
  w.Key("random_top1_pct").Num(d.rnd, 2);
  w.Key("window_only_pct").Num(0.0, 1);
  w.Key("recalled_blocks").Int(total.recalled);
  w.Key("recalled_precision_pct").Num(d.prec, 2);
  w.Key("recall_rtt_us_p50").Num(d.p50, 1);
  w.Key("recall_rtt_us_p99").Num(d.p99, 1);
  w.Key("engine_us_p50").Num(d.e50, 1);
  w.Key("engine_us_p99").Num(d.e99, 1);
  w.Key("kv_stored_mib").Num(total.bytes / 1048576.0, 3);
  w.Key("hot_window_mib").Num(d.window_mib, 3);
  w.Key("recall_budget_mib").Num(d.budget_mib, 3);
  w.Key("summary_kib_per_stream").Num(s0.summary_bytes() / 1024.0, 2);
  w.Key("token_code_kib_per_stream").Num(s0.token_code_bytes() / 1024.0, 2);
  w.Key("index_kib_per_stream").Num(s0.index().bytes() / 1024.0, 2);
  w.Key("server_rss_mib").Num(f.rss / 1048576.0, 1);
  w.Key("fetched_bytes").UInt(f.fetched_bytes);
  w.Key("fetched_expected_bytes").UInt(f.expected_bytes);
  w.Key("streams").Array();
  for (const v1::StreamStats& st : f.stats) StreamJson(st, &w);
  w.EndArray();
  w.EndObject();
  std::printf("%s", w.Take().c_str());
}

void PrintDemoText(DemoFigures& f) {
  const DemoRates d = RatesOf(f);
  const CameraResult& total = f.total;
  const DemoGeometry& g = f.g;
  const v1::StreamStats& s0 = f.stats[0];
  const v1::StreamStats& sum = f.sum;
  const int cameras = f.cameras, frames = f.frames;
  const double wall = f.wall, mbps = d.mbps, service_mbps = d.service_mbps;
  const double a50 = d.a50, a99 = d.a99, hit = d.hit, rnd = d.rnd;
  const double prec = d.prec, p50 = d.p50, p99 = d.p99, e50 = d.e50;
  const double e99 = d.e99, window_mib = d.window_mib;
  const double budget_mib = d.budget_mib;
  const uint64_t bytes_per_token = d.bytes_per_token, rss = f.rss;
  const uint64_t fetched_bytes = f.fetched_bytes,
                 expected_bytes = f.expected_bytes;
  std::printf(
      "\nkvmem demo: %d cameras x %d frames (%u tokens/frame, %u layers x %u "
      "kv_heads x %u head_dim fp16, %.2f MiB/frame)\n",
      cameras, frames, g.tokens_per_frame, g.layers, g.kv_heads, g.head_dim,
      g.tokens_per_frame * bytes_per_token / 1048576.0);
  std::printf(
      "  ingest         %.1f MiB in %.2f s wall: %.1f MiB/s, %.0f "
      "frames/s (with workload generation and a recall per frame)\n",
      total.bytes / 1048576.0, wall, mbps, cameras * frames / wall);
  std::printf(
      "  append         %.1f MiB/s inside Append calls; per frame "
      "p50 %.0f us, p99 %.0f us (durable ack, over Session)\n",
      service_mbps, a50, a99);
  std::printf(
      "  recall quality %d queries whose place was seen before, "
      "outside the hot window:\n",
      total.reid_queries);
  std::printf(
      "                 kvmem top-1 block from that place: %.1f %% "
      "(%d/%d)\n",
      hit, total.reid_hits, total.reid_queries);
  std::printf("                 a random old block would be:       %.1f %%\n",
              rnd);
  std::printf(
      "                 the hot window alone holds none of them: 0 %%\n");
  std::printf("                 precision of all %d recalled blocks: %.1f %%\n",
              total.recalled, prec);
  std::printf(
      "  recall latency round trip p50 %.0f us, p99 %.0f us; engine "
      "p50 %.0f us, p99 %.0f us\n",
      p50, p99, e50, e99);
  std::printf("%s", Histogram(total.rtt_us, 6, 40, "us").c_str());
  std::printf(
      "  memory         per camera: %.2f MiB of KV appended, kept in the "
      "tiers below, vs a %.2f MiB hot window + %.2f MiB recall budget on "
      "the accelerator; in RAM %.1f KiB of summaries, %.1f KiB of token "
      "codes, %.1f KiB of indexes\n",
      s0.payload_bytes() / 1048576.0, window_mib, budget_mib,
      s0.summary_bytes() / 1024.0, s0.token_code_bytes() / 1024.0,
      s0.index().bytes() / 1024.0);
  std::printf(
      "  tiers          %llu blocks (shots of up to %u frames; %llu cut at "
      "a scene change), over all cameras:\n",
      static_cast<unsigned long long>(sum.sealed_blocks()), g.frames_per_block,
      static_cast<unsigned long long>(sum.policy().shot_cuts()));
  std::printf(
      "                 warm     %4llu blocks, %7.2f MiB of RAM: full "
      "precision, layer-major, 4 KiB-aligned, ready to inject\n",
      static_cast<unsigned long long>(sum.warm().blocks()),
      sum.warm().bytes() / 1048576.0);
  std::printf(
      "                 cold     %4llu blocks, %7.2f MiB in RocksDB: full "
      "precision, fetched on demand\n",
      static_cast<unsigned long long>(sum.cold().blocks()),
      sum.cold().bytes() / 1048576.0);
  std::printf(
      "                 degraded %4llu blocks, %7.2f MiB in RocksDB: int8 "
      "per channel, flagged when recalled\n",
      static_cast<unsigned long long>(sum.degraded().blocks()),
      sum.degraded().bytes() / 1048576.0);
  std::printf(
      "                 heat-aware moves: %llu demoted, %llu degraded, %llu "
      "promoted on recall; prefetch staged %llu, %llu confirmed by a query\n",
      static_cast<unsigned long long>(sum.policy().demotions()),
      static_cast<unsigned long long>(sum.policy().degradations()),
      static_cast<unsigned long long>(sum.policy().promotions()),
      static_cast<unsigned long long>(sum.policy().staged()),
      static_cast<unsigned long long>(sum.policy().stage_hits()));
  if (rss) std::printf("  server RSS     %.1f MiB\n", rss / 1048576.0);
  std::printf(
      "  fetch          camera 0's last recall set: %zu blocks, %llu "
      "bytes (expected %llu)\n",
      f.fetched_blocks, static_cast<unsigned long long>(fetched_bytes),
      static_cast<unsigned long long>(expected_bytes));
}

}  // namespace

int RunDemo(const std::vector<std::string>&) {
  DemoFigures f;
  f.cameras = absl::GetFlag(FLAGS_cameras);
  f.frames = absl::GetFlag(FLAGS_frames);
  const int places = absl::GetFlag(FLAGS_places);
  if (f.cameras < 1 || f.cameras > 256 || f.frames < 1 || places < 1 ||
      places > 64) {
    std::fprintf(stderr,
                 "kvmem demo: need 1..256 --cameras, >= 1 --frames and "
                 "1..64 --places\n");
    return 2;
  }
  std::unique_ptr<ServerProcess> server;
  std::string addr;
  if (int rc = StartDemoServer(&server, &addr); rc != 0) return rc;
  auto client = KvmemClient::Connect(addr, CliClientOptions());
  for (int c = 0; c < f.cameras; ++c) {
    grpc::Status s = client->DeleteStream(absl::StrCat("demo-cam-", c));
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
      return ReportError("demo: delete old stream", s);
    }
  }
  f.g = DemoGeometryFromFlags();
  std::vector<CameraResult> results;
  if (grpc::Status s = RunCameras(client.get(), places, &f, &results);
      !s.ok()) {
    return ReportError("demo", s);
  }
  // Fetch camera 0's last recall set back and check its size.
  if (!results[0].last_blocks.empty()) {
    std::vector<FetchedBlock> fetched;
    grpc::Status s =
        client->FetchBlocks("demo-cam-0", results[0].last_blocks, &fetched);
    if (!s.ok()) return ReportError("demo: fetch", s);
    f.fetched_blocks = fetched.size();
    for (const auto& b : fetched) {
      f.fetched_bytes += b.payload.size();
      f.expected_bytes += b.info.payload_bytes();
    }
  }
  if (grpc::Status s = CollectStats(client.get(), &f); !s.ok()) {
    return ReportError("demo: stats", s);
  }
  f.rss = server ? RssBytes(server->pid()) : 0;
  if (absl::GetFlag(FLAGS_json)) {
    PrintDemoJson(f);
  } else {
    PrintDemoText(f);
  }
  client.reset();  // An idle channel would slow the graceful shutdown.
  if (server) server->Stop();
  return f.fetched_bytes == f.expected_bytes ? 0 : 1;
}

}  // namespace kvmem
