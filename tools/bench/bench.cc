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
#include "client/cpp/kvmem_client.h"
#include "engine/index/int8_kernels.h"
#include "kvmem/v1/service.grpc.pb.h"
#include "storage/rocks_cold_store.h"
#include "tools/bench/bench_inproc.h"
#include "tools/common/demo_workload.h"

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

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

// CPU seconds (user + system) and RSS of a process, from /proc.
struct ProcSample {
  double cpu_s = 0;
  double rss_mib = 0;
};
ProcSample SampleProcess(int pid) {
  ProcSample s;
  if (pid < 0) return s;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  // Fields after the command (which may hold spaces) start after ')'.
  const size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    s.cpu_s = static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      s.rss_mib = std::stod(line.substr(6)) / 1024.0;  // kB.
    }
  }
  return s;
}

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

// Frames 0..n-1 of a camera, as a front end would send them.
std::vector<OutgoingFrame> MakeFrames(const DemoGeometry& g, uint64_t seed,
                                      int n) {
  CameraWorkload cam(seed, g, 6, n);
  std::vector<OutgoingFrame> frames;
  frames.reserve(n);
  for (int i = 0; i < n; ++i) frames.push_back(cam.MakeFrame(i));
  return frames;
}

std::string StreamId(int i) { return absl::StrCat("bench-cam-", i); }

std::unique_ptr<KvmemClient> OwnConnection(const std::string& target) {
  ClientOptions o;
  o.own_connection = true;
  return KvmemClient::Connect(target, o);
}

}  // namespace

Latency Summarize(std::vector<double>* us) {
  Latency l;
  if (us->empty()) return l;
  std::sort(us->begin(), us->end());
  auto at = [&](double q) {
    return (*us)[std::min(us->size() - 1, static_cast<size_t>(q * us->size()))];
  };
  l.count = us->size();
  l.p50_us = at(0.5);
  l.p99_us = at(0.99);
  l.p999_us = at(0.999);
  l.max_us = us->back();
  return l;
}

absl::StatusOr<BenchReport> RunBench(const BenchOptions& o) {
  auto say = [&](const std::string& m) {
    if (o.progress) o.progress(m);
  };
  if (o.streams < 1 || o.frames < 1 || o.recalls < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams, frames and recalls must be >= 1 (got ",
                     o.streams, ", ", o.frames, ", ", o.recalls, ")"));
  }
  BenchReport r;
  r.streams = o.streams;
  r.kernel = ActiveInt8Kernel().name;
  r.cpu = CpuModel();
  const DemoGeometry g = GeometryOf(o);
  const v1::StreamConfig config = DemoStreamConfig(g);

  // 1. In process: the recall kernel against FAISS flat.
  say(absl::StrCat("in-process index: ", o.inproc_vectors, " x ", o.inproc_dim,
                   ", k ", o.inproc_k));
  InprocIndex(o.inproc_vectors, o.inproc_dim, o.inproc_k, o.inproc_queries,
              o.seed, &r.inproc, &r.flat, &r.inproc_recall_at_k,
              &r.inproc_candidates);
  if (o.inproc_wide_dim > 0) {
    say(absl::StrCat("in-process index: ", o.inproc_vectors, " x ",
                     o.inproc_wide_dim));
    InprocIndex(o.inproc_vectors, o.inproc_wide_dim, o.inproc_k,
                std::max<uint32_t>(1, o.inproc_queries / 4), o.seed + 1,
                &r.wide_inproc, &r.wide_flat, nullptr, nullptr);
  }

  say(absl::StrCat("in-process stream recall: ", o.inproc_vectors,
                   " blocks, per-head mass vs summed score"));
  if (absl::Status st = InprocStreamRecall(o, &r.stream_mass, &r.stream_summed);
      !st.ok()) {
    return st;
  }

  // Every stream's frames, built once (the generator is not measured).
  say(absl::StrCat("building ", o.streams, " x ", o.frames, " frames"));
  std::vector<std::vector<OutgoingFrame>> frames(o.streams);
  Parallel(o.streams, [&](int s) {
    frames[s] = MakeFrames(g, o.seed * 1000 + s, o.frames);
  });
  r.frame_bytes = frames[0][0].payload.size();
  const double total_mb = double(r.frame_bytes) * o.frames * o.streams / 1e6;
  FirstError err;

  // 2. The storage engine alone: the same payloads, one put per frame.
  {
    say("storage reference: RocksDB puts");
    RocksColdStoreOptions so;
    so.path = o.scratch_dir + "/storage-reference";
    auto store = OpenRocksColdStore(so);
    if (!store.ok()) return store.status();
    const auto t0 = Clock::now();
    Parallel(o.streams, [&](int s) {
      for (int i = 0; i < o.frames; ++i) {
        StreamWrite w;
        w.stream_id = StreamId(s);
        w.frame.emplace(i, frames[s][i].payload);
        if (absl::Status st = (*store)->Commit(w); !st.ok()) err.Set(st);
      }
    });
    r.storage_put_mb_per_s = total_mb / Seconds(t0, Clock::now());
  }
  if (!err.status().ok()) return err.status();

  // 3. The transport alone: a no-op AppendFrames sink in this process.
  {
    say("transport reference: client-streaming to a no-op sink");
    SinkService sink;
    const std::string path = o.scratch_dir + "/sink.sock";
    ::unlink(path.c_str());
    grpc::ServerBuilder b;
    b.SetMaxReceiveMessageSize(64 << 20);
    b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    b.RegisterService(&sink);
    std::unique_ptr<grpc::Server> server = b.BuildAndStart();
    if (!server) return absl::InternalError("cannot start the no-op sink");
    const auto t0 = Clock::now();
    Parallel(o.streams, [&](int s) {
      auto c = OwnConnection("unix:" + path);
      v1::AppendFramesResponse resp;
      err.Set("sink AppendFrames",
              c->AppendFrames(StreamId(s), frames[s], &resp));
    });
    r.raw_stream_mb_per_s = total_mb / Seconds(t0, Clock::now());
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(1));
    ::unlink(path.c_str());
  }
  if (!err.status().ok()) return err.status();

  // 4. The service: open the streams, then full-rate ingest.
  std::vector<std::unique_ptr<KvmemClient>> clients;
  for (int s = 0; s < o.streams; ++s) {
    clients.push_back(OwnConnection(o.target));
    if (!clients.back()->WaitForReady(std::chrono::seconds(10))) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", o.target));
    }
    clients.back()->DeleteStream(StreamId(s));  // A rerun starts afresh.
    v1::OpenStreamResponse opened;
    grpc::Status st = clients.back()->OpenStream(StreamId(s), config, &opened);
    if (!st.ok()) {
      return absl::InternalError(
          absl::StrCat("OpenStream: ", st.error_message()));
    }
  }
  {
    say(absl::StrCat("ingest: ", o.streams, " streams x ", o.frames,
                     " frames of ", r.frame_bytes / 1024, " KiB"));
    const ProcSample p0 = SampleProcess(o.server_pid);
    const auto t0 = Clock::now();
    Parallel(o.streams, [&](int s) {
      v1::AppendFramesResponse resp;
      err.Set("AppendFrames",
              clients[s]->AppendFrames(StreamId(s), frames[s], &resp));
    });
    const double secs = Seconds(t0, Clock::now());
    r.ingest_mb_per_s = total_mb / secs;
    r.ingest_frames_per_s = double(o.frames) * o.streams / secs;
    r.server_cpu_ingest = (SampleProcess(o.server_pid).cpu_s - p0.cpu_s) / secs;
  }
  if (!err.status().ok()) return err.status();
  Quiesce(o.server_pid);

  // 5. Recall (ids and metadata, no payload), all streams at once.
  {
    say(absl::StrCat("recall: ", o.streams, " streams x ", o.recalls));
    std::vector<std::vector<double>> lat(o.streams);
    const ProcSample p0 = SampleProcess(o.server_pid);
    const auto t0 = Clock::now();
    Parallel(o.streams, [&](int s) {
      CameraWorkload cam(o.seed * 1000 + s, g, 6, o.frames);
      for (int i = 0; i < o.recalls; ++i) {
        v1::RecallRequest req;
        req.set_stream_id(StreamId(s));
        const std::vector<float> q = cam.MakeQuery(i % o.frames);
        req.mutable_query()->Assign(q.begin(), q.end());
        req.mutable_budget()->set_top_k(o.recall_top_k);
        req.mutable_budget()->set_max_tokens(o.recall_max_tokens);
        v1::RecallResponse resp;
        const auto c0 = Clock::now();
        const grpc::Status st = clients[s]->Recall(req, &resp);
        lat[s].push_back(MicrosSince(c0));
        err.Set("Recall", st);
      }
    });
    const double secs = Seconds(t0, Clock::now());
    r.server_cpu_recall = (SampleProcess(o.server_pid).cpu_s - p0.cpu_s) / secs;
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    r.recall = Summarize(&all);
  }
  if (!err.status().ok()) return err.status();

  // 6. An empty unary RPC from as many callers: the transport's floor.
  {
    say("empty unary RPC reference");
    std::vector<std::vector<double>> lat(o.streams);
    Parallel(o.streams, [&](int s) {
      for (int i = 0; i < o.recalls; ++i) {
        grpc::health::v1::HealthCheckResponse resp;
        const auto c0 = Clock::now();
        const grpc::Status st = clients[s]->CheckHealth("", &resp);
        lat[s].push_back(MicrosSince(c0));
        err.Set("Health.Check", st);
      }
    });
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    r.empty_rpc = Summarize(&all);
  }
  if (!err.status().ok()) return err.status();

  // 7. Live: sessions append and recall each frame at the camera's pace.
  if (o.fps > 0) {
    say(absl::StrCat("live: ", o.streams, " sessions at ", o.fps, " fps for ",
                     o.live_seconds, " s"));
    r.live_fps = o.fps;
    const int n = std::max(1, static_cast<int>(o.fps * o.live_seconds));
    std::vector<std::vector<double>> app(o.streams), rec(o.streams),
        eng(o.streams), emp(o.streams);
    std::atomic<uint64_t> done{0};
    // Frames and queries come from the ingest phase's (built before the
    // clock starts): the load generator shares the machine's cores.
    std::vector<std::vector<std::vector<float>>> queries(o.streams);
    for (int s = 0; s < o.streams; ++s) {
      CameraWorkload cam(o.seed * 1000 + s, g, 6, o.frames);
      for (int i = 0; i < o.frames; ++i) queries[s].push_back(cam.MakeQuery(i));
    }
    const auto t0 = Clock::now();
    Parallel(o.streams, [&](int s) {
      const std::string id = StreamId(s) + "-live";
      clients[s]->DeleteStream(id);
      std::unique_ptr<SessionClient> session;
      err.Set("StartSession", clients[s]->StartSession(id, &config, &session));
      if (!session) return;
      // Cameras start spread over one frame interval.
      const auto start =
          Clock::now() + std::chrono::microseconds(
                             static_cast<int64_t>(1e6 / o.fps * s / o.streams));
      for (int i = 0; i < n; ++i) {
        std::this_thread::sleep_until(
            start +
            std::chrono::microseconds(static_cast<int64_t>(i * 1e6 / o.fps)));
        OutgoingFrame f = frames[s][i % o.frames];
        f.header.set_frame_index(i);
        f.header.set_first_token_position(static_cast<uint64_t>(i) *
                                          o.tokens_per_frame);
        v1::AppendAck ack;
        auto c0 = Clock::now();
        grpc::Status st = session->Append(f, &ack);
        app[s].push_back(MicrosSince(c0));
        if (!st.ok()) {
          err.Set("Session append", st);
          return;
        }
        v1::RecallRequest req;
        const std::vector<float>& q = queries[s][i % o.frames];
        req.mutable_query()->Assign(q.begin(), q.end());
        req.mutable_budget()->set_top_k(o.recall_top_k);
        req.mutable_budget()->set_max_tokens(o.recall_max_tokens);
        v1::RecallResponse resp;
        c0 = Clock::now();
        st = session->Recall(req, &resp);
        rec[s].push_back(MicrosSince(c0));
        if (!st.ok()) {
          err.Set("Session recall", st);
          return;
        }
        eng[s].push_back(resp.timing().total_us());
        // The transport's share under the same load: an empty unary RPC
        // (health Check) on the same connection, right after.
        grpc::health::v1::HealthCheckResponse health;
        c0 = Clock::now();
        st = clients[s]->CheckHealth("", &health);
        emp[s].push_back(MicrosSince(c0));
        if (!st.ok()) {
          err.Set("Health.Check", st);
          return;
        }
        ++done;
      }
      err.Set("Session finish", session->Finish());
      clients[s]->DeleteStream(id);
    });
    r.live_frames_per_s = done.load() / Seconds(t0, Clock::now());
    std::vector<double> a, b, e, m;
    for (int s = 0; s < o.streams; ++s) {
      a.insert(a.end(), app[s].begin(), app[s].end());
      b.insert(b.end(), rec[s].begin(), rec[s].end());
      e.insert(e.end(), eng[s].begin(), eng[s].end());
      m.insert(m.end(), emp[s].begin(), emp[s].end());
    }
    r.live_empty_rpc = Summarize(&m);
    r.live_append = Summarize(&a);
    r.live_recall = Summarize(&b);
    r.live_recall_engine = Summarize(&e);
  }
  if (!err.status().ok()) return err.status();
  for (int s = 0; s < o.streams; ++s) clients[s]->DeleteStream(StreamId(s));
  r.server_rss_mib = SampleProcess(o.server_pid).rss_mib;
  return r;
}

std::string BenchJson(const BenchReport& r) {
  auto lat = [](const char* name, const Latency& l) {
    return absl::StrFormat(
        "  \"%s_p50_us\": %.1f,\n  \"%s_p99_us\": %.1f,\n  \"%s_p999_us\": "
        "%.1f,\n",
        name, l.p50_us, name, l.p99_us, name, l.p999_us);
  };
  std::string s = "{\n";
  s += absl::StrFormat("  \"streams\": %d,\n  \"frame_bytes\": %d,\n",
                       r.streams, r.frame_bytes);
  s += absl::StrFormat("  \"kernel\": \"%s\",\n  \"cpu\": \"%s\",\n", r.kernel,
                       r.cpu);
  s += absl::StrFormat("  \"ingest_mb_per_s\": %.1f,\n", r.ingest_mb_per_s);
  s += absl::StrFormat("  \"ingest_frames_per_s\": %.1f,\n",
                       r.ingest_frames_per_s);
  s += absl::StrFormat("  \"raw_stream_mb_per_s\": %.1f,\n",
                       r.raw_stream_mb_per_s);
  s += absl::StrFormat("  \"storage_put_mb_per_s\": %.1f,\n",
                       r.storage_put_mb_per_s);
  s += lat("recall", r.recall);
  s += lat("empty_rpc", r.empty_rpc);
  s += lat("inproc_recall", r.inproc);
  s += absl::StrFormat("  \"inproc_recall_at_16\": %.4f,\n",
                       r.inproc_recall_at_k);
  s += absl::StrFormat("  \"inproc_fp32_candidates\": %.1f,\n",
                       r.inproc_candidates);
  s += lat("flat_faiss", r.flat);
  s += lat("stream_recall_mass", r.stream_mass);
  s += lat("stream_recall_summed", r.stream_summed);
  s += lat("wide_inproc_recall", r.wide_inproc);
  s += lat("wide_flat_faiss", r.wide_flat);
  s +=
      absl::StrFormat("  \"live_fps\": %.2f,\n  \"live_frames_per_s\": %.1f,\n",
                      r.live_fps, r.live_frames_per_s);
  s += lat("live_append", r.live_append);
  s += lat("live_recall", r.live_recall);
  s += lat("live_recall_engine", r.live_recall_engine);
  s += lat("live_empty_rpc", r.live_empty_rpc);
  s += absl::StrFormat("  \"server_rss_mib\": %.1f,\n", r.server_rss_mib);
  s += absl::StrFormat("  \"server_cpu_ingest\": %.2f,\n", r.server_cpu_ingest);
  s += absl::StrFormat("  \"server_cpu_recall\": %.2f,\n", r.server_cpu_recall);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  s += absl::StrFormat(
      "  \"ingest_vs_storage\": %.3f,\n  \"ingest_vs_raw_stream\": %.3f,\n"
      "  \"recall_p99_vs_empty_rpc_p99\": %.3f,\n"
      "  \"flat_faiss_p99_vs_inproc_p99\": %.2f,\n"
      "  \"stream_recall_mass_p99_vs_summed_p99\": %.2f\n",
      ratio(r.ingest_mb_per_s, r.storage_put_mb_per_s),
      ratio(r.ingest_mb_per_s, r.raw_stream_mb_per_s),
      ratio(r.recall.p99_us, r.empty_rpc.p99_us),
      ratio(r.flat.p99_us, r.inproc.p99_us),
      ratio(r.stream_mass.p99_us, r.stream_summed.p99_us));
  s += "}\n";
  return s;
}

std::string BenchText(const BenchReport& r) {
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::string s;
  s += absl::StrFormat(
      "kvmem bench: %d streams, %.0f KiB frames, int8 kernel %s, CPU %s\n",
      r.streams, r.frame_bytes / 1024.0, r.kernel, r.cpu);
  s += absl::StrFormat(
      "  in-process recall   p50 %7.1f us  p99 %7.1f us  recall@16 %.4f  "
      "(%.0f rescored)\n",
      r.inproc.p50_us, r.inproc.p99_us, r.inproc_recall_at_k,
      r.inproc_candidates);
  s += absl::StrFormat(
      "    vs FAISS flat     p50 %7.1f us  p99 %7.1f us  -> %.1fx faster "
      "(p99)\n",
      r.flat.p50_us, r.flat.p99_us, ratio(r.flat.p99_us, r.inproc.p99_us));
  s += absl::StrFormat(
      "  stream recall, per-head mass  p50 %7.1f us  p99 %7.1f us; summed "
      "score p50 %.1f us p99 %.1f us (p99 x%.2f)\n",
      r.stream_mass.p50_us, r.stream_mass.p99_us, r.stream_summed.p50_us,
      r.stream_summed.p99_us,
      ratio(r.stream_mass.p99_us, r.stream_summed.p99_us));
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
      ratio(r.ingest_mb_per_s, r.storage_put_mb_per_s), r.raw_stream_mb_per_s,
      ratio(r.ingest_mb_per_s, r.raw_stream_mb_per_s));
  s += absl::StrFormat(
      "  recall RPC          p50 %7.1f us  p99 %7.1f us  p999 %7.1f us; "
      "empty RPC p99 %.1f us (x%.2f)\n",
      r.recall.p50_us, r.recall.p99_us, r.recall.p999_us, r.empty_rpc.p99_us,
      ratio(r.recall.p99_us, r.empty_rpc.p99_us));
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
        ratio(r.live_recall.p99_us, r.live_empty_rpc.p99_us));
  }
  if (r.server_rss_mib > 0) {
    s += absl::StrFormat(
        "  server              RSS %.0f MiB; CPU %.2f cores ingesting, %.2f "
        "recalling\n",
        r.server_rss_mib, r.server_cpu_ingest, r.server_cpu_recall);
  }
  return s;
}

}  // namespace kvmem
