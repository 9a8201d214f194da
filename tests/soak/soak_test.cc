// kvmem_soak_test: camera sessions appending and recalling every frame at a
// camera's pace against the real kvmem-server (unix socket) for a bounded
// time, with tier budgets and a storage cap so the streams reach a steady
// state (blocks demote, degrade and are evicted while new ones arrive). The
// server's RSS and open file descriptors are sampled every second.
//
// Passes when, after the warm-up (--warmup_seconds: RocksDB's caches and
// memtables and the allocator's arenas fill over the first ~40 s), the
// least-squares RSS slope stays under --max_rss_slope_kib_s, the fd count
// stays under the
// warm-up's maximum plus --fd_margin (RocksDB opens and closes SST and blob
// files as it flushes and compacts), every append and recall succeeded,
// every stream's acknowledged frames are all there, and SIGTERM exits 0.
// Prints the samples' summary (docs/reliability.md's table quotes it).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/kvmem_client.h"
#include "tests/test_util.h"
#include "tests/tool_util.h"
#include "tools/common/server_process.h"

ABSL_FLAG(int32_t, seconds, 90, "Length of the soak.");
ABSL_FLAG(int32_t, warmup_seconds, 45,
          "Seconds before the RSS slope is measured.");
ABSL_FLAG(int32_t, streams, 4, "Camera sessions.");
ABSL_FLAG(double, fps, 10, "Frames per second per camera.");
ABSL_FLAG(double, max_rss_slope_kib_s, 256,
          "Largest RSS growth after warm-up, KiB/s.");
ABSL_FLAG(int32_t, fd_margin, 32,
          "Open fds allowed above the warm-up's maximum.");
ABSL_FLAG(std::string, work_dir, "",
          "Data and logs (default /tmp/kvmem-soak-PID); removed on a pass.");
ABSL_FLAG(std::string, server, KVMEM_SERVER_BINARY, "The kvmem-server binary.");

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

// 4 layers x 2 kv heads x 64 dims fp16, 32 tokens: 64 KiB per frame.
constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 64, kTokens = 32;
constexpr uint64_t kFrameBytes = 2ull * kLayers * kHeads * kDim * kTokens * 2;

v1::StreamConfig Config() {
  v1::StreamConfig c;
  auto* g = c.mutable_geometry();
  g->set_layers(kLayers);
  g->set_kv_heads(kHeads);
  g->set_head_dim(kDim);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(kTokens);
  c.set_hot_window_tokens(8 * kTokens);
  c.mutable_block_policy()->set_frames_per_block(4);
  c.mutable_index_policy()->add_indexed_layers(kLayers - 1);
  c.mutable_index_policy()->set_index_factory("Progressive");
  // Steady state: 1 MiB warm, 2 MiB full precision on disk, 6 MiB in all.
  c.mutable_tier_policy()->set_warm_budget_bytes(1 << 20);
  c.mutable_tier_policy()->set_cold_budget_bytes(2 << 20);
  c.mutable_tier_policy()->set_storage_cap_bytes(6 << 20);
  c.mutable_tier_policy()->set_rebuild_every_blocks(64);
  return c;
}

struct Sample {
  double t, rss_kib;
  int fds;
};

Sample Measure(pid_t pid, double t) {
  Sample s{t, 0, 0};
  s.rss_kib = testing::RssKib(pid);
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/fd"), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++s.fds;
  }
  return s;
}

// Least-squares slope of rss over t.
double Slope(const std::vector<Sample>& v) {
  double st = 0, sr = 0, stt = 0, str = 0;
  for (const Sample& s : v) {
    st += s.t;
    sr += s.rss_kib;
    stt += s.t * s.t;
    str += s.t * s.rss_kib;
  }
  const double n = static_cast<double>(v.size());
  const double d = n * stt - st * st;
  return d == 0 ? 0 : (n * str - st * sr) / d;
}

int Fail(const std::string& what, const std::string& dir) {
  return testing::ToolFailure("kvmem_soak_test", what, dir);
}

int Run() {
  const int seconds = absl::GetFlag(FLAGS_seconds);
  const int streams = absl::GetFlag(FLAGS_streams);
  const double fps = absl::GetFlag(FLAGS_fps);
  const int warmup = absl::GetFlag(FLAGS_warmup_seconds);
  if (warmup < 1 || seconds < warmup + 10 || streams < 1 ||
      !(fps > 0 && fps <= 1000)) {
    std::fprintf(stderr,
                 "kvmem_soak_test: --warmup_seconds >= 1, --seconds >= "
                 "warm-up + 10, --streams >= 1, --fps in (0, 1000]\n");
    return 2;
  }
  const std::string dir =
      testing::FreshWorkDir(absl::GetFlag(FLAGS_work_dir), "soak");
  ServerProcessOptions o;
  o.binary = absl::GetFlag(FLAGS_server);
  o.data_dir = dir + "/data";
  o.unix_socket = dir + "/kvmem.sock";
  o.log_file = dir + "/server.log";
  // Small memtables, so flushes reach their steady state within the run.
  o.extra_args = {"--rocksdb_write_buffer_mib=4",
                  "--rocksdb_block_cache_mib=8"};
  ServerProcess server(o);
  std::string error;
  if (!server.Start(std::chrono::seconds(60), &error)) return Fail(error, dir);

  const v1::StreamConfig config = Config();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> appends{0}, recalls{0};
  std::vector<std::string> errors(streams);
  std::vector<int64_t> acked(streams, -1);
  std::vector<std::thread> cams;
  const auto start = Clock::now();
  for (int s = 0; s < streams; ++s) {
    cams.emplace_back([&, s] {
      ClientOptions co;
      co.own_connection = true;
      auto client = KvmemClient::Connect(server.target(), co);
      const std::string id = absl::StrCat("soak-", s);
      std::unique_ptr<SessionClient> session;
      grpc::Status st = client->StartSession(id, &config, &session);
      if (!st.ok()) {
        errors[s] = "StartSession: " + st.error_message();
        return;
      }
      std::mt19937_64 rng(s + 1);
      std::uniform_int_distribution<int> half(0x3000, 0x3bff);  // 0.125..1
      OutgoingFrame f;
      f.header.set_token_count(kTokens);
      f.payload.resize(kFrameBytes);
      for (uint64_t i = 0; !stop.load(); ++i) {
        std::this_thread::sleep_until(
            start + std::chrono::microseconds(static_cast<int64_t>(
                        (i + double(s) / streams) * 1e6 / fps)));
        for (size_t b = 0; b < kFrameBytes; b += 2) {
          const uint16_t h =
              static_cast<uint16_t>(half(rng)) | (rng() & 1 ? 0x8000 : 0);
          f.payload[b] = static_cast<char>(h & 0xff);
          f.payload[b + 1] = static_cast<char>(h >> 8);
        }
        f.header.set_frame_index(i);
        f.header.set_first_token_position(i * kTokens);
        v1::AppendAck ack;
        st = session->Append(f, &ack);
        if (!st.ok()) {
          errors[s] = absl::StrCat("Append ", i, ": ", st.error_message());
          return;
        }
        acked[s] = ack.last_durable_frame();
        ++appends;
        v1::RecallRequest req;
        const auto q = testing::RandomQuery(rng, kHeads * kDim);
        req.mutable_query()->Assign(q.begin(), q.end());
        req.mutable_budget()->set_top_k(8);
        req.mutable_budget()->set_max_tokens(4 * kTokens);
        v1::RecallResponse resp;
        st = session->Recall(req, &resp);
        if (!st.ok()) {
          errors[s] = absl::StrCat("Recall ", i, ": ", st.error_message());
          return;
        }
        ++recalls;
      }
      st = session->Finish();
      if (!st.ok()) errors[s] = "Finish: " + st.error_message();
    });
  }
  std::vector<Sample> samples;
  for (int i = 1; i <= seconds; ++i) {
    std::this_thread::sleep_until(start + std::chrono::seconds(i));
    samples.push_back(Measure(server.pid(), i));
  }
  stop = true;
  for (auto& t : cams) t.join();
  for (int s = 0; s < streams; ++s) {
    if (!errors[s].empty())
      return Fail(absl::StrCat("soak-", s, ": ", errors[s]), dir);
  }
  // Every acknowledged frame is there.
  auto client = KvmemClient::Connect(server.target());
  uint64_t evicted = 0, degraded = 0;
  for (int s = 0; s < streams; ++s) {
    v1::StreamStats st;
    grpc::Status g = client->GetStreamStats(absl::StrCat("soak-", s), &st);
    if (!g.ok()) return Fail("GetStreamStats: " + g.error_message(), dir);
    if (st.last_durable_frame() != acked[s]) {
      return Fail(
          absl::StrCat("soak-", s, ": last durable frame ",
                       st.last_durable_frame(), ", acknowledged ", acked[s]),
          dir);
    }
    evicted += st.evicted().blocks();
    degraded += st.degraded().blocks();
  }
  client.reset();
  const size_t warm = static_cast<size_t>(warmup);
  const std::vector<Sample> steady(samples.begin() + warm, samples.end());
  int warm_fds = 0, steady_fds = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    (i < warm ? warm_fds : steady_fds) =
        std::max(i < warm ? warm_fds : steady_fds, samples[i].fds);
  }
  const double slope = Slope(steady);
  const int code = server.Stop();
  std::string curve;  // RSS every 10 s, MiB.
  for (size_t i = 9; i < samples.size(); i += 10) {
    absl::StrAppend(&curve, i == 9 ? "" : " ",
                    static_cast<int>(samples[i].rss_kib / 1024));
  }
  std::printf("kvmem_soak_test: RSS every 10 s (MiB): %s\n", curve.c_str());
  std::printf(
      "kvmem_soak_test: %d s, %d streams at %.1f fps (64 KiB frames): %llu "
      "appends, %llu recalls, 0 errors; server RSS %.1f MiB at %d s, %.1f "
      "MiB at the end, slope after warm-up %.1f KiB/s (bound %.0f); open "
      "fds max %d in warm-up, %d after (margin %d); %llu blocks degraded, "
      "%llu evicted at the end; SIGTERM exit %d\n",
      seconds, streams, fps, static_cast<unsigned long long>(appends.load()),
      static_cast<unsigned long long>(recalls.load()),
      steady.front().rss_kib / 1024, static_cast<int>(steady.front().t),
      samples.back().rss_kib / 1024, slope,
      absl::GetFlag(FLAGS_max_rss_slope_kib_s), warm_fds, steady_fds,
      absl::GetFlag(FLAGS_fd_margin), static_cast<unsigned long long>(degraded),
      static_cast<unsigned long long>(evicted), code);
  if (slope > absl::GetFlag(FLAGS_max_rss_slope_kib_s)) {
    return Fail(absl::StrCat("RSS slope ", slope, " KiB/s"), dir);
  }
  if (steady_fds > warm_fds + absl::GetFlag(FLAGS_fd_margin)) {
    return Fail(
        absl::StrCat("open fds grew from ", warm_fds, " to ", steady_fds), dir);
  }
  if (code != 0) return Fail(absl::StrCat("SIGTERM exit ", code), dir);
  if (evicted == 0) return Fail("no block was evicted: no steady state", dir);
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvmem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvmem::Run();
}
