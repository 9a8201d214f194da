#include "tools/bench/bench_cameras.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/kvmem_client.h"
#include "storage/rocks_cold_store.h"
#include "storage/rocks_crc32c.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_inproc.h"
#include "tools/bench/bench_util.h"
#include "tools/common/json_writer.h"

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

// Distinct payloads per camera, cycled (16 MiB each at 7B).
constexpr int kDistinctFrames = 3;
// A camera this late stops early: it is behind whatever comes next.
constexpr double kGiveUpLagMs = 3000;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string CameraId(int i) { return absl::StrCat("cameras-bench-", i); }

// What a front end sends: the geometry and its hot window, every other
// setting its default.
v1::StreamConfig CameraConfig(const CamerasOptions& o) {
  v1::StreamConfig c;
  c.set_hot_window_tokens(o.hot_window_tokens);
  v1::StreamGeometry* g = c.mutable_geometry();
  g->set_layers(o.layers);
  g->set_kv_heads(o.kv_heads);
  g->set_head_dim(o.head_dim);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(o.tokens_per_frame);
  c.mutable_tier_policy()->set_cold_precision(
      ColdPrecisionOf(o.cold_precision));
  c.mutable_tier_policy()->set_ingest_precision(
      ColdPrecisionOf(o.ingest_precision));
  for (uint32_t l = 0; l < o.indexed_layers && l < o.layers; ++l) {
    c.mutable_index_policy()->add_indexed_layers(l);
  }
  return c;
}

size_t FrameValues(const CamerasOptions& o) {
  return KvValuesPerToken(o.layers, o.kv_heads, o.head_dim) *
         o.tokens_per_frame;
}

// RocksDB alone, the server's store options: each of `threads` puts
// `frames` frames of its own (one commit each, as the server's append);
// *disk_per_byte: what that wrote to disk per frame byte.
absl::StatusOr<double> StoragePutMbPerS(
    const CamerasOptions& o, const std::vector<std::string>& payloads,
    int threads, int frames, double* disk_per_byte) {
  RocksColdStoreOptions so;
  so.path = o.scratch_dir + "/cameras-storage-reference";
  auto store = OpenRocksColdStore(so);
  if (!store.ok()) return store.status();
  std::vector<absl::Status> errors(threads);
  const double written0 = SampleProcess(getpid()).disk_write_bytes;
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < frames && errors[t].ok(); ++i) {
        StreamWrite w;
        w.stream_id = CameraId(t);
        w.frame.emplace(i, payloads[(t + i) % payloads.size()]);
        errors[t] = (*store)->Commit(w);
      }
    });
  }
  for (auto& w : workers) w.join();
  const double seconds = MsSince(t0) / 1e3;
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  store->reset();
  // Counted as pages are dirtied, so before the files go.
  *disk_per_byte = Ratio(SampleProcess(getpid()).disk_write_bytes - written0,
                         double(payloads[0].size()) * frames * threads);
  std::error_code ec;
  std::filesystem::remove_all(so.path, ec);
  return double(payloads[0].size()) * frames * threads / 1e6 / seconds;
}

struct CameraRun {
  std::vector<double> append_ms, recall_ms;
  std::vector<double> select_ms;  // The engine's part of each recall.
  std::vector<double> lag_ms;     // Per frame: how late it started.
  double end_lag_ms = 0, first_delivery_ms = 0;
  uint64_t frames = 0, delivered_bytes = 0, recalls_delivering = 0;
  uint64_t set_bytes = 0, recalls = 0;  // The recalled tokens' bytes.
  // Tier moves of the camera's stream during the step.
  uint64_t promotions = 0, demotions = 0;
  absl::Status status;
};

// The append backlog's growth: the median lateness of a camera's last
// third of frames minus that of its first third (a seal's occasional long
// append makes a few frames late without the camera falling behind).
double LagGrowthMs(std::vector<double> lag) {
  const size_t third = lag.size() / 3;
  if (third == 0) return 0;
  std::vector<double> first(lag.begin(), lag.begin() + third);
  std::vector<double> last(lag.end() - third, lag.end());
  auto median = [](std::vector<double>* v) {
    std::nth_element(v->begin(), v->begin() + v->size() / 2, v->end());
    return (*v)[v->size() / 2];
  };
  return median(&last) - median(&first);
}

absl::Status Failed(const std::string& what, const grpc::Status& s) {
  return absl::InternalError(absl::StrCat(what, ": ", s.error_message(),
                                          " (code ", s.error_code(), ")"));
}

OutgoingFrame CameraFrame(const CamerasOptions& o, uint64_t index,
                          const std::string& payload) {
  OutgoingFrame f;
  f.header.set_frame_index(index);
  f.header.set_first_token_position(index * o.tokens_per_frame);
  f.header.set_token_count(o.tokens_per_frame);
  f.payload = payload;
  return f;
}

// A camera's history (see bench_cameras.h): a fresh stream, frames
// appended back to back until one of its blocks is out of RAM or
// o.max_history_frames; their count into *frames, *full whether a block
// left RAM.
absl::Status AppendHistory(const CamerasOptions& o, KvmemClient* client,
                           int cam, const std::vector<std::string>& payloads,
                           uint64_t* frames, bool* full) {
  const std::string id = CameraId(cam);
  client->DeleteStream(id);
  *frames = 0;
  *full = false;
  if (o.max_history_frames == 0) return absl::OkStatus();
  std::unique_ptr<SessionClient> session;
  const v1::StreamConfig config = CameraConfig(o);
  grpc::Status st = client->StartSession(id, &config, &session);
  if (!st.ok()) return Failed("StartSession (history)", st);
  while (*frames < o.max_history_frames && !*full) {
    v1::AppendAck ack;
    st = session->Append(
        CameraFrame(o, *frames, payloads[(cam + *frames) % payloads.size()]),
        &ack);
    if (!st.ok()) return Failed("Session append (history)", st);
    ++*frames;
    if (*frames % 4 != 0) continue;  // A block's worth between checks.
    v1::StreamStats stats;
    st = client->GetStreamStats(id, &stats);
    if (!st.ok()) return Failed("GetStreamStats (history)", st);
    *full = stats.cold().blocks() + stats.degraded().blocks() > 0;
  }
  st = session->Finish();
  return st.ok() ? absl::OkStatus() : Failed("Session finish (history)", st);
}

// One camera: n frames at o.fps from `start`, after `first` frames of
// history, each appended and recalled with its tokens delivered through
// shared memory on one Session.
void RunCamera(const CamerasOptions& o, KvmemClient* client, int cam,
               uint64_t first, int n, Clock::time_point start,
               const std::vector<std::string>& payloads, CameraRun* run) {
  const std::string id = CameraId(cam);
  std::unique_ptr<SessionClient> session;
  const v1::StreamConfig config = CameraConfig(o);
  grpc::Status st = client->StartSession(id, &config, &session);
  if (!st.ok()) {
    run->status = Failed("StartSession", st);
    return;
  }
  v1::StreamStats stats;
  st = client->GetStreamStats(id, &stats);
  if (!st.ok()) {
    run->status = Failed("GetStreamStats", st);
    return;
  }
  const size_t dim =
      std::max<size_t>(1, stats.config().index_policy().indexed_layers_size()) *
      o.kv_heads * o.head_dim;
  const v1::PolicyStats moves0 = stats.policy();
  const float window_lse =
      std::log(static_cast<float>(std::max<uint32_t>(1, o.hot_window_tokens)));
  std::mt19937_64 rng(o.seed * 7919 + cam);
  std::normal_distribution<float> normal(0, 1);
  const double period_ms = 1e3 / o.fps;
  const uint64_t token_bytes =
      KvValuesPerToken(o.layers, o.kv_heads, o.head_dim) * 2;  // fp16
  const double turn = std::clamp(o.query_turn, 0.0, 1.0);
  const double keep = std::sqrt(1 - turn * turn);
  std::vector<float> query(dim);
  for (float& x : query) x = normal(rng);
  std::vector<v1::BlockTokens> held;  // What the front end holds.
  for (int i = 0; i < n; ++i) {
    const auto due =
        start + std::chrono::microseconds(static_cast<int64_t>(
                    (i + double(cam) / o.max_cameras) * period_ms * 1e3));
    std::this_thread::sleep_until(due);
    run->end_lag_ms = std::max(0.0, MsSince(due));
    run->lag_ms.push_back(run->end_lag_ms);
    if (run->end_lag_ms > kGiveUpLagMs) break;
    const OutgoingFrame f = CameraFrame(
        o, first + i, payloads[(cam + first + i) % payloads.size()]);
    v1::AppendAck ack;
    auto t0 = Clock::now();
    st = session->Append(f, &ack);
    run->append_ms.push_back(MsSince(t0));
    if (!st.ok()) {
      run->status = Failed("Session append", st);
      return;
    }
    v1::RecallRequest req;
    for (float& x : query) x = keep * x + turn * normal(rng);
    req.mutable_query()->Assign(query.begin(), query.end());
    // The window's log-sum-exp per head, as the README's front end sends it
    // (it holds the window's keys; here uniform attention over the window
    // stands in: kvmem only reads it). Without it kvmem estimates the window
    // and a recall racing a pending seal waits for it (Stream::
    // SealBeforeRecall).
    req.mutable_window_lse()->Resize(static_cast<int>(dim / o.head_dim),
                                     window_lse);
    req.mutable_budget()->set_max_tokens(o.recall_max_tokens);
    req.mutable_delivery()->set_mode(v1::RecallDelivery::MODE_SHARED_MEMORY);
    req.mutable_delivery()->set_layout(v1::PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR);
    for (const v1::BlockTokens& t : held) {
      *req.mutable_delivery()->add_held_tokens() = t;
    }
    v1::RecallResponse resp;
    Delivery d;
    t0 = Clock::now();
    st = session->RecallDelivered(req, &resp, &d);
    const double recall_ms = MsSince(t0);
    if (!st.ok()) {
      run->status = Failed("Session recall", st);
      return;
    }
    if (d.bytes() > 0 && !d.shared_memory()) {
      run->status = absl::FailedPreconditionError(
          "the recall's tokens came inline, not through shared memory "
          "(is the server on another host?)");
      return;
    }
    if (d.bytes() > 0 && run->recalls_delivering == 0) {
      // The first delivery maps and faults in the arena's pages: once per
      // client, reported apart.
      run->first_delivery_ms = recall_ms;
    } else {
      run->recall_ms.push_back(recall_ms);
      run->select_ms.push_back(resp.timing().total_us() / 1e3);
    }
    run->delivered_bytes += d.bytes();
    std::vector<v1::BlockTokens> set = RecalledTokens(resp);
    run->set_bytes += TokenCount(set) * token_bytes;
    if (o.held_tokens) held = std::move(set);
    if (d.bytes() > 0) ++run->recalls_delivering;
    ++run->recalls;
    d.ReleaseLater();  // With the next frame's recall, as a front end does.
    ++run->frames;
  }
  if (client->GetStreamStats(id, &stats).ok()) {
    run->promotions = stats.policy().promotions() - moves0.promotions();
    run->demotions = stats.policy().demotions() - moves0.demotions();
  }
  st = session->Finish();
  if (!st.ok()) run->status = Failed("Session finish", st);
}

// N cameras at once for o.seconds.
absl::StatusOr<CameraStep> Step(
    const CamerasOptions& o, int cameras,
    const std::vector<std::vector<std::string>>& payloads) {
  CameraStep step;
  step.cameras = cameras;
  std::vector<std::unique_ptr<KvmemClient>> clients;
  for (int c = 0; c < cameras; ++c) {
    ClientOptions co;
    co.own_connection = true;
    clients.push_back(KvmemClient::Connect(o.target, co));
    if (!clients.back()->WaitForReady(std::chrono::seconds(10))) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", o.target));
    }
  }
  const int n = std::max(1, static_cast<int>(std::lround(o.fps * o.seconds)));
  // History first, every camera at once (the warm tier is shared).
  std::vector<uint64_t> history(cameras, 0);
  std::vector<char> full(cameras, 0);
  std::vector<absl::Status> history_status(cameras);
  const auto history_start = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int c = 0; c < cameras; ++c) {
      threads.emplace_back([&, c] {
        bool f = false;
        history_status[c] =
            AppendHistory(o, clients[c].get(), c, payloads[c], &history[c], &f);
        full[c] = f;
      });
    }
    for (auto& t : threads) t.join();
  }
  step.history_s = MsSince(history_start) / 1e3;
  step.history_full = true;
  for (int c = 0; c < cameras; ++c) {
    if (!history_status[c].ok()) return history_status[c];
    step.history_frames = std::max(step.history_frames, history[c]);
    step.history_full = step.history_full && full[c] != 0;
  }
  std::vector<CameraRun> runs(cameras);
  const ProcSample cpu0 = SampleProcess(o.server_pid);
  const ProcSample self0 = SampleProcess(getpid());
  const auto start = Clock::now() + std::chrono::milliseconds(200);
  std::vector<std::thread> threads;
  for (int c = 0; c < cameras; ++c) {
    threads.emplace_back([&, c] {
      RunCamera(o, clients[c].get(), c, history[c], n, start, payloads[c],
                &runs[c]);
    });
  }
  for (auto& t : threads) t.join();
  // At least the step's nominal length (the last frame is due at (n-1)/fps).
  const double seconds = std::max(MsSince(start) / 1e3, n / o.fps);
  if (o.server_pid >= 0) {
    const ProcSample cpu1 = SampleProcess(o.server_pid);
    step.server_cpu = (cpu1.cpu_s - cpu0.cpu_s) / seconds;
    uint64_t sent = 0;
    for (const CameraRun& run : runs) sent += run.frames;
    step.disk_bytes_per_frame_byte =
        Ratio(cpu1.disk_write_bytes - cpu0.disk_write_bytes,
              double(payloads[0][0].size()) * sent);
  }
  // The cameras themselves (this process: sending frames, reading the
  // deliveries), which share the node's cores with the server here.
  step.client_cpu = (SampleProcess(getpid()).cpu_s - self0.cpu_s) / seconds;
  std::vector<double> append, recall, select;
  uint64_t delivered = 0, set_bytes = 0, recalls = 0;
  for (int c = 0; c < cameras; ++c) {
    if (!runs[c].status.ok()) return runs[c].status;
    append.insert(append.end(), runs[c].append_ms.begin(),
                  runs[c].append_ms.end());
    recall.insert(recall.end(), runs[c].recall_ms.begin(),
                  runs[c].recall_ms.end());
    select.insert(select.end(), runs[c].select_ms.begin(),
                  runs[c].select_ms.end());
    step.frames += runs[c].frames;
    step.end_lag_ms = std::max(step.end_lag_ms, runs[c].end_lag_ms);
    step.first_delivery_ms =
        std::max(step.first_delivery_ms, runs[c].first_delivery_ms);
    step.lag_growth_ms =
        std::max(step.lag_growth_ms, LagGrowthMs(runs[c].lag_ms));
    delivered += runs[c].delivered_bytes;
    set_bytes += runs[c].set_bytes;
    recalls += runs[c].recalls;
    step.promotions += runs[c].promotions;
    step.demotions += runs[c].demotions;
    clients[c]->DeleteStream(CameraId(c));
  }
  step.frames_per_s = step.frames / seconds;
  // Summarize works in any unit: these are milliseconds.
  step.append_ms = Summarize(&append);
  step.recall_ms = Summarize(&recall);
  step.select_ms = Summarize(&select);
  // Per recall, those delivering nothing (all held) included.
  step.delivered_mib =
      recalls > 0 ? delivered / double(recalls) / 1048576.0 : 0;
  step.set_mib = recalls > 0 ? set_bytes / double(recalls) / 1048576.0 : 0;
  const double period_ms = 1e3 / o.fps;
  if (step.frames < uint64_t(n) * cameras) {
    step.why =
        absl::StrFormat("%d of %d frames sent before a camera ran %.0f ms late",
                        step.frames, uint64_t(n) * cameras, kGiveUpLagMs);
  } else if (step.lag_growth_ms > period_ms) {
    step.why = absl::StrFormat(
        "frames start later and later (median lateness +%.0f ms from the "
        "first third to the last; period %.0f ms)",
        step.lag_growth_ms, period_ms);
  } else if (step.recall_ms.p99_us > period_ms / 3) {
    step.why = absl::StrFormat(
        "recall + delivery p99 %.1f ms > a third of the period (%.1f ms)",
        step.recall_ms.p99_us, period_ms / 3);
  } else {
    step.kept_up = true;
  }
  return step;
}

}  // namespace

absl::StatusOr<CamerasReport> RunCamerasBench(const CamerasOptions& o) {
  if (o.max_cameras < 1 || o.max_cameras > 256 || !(o.fps > 0) ||
      !(o.seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cameras must be 1..256, fps and seconds > 0 (got ",
                     o.max_cameras, ", ", o.fps, ", ", o.seconds, ")"));
  }
  CamerasReport r;
  r.cpu = CpuModel();
  r.rocksdb_crc32c = RocksCrc32cKernel();
  r.cold_precision = o.cold_precision;
  r.ingest_precision = o.ingest_precision;
  r.query_turn = o.query_turn;
  r.held_tokens = o.held_tokens;
  r.fps = o.fps;
  auto say = [&](const std::string& m) {
    if (o.progress) o.progress(m);
  };
  say(absl::StrCat("building ", kDistinctFrames, " frames for each of ",
                   o.max_cameras, " cameras"));
  std::vector<std::vector<std::string>> payloads(o.max_cameras);
  for (int c = 0; c < o.max_cameras; ++c) {
    for (int i = 0; i < kDistinctFrames; ++i) {
      payloads[c].push_back(
          RandomFp16(FrameValues(o), o.seed * 1000 + c * kDistinctFrames + i));
    }
  }
  r.frame_bytes = payloads[0][0].size();
  r.camera_mb_per_s = r.frame_bytes * o.fps / 1e6;
  say("storage reference: RocksDB puts of the same frames");
  const int threads =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  absl::StatusOr<double> put =
      StoragePutMbPerS(o, payloads[0], threads, std::max(8, 256 / threads),
                       &r.storage_disk_bytes_per_frame_byte);
  if (!put.ok()) return put.status();
  r.storage_put_mb_per_s = *put;
  r.storage_bound_cameras = r.storage_put_mb_per_s / r.camera_mb_per_s;
  for (int n = 1; n <= o.max_cameras; ++n) {
    say(absl::StrCat(n, " camera(s) for ", o.seconds, " s"));
    std::vector<std::vector<std::string>> mine(payloads.begin(),
                                               payloads.begin() + n);
    absl::StatusOr<CameraStep> step = Step(o, n, mine);
    if (!step.ok()) return step.status();
    r.steps.push_back(*step);
    if (!step->kept_up) break;
    r.kept_up = n;
  }
  return r;
}

std::string CamerasJson(const CamerasReport& r) {
  JsonWriter w;
  w.Object(/*multiline=*/true);
  w.Key("cpu").Str(r.cpu);
  w.Key("rocksdb_crc32c").Str(r.rocksdb_crc32c);
  w.Key("frame_bytes").UInt(r.frame_bytes);
  w.Key("cold_precision").Str(r.cold_precision);
  w.Key("ingest_precision").Str(r.ingest_precision);
  w.Key("query_turn").Num(r.query_turn, 3);
  w.Key("held_tokens").Bool(r.held_tokens);
  w.Key("fps").Num(r.fps, 2);
  w.Key("camera_mb_per_s").Num(r.camera_mb_per_s, 2);
  w.Key("storage_put_mb_per_s").Num(r.storage_put_mb_per_s, 1);
  w.Key("storage_bound_cameras").Num(r.storage_bound_cameras, 2);
  w.Key("storage_disk_bytes_per_frame_byte")
      .Num(r.storage_disk_bytes_per_frame_byte, 3);
  w.Key("cameras_kept_up").Int(r.kept_up);
  w.Key("kept_up_vs_storage_bound")
      .Num(
          r.storage_bound_cameras > 0 ? r.kept_up / r.storage_bound_cameras : 0,
          3);
  w.Key("steps").Array(/*multiline=*/true);
  for (const CameraStep& s : r.steps) {
    w.Object();
    w.Key("cameras").Int(s.cameras);
    w.Key("kept_up").Bool(s.kept_up);
    if (!s.kept_up) w.Key("why").Str(s.why);
    w.Key("frames").UInt(s.frames);
    w.Key("frames_per_s").Num(s.frames_per_s, 2);
    w.Key("end_lag_ms").Num(s.end_lag_ms, 1);
    w.Key("lag_growth_ms").Num(s.lag_growth_ms, 1);
    w.Key("append_p50_ms").Num(s.append_ms.p50_us, 2);
    w.Key("append_p99_ms").Num(s.append_ms.p99_us, 2);
    w.Key("recall_delivery_p50_ms").Num(s.recall_ms.p50_us, 2);
    w.Key("recall_delivery_p99_ms").Num(s.recall_ms.p99_us, 2);
    w.Key("selection_p50_ms").Num(s.select_ms.p50_us, 2);
    w.Key("selection_p99_ms").Num(s.select_ms.p99_us, 2);
    w.Key("delivered_mib_per_recall").Num(s.delivered_mib, 2);
    w.Key("recalled_mib_per_recall").Num(s.set_mib, 2);
    w.Key("first_delivery_ms").Num(s.first_delivery_ms, 1);
    w.Key("server_cpu_cores").Num(s.server_cpu, 2);
    w.Key("disk_bytes_per_frame_byte").Num(s.disk_bytes_per_frame_byte, 3);
    w.Key("client_cpu_cores").Num(s.client_cpu, 2);
    w.Key("history_frames").UInt(s.history_frames);
    w.Key("history_s").Num(s.history_s, 1);
    w.Key("history_full").Bool(s.history_full);
    w.Key("promotions").UInt(s.promotions);
    w.Key("demotions").UInt(s.demotions);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return w.Take();
}

std::string CamerasText(const CamerasReport& r) {
  std::string out = absl::StrFormat(
      "cpu: %s; RocksDB's CRC32C: %s\n"
      "camera: %.1f MiB frames at %.1f fps = %.1f MB/s; cold tier %s, "
      "frames written %s; query turning %.2f a frame, %s\n"
      "RocksDB puts of the same frames: %.1f MB/s = %.2f cameras (the "
      "storage's bound), %.2f disk bytes per frame byte\n",
      r.cpu, r.rocksdb_crc32c, r.frame_bytes / 1048576.0, r.fps,
      r.camera_mb_per_s, r.cold_precision, r.ingest_precision, r.query_turn,
      r.held_tokens ? "recalls name the tokens held"
                    : "every recall delivers its whole set",
      r.storage_put_mb_per_s, r.storage_bound_cameras,
      r.storage_disk_bytes_per_frame_byte);
  for (const CameraStep& s : r.steps) {
    absl::StrAppendFormat(
        &out,
        "  %2d camera(s): %s; %.2f frames/s, last frame %.0f ms late "
        "(lateness grew %.0f ms), "
        "append p50/p99 %.1f/%.1f ms, recall+delivery p50/p99 %.1f/%.1f ms "
        "(%.1f MiB delivered of %.1f MiB recalled; first %.0f ms; selection "
        "p50/p99 %.1f/%.1f ms), server "
        "%.2f cores and %.2f disk bytes per frame byte, cameras %.2f, %d "
        "promotions and %d demotions; after %d frames of history a camera "
        "(%.1f s%s)\n",
        s.cameras, s.kept_up ? "kept up" : "behind: " + s.why, s.frames_per_s,
        s.end_lag_ms, s.lag_growth_ms, s.append_ms.p50_us, s.append_ms.p99_us,
        s.recall_ms.p50_us, s.recall_ms.p99_us, s.delivered_mib, s.set_mib,
        s.first_delivery_ms, s.select_ms.p50_us, s.select_ms.p99_us,
        s.server_cpu, s.disk_bytes_per_frame_byte, s.client_cpu, s.promotions,
        s.demotions, s.history_frames, s.history_s,
        s.history_full ? ", blocks leaving RAM" : ", warm tier not full");
  }
  absl::StrAppendFormat(
      &out, "cameras kept up: %d = %.2fx the storage's bound (goal >= 0.8x)\n",
      r.kept_up,
      r.storage_bound_cameras > 0 ? r.kept_up / r.storage_bound_cameras : 0);
  return out;
}

}  // namespace kvmem
