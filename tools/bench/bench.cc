#include "tools/bench/bench.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/percentile.h"
#include "base/status_macros.h"
#include "base/timing.h"
#include "client/cpp/kvmem_client.h"
#include "engine/index/int8_kernels.h"
#include "engine/recall/token_lanes.h"
#include "kvmem/v1/service.grpc.pb.h"
#include "storage/rocks_cold_store.h"
#include "tools/bench/bench_inproc.h"
#include "tools/bench/bench_util.h"
#include "tools/common/demo_workload.h"
#include "tools/common/json_writer.h"

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

// Runs fn(i) on n threads and waits for all.
void Parallel(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (auto& t : threads) t.join();
}

// First error of many threads.
class FirstError {
 public:
  void Set(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = s;
  }
  void Set(const std::string& what, const grpc::Status& s) {
    if (!s.ok()) {
      Set(absl::InternalError(absl::StrCat(what, ": ", s.error_message(),
                                           " (code ", s.error_code(), ")")));
    }
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  absl::Status status_;
};

// Waits until the server's background work after a phase (tier moves,
// RocksDB flushes) has settled: its CPU use below a tenth of a core over
// 200 ms, for at most 20 s. Without its pid: 2 s.
void Quiesce(int pid) {
  if (pid < 0) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return;
  }
  for (int i = 0; i < 100; ++i) {
    const double c0 = SampleProcess(pid).cpu_s;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (SampleProcess(pid).cpu_s - c0 < 0.02) return;
  }
}

// The no-op sink: AppendFrames reads every message and drops it.
class SinkService final : public v1::KvMemory::CallbackService {
 public:
  grpc::ServerReadReactor<v1::AppendFramesRequest>* AppendFrames(
      grpc::CallbackServerContext*, v1::AppendFramesResponse*) override {
    class Reader final
        : public grpc::ServerReadReactor<v1::AppendFramesRequest> {
     public:
      Reader() { StartRead(&req_); }
      void OnReadDone(bool ok) override {
        if (ok) {
          StartRead(&req_);
        } else {
          Finish(grpc::Status::OK);
        }
      }
      void OnDone() override { delete this; }

     private:
      v1::AppendFramesRequest req_;
    };
    return new Reader();
  }
};

DemoGeometry GeometryOf(const BenchOptions& o) {
  DemoGeometry g;
  g.layers = o.layers;
  g.kv_heads = o.kv_heads;
  g.head_dim = o.head_dim;
  g.tokens_per_frame = o.tokens_per_frame;
  g.hot_window_tokens = o.hot_window_tokens;
  g.recall_max_tokens = o.recall_max_tokens;
  g.warm_budget_bytes = o.warm_budget_bytes;
  g.cold_budget_bytes = 0;
  g.prefetch_blocks = 0;
  g.stage_budget_bytes = 0;
  return g;
}

v1::StreamConfig StreamConfigOf(const BenchOptions& o, const DemoGeometry& g) {
  v1::StreamConfig c = DemoStreamConfig(g);
  c.mutable_tier_policy()->set_cold_precision(
      ColdPrecisionOf(o.cold_precision));
  c.mutable_tier_policy()->set_ingest_precision(
      ColdPrecisionOf(o.ingest_precision));
  return c;
}

// Frames 0..n-1 of a camera, as a front end would send them.
std::vector<OutgoingFrame> MakeFrames(const DemoGeometry& g, uint64_t seed,
                                      int n) {
  CameraWorkload cam(seed, g, 6, n);
  std::vector<OutgoingFrame> frames;
  frames.reserve(n);
  for (int i = 0; i < n; ++i) frames.push_back(cam.MakeFrame(i));
  return frames;
}

// Every thread's latencies together, summarised.
Latency SummarizeAll(const std::vector<std::vector<double>>& per_thread) {
  std::vector<double> all;
  for (const std::vector<double>& l : per_thread) {
    all.insert(all.end(), l.begin(), l.end());
  }
  return Summarize(&all);
}

std::string StreamId(int i) { return absl::StrCat("bench-cam-", i); }

std::unique_ptr<KvmemClient> OwnConnection(const std::string& target) {
  ClientOptions o;
  o.own_connection = true;
  return KvmemClient::Connect(target, o);
}

}  // namespace

v1::ColdPrecision ColdPrecisionOf(const std::string& name) {
  return name == "full"   ? v1::COLD_PRECISION_FULL
         : name == "int8" ? v1::COLD_PRECISION_INT8
         : name == "int4" ? v1::COLD_PRECISION_INT4
                          : v1::COLD_PRECISION_UNSPECIFIED;
}

Latency Summarize(std::vector<double>* us) {
  Latency l;
  if (us->empty()) return l;
  std::sort(us->begin(), us->end());
  l.count = us->size();
  l.p50_us = SortedPercentile(*us, 0.5);
  l.p99_us = SortedPercentile(*us, 0.99);
  l.p999_us = SortedPercentile(*us, 0.999);
  l.max_us = us->back();
  return l;
}

namespace {

// One `kvmem bench` run, phase by phase (RunBench).
class BenchRun {
 public:
  explicit BenchRun(const BenchOptions& o)
      : o_(o), g_(GeometryOf(o)), config_(StreamConfigOf(o, g_)) {
    r_.streams = o.streams;
    r_.loaded_recallers = o.loaded_recallers;
    r_.cold_precision = o.cold_precision;
    r_.ingest_precision = o.ingest_precision;
    r_.kernel = ActiveInt8Kernel().name;
    r_.token_lanes = LaneTokenKernel();
    r_.cpu = CpuModel();
    r_.cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  }
  absl::StatusOr<BenchReport> Run();

 private:
  void Say(const std::string& m) const {
    if (o_.progress) o_.progress(m);
  }
  absl::Status InProcess();
  void BuildFrames();
  absl::Status StorageReference();
  absl::Status TransportReference();
  absl::Status OpenStreams();
  // The blocks out of RAM after ingest and their bytes on disk.
  void ColdTier();
  void Ingest();
  void Recall();
  void EmptyRpc();
  void LoadedRecall();
  // CPU seconds over the run's frames, per GB of them.
  double PerGb(double cpu_s) const { return cpu_s / (total_mb_ / 1e3); }
  // Each stream's queries, frame by frame: the recall phase's.
  std::vector<std::vector<std::vector<float>>> StreamQueries() const;
  // The recall phase's request for stream s with query q.
  v1::RecallRequest RecallRequestOf(int s, const std::vector<float>& q) const;
  void Live();
  // One live camera: n frames appended and recalled at o.fps on a Session.
  void LiveCamera(int s, int n, const std::vector<std::vector<float>>& queries,
                  std::vector<double>* app, std::vector<double>* rec,
                  std::vector<double>* eng, std::vector<double>* emp);

  const BenchOptions& o_;
  const DemoGeometry g_;
  const v1::StreamConfig config_;
  BenchReport r_;
  std::vector<std::vector<OutgoingFrame>> frames_;
  double total_mb_ = 0;
  FirstError err_;
  std::vector<std::unique_ptr<KvmemClient>> clients_;
  std::atomic<uint64_t> live_done_{0};
  // Per live camera: its first frame's start and its last frame's answer
  // (the span live_frames_per_s counts; session setup and the stream's
  // deletion are outside it). Written by the camera's thread only.
  std::vector<Clock::time_point> live_first_, live_last_;
};

absl::StatusOr<BenchReport> BenchRun::Run() {
  if (o_.streams < 1 || o_.frames < 1 || o_.recalls < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams, frames and recalls must be >= 1 (got ",
                     o_.streams, ", ", o_.frames, ", ", o_.recalls, ")"));
  }
  if (absl::Status s = InProcess(); !s.ok()) return s;
  BuildFrames();
  if (absl::Status s = StorageReference(); !s.ok()) return s;
  if (absl::Status s = TransportReference(); !s.ok()) return s;
  if (absl::Status s = OpenStreams(); !s.ok()) return s;
  Ingest();
  if (!err_.status().ok()) return err_.status();
  Quiesce(o_.server_pid);
  ColdTier();
  Recall();
  if (!err_.status().ok()) return err_.status();
  EmptyRpc();
  if (!err_.status().ok()) return err_.status();
  if (o_.fps > 0) Live();
  if (!err_.status().ok()) return err_.status();
  // The server's RSS with the first ingest's data (and the live phase's),
  // before the loaded phase appends as much again.
  r_.server_rss_mib = SampleProcess(o_.server_pid).rss_mib;
  if (o_.loaded_recallers > 0) LoadedRecall();
  if (!err_.status().ok()) return err_.status();
  for (int s = 0; s < o_.streams && !o_.keep_streams; ++s) {
    clients_[s]->DeleteStream(StreamId(s));
  }
  return r_;
}

absl::Status BenchRun::InProcess() {
  // 1. In process: the recall kernel against FAISS flat.
  Say(absl::StrCat("in-process index: ", o_.inproc_vectors, " x ",
                   o_.inproc_dim, ", k ", o_.inproc_k));
  InprocIndex(o_.inproc_vectors, o_.inproc_dim, o_.inproc_k, o_.inproc_queries,
              o_.seed, &r_.inproc, &r_.flat, &r_.inproc_recall_at_k,
              &r_.inproc_candidates);
  if (o_.inproc_wide_dim > 0) {
    Say(absl::StrCat("in-process index: ", o_.inproc_vectors, " x ",
                     o_.inproc_wide_dim));
    InprocIndex(o_.inproc_vectors, o_.inproc_wide_dim, o_.inproc_k,
                std::max<uint32_t>(1, o_.inproc_queries / 4), o_.seed + 1,
                &r_.wide_inproc, &r_.wide_flat, nullptr, nullptr);
  }
  Say(absl::StrCat("in-process stream recall: ", o_.inproc_vectors,
                   " blocks, per-head mass vs summed score"));
  KVMEM_RETURN_IF_ERROR(
      InprocStreamRecall(o_, &r_.stream_mass, &r_.stream_summed));
  Say(absl::StrCat("in-process stream recall: ", o_.inproc_vectors,
                   " blocks of 16 tokens, token vs group resolution"));
  return InprocTokenRecall(o_, &r_.stream_tokens, &r_.stream_groups,
                           &r_.stream_tokens_scored);
}

void BenchRun::BuildFrames() {
  // Every stream's frames, built once (the generator is not measured).
  Say(absl::StrCat("building ", o_.streams, " x ", o_.frames, " frames"));
  frames_.resize(o_.streams);
  Parallel(o_.streams, [&](int s) {
    frames_[s] = MakeFrames(g_, o_.seed * 1000 + s, o_.frames);
  });
  r_.frame_bytes = frames_[0][0].payload.size();
  total_mb_ = double(r_.frame_bytes) * o_.frames * o_.streams / 1e6;
}

absl::Status BenchRun::StorageReference() {
  // 2. The storage engine alone: the same payloads, one put per frame.
  Say("storage reference: RocksDB puts");
  RocksColdStoreOptions so;
  so.path = o_.scratch_dir + "/storage-reference";
  auto store = OpenRocksColdStore(so);
  if (!store.ok()) return store.status();
  const double c0 = SelfCpuSeconds();
  const auto t0 = Clock::now();
  Parallel(o_.streams, [&](int s) {
    for (int i = 0; i < o_.frames; ++i) {
      StreamWrite w;
      w.stream_id = StreamId(s);
      w.frame.emplace(i, frames_[s][i].payload);
      if (absl::Status st = (*store)->Commit(w); !st.ok()) err_.Set(st);
    }
  });
  r_.storage_put_mb_per_s = total_mb_ / Seconds(t0, Clock::now());
  r_.storage_cpu_s_per_gb = PerGb(SelfCpuSeconds() - c0);
  return err_.status();
}

absl::Status BenchRun::TransportReference() {
  // 3. The transport alone: a no-op AppendFrames sink in this process.
  Say("transport reference: client-streaming to a no-op sink");
  SinkService sink;
  const std::string path = o_.scratch_dir + "/sink.sock";
  ::unlink(path.c_str());
  grpc::ServerBuilder b;
  b.SetMaxReceiveMessageSize(64 << 20);
  b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  b.RegisterService(&sink);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server) return absl::InternalError("cannot start the no-op sink");
  const double c0 = SelfCpuSeconds();
  const auto t0 = Clock::now();
  Parallel(o_.streams, [&](int s) {
    auto c = OwnConnection("unix:" + path);
    v1::AppendFramesResponse resp;
    err_.Set("sink AppendFrames",
             c->AppendFrames(StreamId(s), frames_[s], &resp));
  });
  r_.raw_stream_mb_per_s = total_mb_ / Seconds(t0, Clock::now());
  r_.transport_cpu_s_per_gb = PerGb(SelfCpuSeconds() - c0);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  ::unlink(path.c_str());
  return err_.status();
}

absl::Status BenchRun::OpenStreams() {
  // 4. The service: open the streams (a rerun starts afresh).
  for (int s = 0; s < o_.streams; ++s) {
    clients_.push_back(OwnConnection(o_.target));
    if (!clients_.back()->WaitForReady(std::chrono::seconds(10))) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", o_.target));
    }
    clients_.back()->DeleteStream(StreamId(s));
    v1::OpenStreamResponse opened;
    grpc::Status st =
        clients_.back()->OpenStream(StreamId(s), config_, &opened);
    if (!st.ok()) {
      return absl::InternalError(
          absl::StrCat("OpenStream: ", st.error_message()));
    }
  }
  return absl::OkStatus();
}

void BenchRun::Ingest() {
  // Full-rate ingest, all streams at once.
  Say(absl::StrCat("ingest: ", o_.streams, " streams x ", o_.frames,
                   " frames of ", r_.frame_bytes / 1024, " KiB"));
  const ProcSample p0 = SampleProcess(o_.server_pid);
  const double self0 = SelfCpuSeconds();
  const auto t0 = Clock::now();
  Parallel(o_.streams, [&](int s) {
    v1::AppendFramesResponse resp;
    err_.Set("AppendFrames",
             clients_[s]->AppendFrames(StreamId(s), frames_[s], &resp));
  });
  const double secs = Seconds(t0, Clock::now());
  r_.ingest_mb_per_s = total_mb_ / secs;
  r_.ingest_frames_per_s = double(o_.frames) * o_.streams / secs;
  const double server_s = SampleProcess(o_.server_pid).cpu_s - p0.cpu_s;
  r_.server_cpu_ingest = server_s / secs;
  if (o_.server_pid >= 0) {
    r_.ingest_cpu_s_per_gb = PerGb(server_s + SelfCpuSeconds() - self0);
  }
  // The stages: each stream's stats (which seal what the acks left
  // pending), and the server's CPU up to them.
  IngestStages& st = r_.ingest_stages;
  st.measured = o_.server_pid >= 0;
  for (int s = 0; s < o_.streams; ++s) {
    v1::StreamStats stats;
    if (!clients_[s]->GetStreamStats(StreamId(s), &stats).ok()) {
      st.measured = false;
      continue;
    }
    AddIngestCpu(stats.ingest_cpu(), &st);
  }
  st.server_cpu_s = SampleProcess(o_.server_pid).cpu_s - p0.cpu_s;
  st.mb = total_mb_;
}

void BenchRun::ColdTier() {
  for (int s = 0; s < o_.streams; ++s) {
    v1::StreamStats st;
    if (!clients_[s]->GetStreamStats(StreamId(s), &st).ok()) continue;
    r_.cold_tier_blocks += st.cold().blocks() + st.degraded().blocks();
    r_.cold_tier_bytes += st.cold().bytes() + st.degraded().bytes();
  }
}

void BenchRun::Recall() {
  // 5. Recall (ids and metadata, no payload), all streams at once.
  Say(absl::StrCat("recall: ", o_.streams, " streams x ", o_.recalls));
  std::vector<std::vector<double>> lat(o_.streams);
  const ProcSample p0 = SampleProcess(o_.server_pid);
  const auto t0 = Clock::now();
  Parallel(o_.streams, [&](int s) {
    CameraWorkload cam(o_.seed * 1000 + s, g_, 6, o_.frames);
    for (int i = 0; i < o_.recalls; ++i) {
      const v1::RecallRequest req =
          RecallRequestOf(s, cam.MakeQuery(i % o_.frames));
      v1::RecallResponse resp;
      const auto c0 = Clock::now();
      const grpc::Status st = clients_[s]->Recall(req, &resp);
      lat[s].push_back(MicrosSince(c0));
      err_.Set("Recall", st);
    }
  });
  const double secs = Seconds(t0, Clock::now());
  r_.server_cpu_recall = (SampleProcess(o_.server_pid).cpu_s - p0.cpu_s) / secs;
  r_.recall = SummarizeAll(lat);
}

void BenchRun::EmptyRpc() {
  // 6. An empty unary RPC from as many callers: the transport's floor.
  Say("empty unary RPC reference");
  std::vector<std::vector<double>> lat(o_.streams);
  Parallel(o_.streams, [&](int s) {
    for (int i = 0; i < o_.recalls; ++i) {
      grpc::health::v1::HealthCheckResponse resp;
      const auto c0 = Clock::now();
      const grpc::Status st = clients_[s]->CheckHealth("", &resp);
      lat[s].push_back(MicrosSince(c0));
      err_.Set("Health.Check", st);
    }
  });
  r_.empty_rpc = SummarizeAll(lat);
}

std::vector<std::vector<std::vector<float>>> BenchRun::StreamQueries() const {
  std::vector<std::vector<std::vector<float>>> queries(o_.streams);
  for (int s = 0; s < o_.streams; ++s) {
    CameraWorkload cam(o_.seed * 1000 + s, g_, 6, o_.frames);
    for (int i = 0; i < o_.frames; ++i) queries[s].push_back(cam.MakeQuery(i));
  }
  return queries;
}

v1::RecallRequest BenchRun::RecallRequestOf(int s,
                                            const std::vector<float>& q) const {
  v1::RecallRequest req;
  req.set_stream_id(StreamId(s));
  req.mutable_query()->Assign(q.begin(), q.end());
  req.mutable_budget()->set_top_k(o_.recall_top_k);
  req.mutable_budget()->set_max_tokens(o_.recall_max_tokens);
  return req;
}

void BenchRun::LoadedRecall() {
  // 8. Recall while every stream ingests at full rate: each appends its
  // frames again (as the ones after those it holds), and loaded_recallers
  // callers, each on a connection of its own, recall the streams in turn,
  // each recall followed by an empty RPC, so the two meet the same load,
  // until the appends are done (at least one pair each).
  const int callers = o_.loaded_recallers;
  Say(absl::StrCat("loaded recall: ", callers, " callers while ", o_.streams,
                   " streams ingest"));
  const uint64_t shift_tokens =
      static_cast<uint64_t>(o_.frames) * o_.tokens_per_frame;
  for (std::vector<OutgoingFrame>& frames : frames_) {
    for (OutgoingFrame& f : frames) {
      v1::FrameHeader& h = f.header;
      h.set_frame_index(h.frame_index() + o_.frames);
      h.set_timestamp_us(h.timestamp_us() + int64_t{o_.frames} * 333333);
      h.set_first_token_position(h.first_token_position() + shift_tokens);
    }
  }
  std::vector<std::unique_ptr<KvmemClient>> own;
  for (int c = 0; c < callers; ++c) {
    own.push_back(OwnConnection(o_.target));
    if (!own.back()->WaitForReady(std::chrono::seconds(10))) {
      return err_.Set(absl::UnavailableError(
          absl::StrCat("cannot connect to ", o_.target)));
    }
  }
  std::vector<std::vector<double>> rec(callers), eng(callers), emp(callers);
  // Each stream's queries, as the recall phase's (built before the clock).
  const std::vector<std::vector<std::vector<float>>> queries = StreamQueries();
  std::atomic<int> appending{o_.streams};
  const auto t0 = Clock::now();
  std::atomic<double> ingest_secs{0};
  Parallel(o_.streams + callers, [&](int k) {
    if (k < o_.streams) {
      v1::AppendFramesResponse resp;
      err_.Set("AppendFrames (loaded)",
               clients_[k]->AppendFrames(StreamId(k), frames_[k], &resp));
      if (--appending == 0) ingest_secs = Seconds(t0, Clock::now());
      return;
    }
    const int c = k - o_.streams;
    for (int i = 0; i == 0 || appending.load() > 0; ++i) {
      const int s = (c + i * callers) % o_.streams;
      const v1::RecallRequest req =
          RecallRequestOf(s, queries[s][i % o_.frames]);
      v1::RecallResponse resp;
      auto c0 = Clock::now();
      grpc::Status st = own[c]->Recall(req, &resp);
      rec[c].push_back(MicrosSince(c0));
      if (!st.ok()) return err_.Set("Recall (loaded)", st);
      eng[c].push_back(resp.timing().total_us());
      grpc::health::v1::HealthCheckResponse health;
      c0 = Clock::now();
      st = own[c]->CheckHealth("", &health);
      emp[c].push_back(MicrosSince(c0));
      if (!st.ok()) return err_.Set("Health.Check (loaded)", st);
    }
  });
  r_.loaded_ingest_mb_per_s = Ratio(total_mb_, ingest_secs.load());
  r_.loaded_recall = SummarizeAll(rec);
  r_.loaded_recall_engine = SummarizeAll(eng);
  r_.loaded_empty_rpc = SummarizeAll(emp);
}

void BenchRun::Live() {
  // 7. Live: sessions append and recall each frame at the camera's pace.
  Say(absl::StrCat("live: ", o_.streams, " sessions at ", o_.fps, " fps for ",
                   o_.live_seconds, " s"));
  r_.live_fps = o_.fps;
  const int n = std::max(1, static_cast<int>(o_.fps * o_.live_seconds));
  std::vector<std::vector<double>> app(o_.streams), rec(o_.streams),
      eng(o_.streams), emp(o_.streams);
  // Frames and queries come from the ingest phase's (built before the
  // clock starts): the load generator shares the machine's cores.
  const std::vector<std::vector<std::vector<float>>> queries = StreamQueries();
  live_first_.assign(o_.streams, Clock::time_point::max());
  live_last_.assign(o_.streams, Clock::time_point::min());
  Parallel(o_.streams, [&](int s) {
    LiveCamera(s, n, queries[s], &app[s], &rec[s], &eng[s], &emp[s]);
  });
  // From the first camera's first frame to the last camera's last answer,
  // and at least the run's nominal length (n frames at o_.fps), so a run
  // that keeps pace reports streams x fps.
  const auto first = *std::min_element(live_first_.begin(), live_first_.end());
  const auto last = *std::max_element(live_last_.begin(), live_last_.end());
  const double span = last > first ? Seconds(first, last) : 0.0;
  r_.live_frames_per_s = Ratio(double(live_done_.load()),
                               std::max(span, n / std::max(o_.fps, 1e-9)));
  r_.live_empty_rpc = SummarizeAll(emp);
  r_.live_append = SummarizeAll(app);
  r_.live_recall = SummarizeAll(rec);
  r_.live_recall_engine = SummarizeAll(eng);
}

void BenchRun::LiveCamera(int s, int n,
                          const std::vector<std::vector<float>>& queries,
                          std::vector<double>* app, std::vector<double>* rec,
                          std::vector<double>* eng, std::vector<double>* emp) {
  const std::string id = StreamId(s) + "-live";
  clients_[s]->DeleteStream(id);
  std::unique_ptr<SessionClient> session;
  err_.Set("StartSession", clients_[s]->StartSession(id, &config_, &session));
  if (!session) return;
  // Cameras start spread over one frame interval.
  const auto start =
      Clock::now() + std::chrono::microseconds(
                         static_cast<int64_t>(1e6 / o_.fps * s / o_.streams));
  live_first_[s] = start;
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_until(
        start +
        std::chrono::microseconds(static_cast<int64_t>(i * 1e6 / o_.fps)));
    OutgoingFrame f = frames_[s][i % o_.frames];
    f.header.set_frame_index(i);
    f.header.set_first_token_position(static_cast<uint64_t>(i) *
                                      o_.tokens_per_frame);
    v1::AppendAck ack;
    auto c0 = Clock::now();
    grpc::Status st = session->Append(f, &ack);
    app->push_back(MicrosSince(c0));
    if (!st.ok()) return err_.Set("Session append", st);
    v1::RecallRequest req;
    const std::vector<float>& q = queries[i % o_.frames];
    req.mutable_query()->Assign(q.begin(), q.end());
    req.mutable_budget()->set_top_k(o_.recall_top_k);
    req.mutable_budget()->set_max_tokens(o_.recall_max_tokens);
    v1::RecallResponse resp;
    c0 = Clock::now();
    st = session->Recall(req, &resp);
    rec->push_back(MicrosSince(c0));
    if (!st.ok()) return err_.Set("Session recall", st);
    eng->push_back(resp.timing().total_us());
    // The transport's share under the same load: an empty unary RPC
    // (health Check) on the same connection, right after.
    grpc::health::v1::HealthCheckResponse health;
    c0 = Clock::now();
    st = clients_[s]->CheckHealth("", &health);
    emp->push_back(MicrosSince(c0));
    if (!st.ok()) return err_.Set("Health.Check", st);
    ++live_done_;
    live_last_[s] = Clock::now();
  }
  err_.Set("Session finish", session->Finish());
  clients_[s]->DeleteStream(id);
}

}  // namespace

absl::StatusOr<BenchReport> RunBench(const BenchOptions& o) {
  BenchRun run(o);
  return run.Run();
}

namespace {

// Issue 28's ingest goal: this share of the storage reference's rate.
constexpr double kIngestGoal = 0.8;

// The CPUs the two references' own work (storage and transport, per GB)
// takes at `fraction` of the storage reference's rate: what ingest at that
// rate needs even if kvmem's work cost nothing (both references run in
// this process, so this holds against a server of --addr too).
double ReferenceCoresAtFraction(const BenchReport& r, double fraction) {
  return fraction * r.storage_put_mb_per_s / 1e3 *
         (r.storage_cpu_s_per_gb + r.transport_cpu_s_per_gb);
}

}  // namespace

std::string BenchJson(const BenchReport& r) {
  JsonWriter w;
  w.Object(/*multiline=*/true);
  auto lat = [&w](const std::string& name, const Latency& l) {
    w.Key(name + "_p50_us").Num(l.p50_us, 1);
    w.Key(name + "_p99_us").Num(l.p99_us, 1);
    w.Key(name + "_p999_us").Num(l.p999_us, 1);
  };
  w.Key("streams").Int(r.streams);
  w.Key("frame_bytes").UInt(r.frame_bytes);
  w.Key("kernel").Str(r.kernel);
  w.Key("token_lanes").Str(r.token_lanes);
  w.Key("cpu").Str(r.cpu);
  w.Key("ingest_mb_per_s").Num(r.ingest_mb_per_s, 1);
  w.Key("ingest_frames_per_s").Num(r.ingest_frames_per_s, 1);
  w.Key("cold_precision").Str(r.cold_precision);
  w.Key("ingest_precision").Str(r.ingest_precision);
  w.Key("cold_tier_blocks").UInt(r.cold_tier_blocks);
  w.Key("cold_tier_bytes").UInt(r.cold_tier_bytes);
  w.Key("raw_stream_mb_per_s").Num(r.raw_stream_mb_per_s, 1);
  w.Key("storage_put_mb_per_s").Num(r.storage_put_mb_per_s, 1);
  lat("recall", r.recall);
  lat("empty_rpc", r.empty_rpc);
  lat("inproc_recall", r.inproc);
  w.Key("inproc_recall_at_16").Num(r.inproc_recall_at_k, 4);
  w.Key("inproc_fp32_candidates").Num(r.inproc_candidates, 1);
  lat("flat_faiss", r.flat);
  lat("stream_recall_mass", r.stream_mass);
  lat("stream_recall_summed", r.stream_summed);
  lat("stream_recall_tokens", r.stream_tokens);
  lat("stream_recall_groups", r.stream_groups);
  w.Key("stream_recall_tokens_scored").Num(r.stream_tokens_scored, 1);
  lat("wide_inproc_recall", r.wide_inproc);
  lat("wide_flat_faiss", r.wide_flat);
  w.Key("loaded_recallers").Int(r.loaded_recallers);
  w.Key("loaded_recalls").UInt(r.loaded_recall.count);
  w.Key("loaded_ingest_mb_per_s").Num(r.loaded_ingest_mb_per_s, 1);
  lat("loaded_recall", r.loaded_recall);
  lat("loaded_recall_engine", r.loaded_recall_engine);
  lat("loaded_empty_rpc", r.loaded_empty_rpc);
  w.Key("live_fps").Num(r.live_fps, 2);
  w.Key("live_frames_per_s").Num(r.live_frames_per_s, 1);
  lat("live_append", r.live_append);
  lat("live_recall", r.live_recall);
  lat("live_recall_engine", r.live_recall_engine);
  lat("live_empty_rpc", r.live_empty_rpc);
  w.Key("server_rss_mib").Num(r.server_rss_mib, 1);
  w.Key("server_cpu_ingest").Num(r.server_cpu_ingest, 2);
  if (r.ingest_stages.measured) WriteIngestStagesJson(r.ingest_stages, &w);
  w.Key("server_cpu_recall").Num(r.server_cpu_recall, 2);
  w.Key("ingest_vs_storage")
      .Num(Ratio(r.ingest_mb_per_s, r.storage_put_mb_per_s), 3);
  w.Key("ingest_vs_raw_stream")
      .Num(Ratio(r.ingest_mb_per_s, r.raw_stream_mb_per_s), 3);
  w.Key("cpus").Int(r.cpus);
  w.Key("storage_cpu_s_per_gb").Num(r.storage_cpu_s_per_gb, 3);
  w.Key("transport_cpu_s_per_gb").Num(r.transport_cpu_s_per_gb, 3);
  w.Key("ingest_cpu_s_per_gb").Num(r.ingest_cpu_s_per_gb, 3);
  w.Key("cores_for_0_8x_storage_at_references_cpu")
      .Num(ReferenceCoresAtFraction(r, kIngestGoal), 3);
  w.Key("recall_p99_vs_empty_rpc_p99")
      .Num(Ratio(r.recall.p99_us, r.empty_rpc.p99_us), 3);
  w.Key("loaded_recall_p99_vs_empty_rpc_p99")
      .Num(Ratio(r.loaded_recall.p99_us, r.loaded_empty_rpc.p99_us), 3);
  w.Key("loaded_recall_p99_vs_empty_rpc_phase_p99")
      .Num(Ratio(r.loaded_recall.p99_us, r.empty_rpc.p99_us), 3);
  w.Key("flat_faiss_p99_vs_inproc_p99")
      .Num(Ratio(r.flat.p99_us, r.inproc.p99_us), 2);
  w.Key("stream_recall_mass_p99_vs_summed_p99")
      .Num(Ratio(r.stream_mass.p99_us, r.stream_summed.p99_us), 2);
  w.Key("stream_recall_tokens_p99_vs_groups_p99")
      .Num(Ratio(r.stream_tokens.p99_us, r.stream_groups.p99_us), 2);
  w.EndObject();
  return w.Take();
}

std::string BenchText(const BenchReport& r) {
  std::string s;
  s += absl::StrFormat(
      "kvmem bench: %d streams, %.0f KiB frames, int8 kernel %s, token lanes "
      "%s, CPU %s\n",
      r.streams, r.frame_bytes / 1024.0, r.kernel, r.token_lanes, r.cpu);
  s += absl::StrFormat(
      "  in-process recall   p50 %7.1f us  p99 %7.1f us  recall@16 %.4f  "
      "(%.0f rescored)\n",
      r.inproc.p50_us, r.inproc.p99_us, r.inproc_recall_at_k,
      r.inproc_candidates);
  s += absl::StrFormat(
      "    vs FAISS flat     p50 %7.1f us  p99 %7.1f us  -> %.1fx faster "
      "(p99)\n",
      r.flat.p50_us, r.flat.p99_us, Ratio(r.flat.p99_us, r.inproc.p99_us));
  s += absl::StrFormat(
      "  stream recall, per-head mass  p50 %7.1f us  p99 %7.1f us; summed "
      "score p50 %.1f us p99 %.1f us (p99 x%.2f)\n",
      r.stream_mass.p50_us, r.stream_mass.p99_us, r.stream_summed.p50_us,
      r.stream_summed.p99_us,
      Ratio(r.stream_mass.p99_us, r.stream_summed.p99_us));
  s += absl::StrFormat(
      "  stream recall, token resolution p50 %7.1f us  p99 %7.1f us (%.0f "
      "tokens scored); token groups p50 %.1f us p99 %.1f us (p99 x%.2f)\n",
      r.stream_tokens.p50_us, r.stream_tokens.p99_us, r.stream_tokens_scored,
      r.stream_groups.p50_us, r.stream_groups.p99_us,
      Ratio(r.stream_tokens.p99_us, r.stream_groups.p99_us));
  if (r.wide_inproc.count > 0) {
    s += absl::StrFormat(
        "  wide in-process     p50 %7.1f us  p99 %7.1f us; FAISS flat p99 "
        "%.1f us\n",
        r.wide_inproc.p50_us, r.wide_inproc.p99_us, r.wide_flat.p99_us);
  }
  s += absl::StrFormat(
      "  ingest              %8.1f MB/s (%.0f frames/s); storage alone %.1f "
      "MB/s (x%.2f); transport alone %.1f MB/s (x%.2f)\n",
      r.ingest_mb_per_s, r.ingest_frames_per_s, r.storage_put_mb_per_s,
      Ratio(r.ingest_mb_per_s, r.storage_put_mb_per_s), r.raw_stream_mb_per_s,
      Ratio(r.ingest_mb_per_s, r.raw_stream_mb_per_s));
  if (r.storage_put_mb_per_s > 0) {
    s += absl::StrFormat(
        "  CPU per GB          ingest %s; storage alone %.2f s, transport "
        "alone %.2f s: those two alone at %.1fx storage's rate take %.2f of %d "
        "CPUs\n",
        r.ingest_cpu_s_per_gb > 0
            ? absl::StrFormat("%.2f s (server and clients)",
                              r.ingest_cpu_s_per_gb)
            : std::string("not measured (no server of its own)"),
        r.storage_cpu_s_per_gb, r.transport_cpu_s_per_gb, kIngestGoal,
        ReferenceCoresAtFraction(r, kIngestGoal), r.cpus);
  }
  s += absl::StrFormat(
      "  cold tier (%s)     %llu blocks out of RAM, %.1f MiB on disk (%.1f "
      "KiB a block); frames written %s\n",
      r.cold_precision, r.cold_tier_blocks, r.cold_tier_bytes / 1048576.0,
      r.cold_tier_blocks > 0 ? r.cold_tier_bytes / 1024.0 / r.cold_tier_blocks
                             : 0.0,
      r.ingest_precision);
  s += absl::StrFormat(
      "  recall RPC          p50 %7.1f us  p99 %7.1f us  p999 %7.1f us; "
      "empty RPC p99 %.1f us (x%.2f)\n",
      r.recall.p50_us, r.recall.p99_us, r.recall.p999_us, r.empty_rpc.p99_us,
      Ratio(r.recall.p99_us, r.empty_rpc.p99_us));
  if (r.loaded_recall.count > 0) {
    s += absl::StrFormat(
        "  recall RPC while all streams ingest (%d callers, %llu recalls; "
        "ingest %.1f MB/s) p50 %7.1f us  p99 %7.1f us (in the engine p99 "
        "%.1f us); empty RPC under the same load p50 %.1f us p99 %.1f us "
        "(x%.2f; x%.2f of the empty RPC phase's p99)\n",
        r.loaded_recallers, r.loaded_recall.count, r.loaded_ingest_mb_per_s,
        r.loaded_recall.p50_us, r.loaded_recall.p99_us,
        r.loaded_recall_engine.p99_us, r.loaded_empty_rpc.p50_us,
        r.loaded_empty_rpc.p99_us,
        Ratio(r.loaded_recall.p99_us, r.loaded_empty_rpc.p99_us),
        Ratio(r.loaded_recall.p99_us, r.empty_rpc.p99_us));
  }
  if (r.live_fps > 0) {
    s += absl::StrFormat(
        "  live %.1f fps/stream  %.1f frames/s achieved; append p99 %.1f us, "
        "recall p50 %.1f us p99 %.1f us p999 %.1f us (in the engine: p50 "
        "%.1f us p99 %.1f us); empty RPC under the same load p50 %.1f us p99 "
        "%.1f us (recall p99 x%.2f)\n",
        r.live_fps, r.live_frames_per_s, r.live_append.p99_us,
        r.live_recall.p50_us, r.live_recall.p99_us, r.live_recall.p999_us,
        r.live_recall_engine.p50_us, r.live_recall_engine.p99_us,
        r.live_empty_rpc.p50_us, r.live_empty_rpc.p99_us,
        Ratio(r.live_recall.p99_us, r.live_empty_rpc.p99_us));
  }
  if (r.server_rss_mib > 0) {
    s += absl::StrFormat(
        "  server              RSS %.0f MiB; CPU %.2f cores ingesting, %.2f "
        "recalling\n",
        r.server_rss_mib, r.server_cpu_ingest, r.server_cpu_recall);
  }
  if (r.ingest_stages.measured) s += IngestStagesText(r.ingest_stages);
  return s;
}

}  // namespace kvmem
