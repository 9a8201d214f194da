// kvmem_crash_test: kill -9 trials against the real kvmem-server,
// in the manner of RocksDB's db_crashtest: crash at random moments, restart,
// verify against what the client was told.
//
// Each trial starts kvmem-server on one data directory (kept across trials)
// and first checks what the previous crash left, per stream:
//   - last_durable_frame is at least the last frame the server acknowledged
//     (nothing acknowledged is lost) and below the frames sent;
//   - sealed blocks and open-block frames match that frame count;
//   - every sealed block's bytes (FetchBlocks) equal the frames sent;
//   - recalls equal an exact oracle over the durable frames (the indexes
//     were rebuilt from what survived, nothing more or less): the same
//     blocks with the same masses, in the oracle's order up to ties within
//     the masses' tolerance (the server sums in float).
// Then every stream resumes at last_durable_frame + 1 (even streams through
// Session, one ack per frame; odd ones through AppendFrames, 8 frames per
// call) until the server is killed with SIGKILL at a random moment; a
// stream that acknowledges nothing in a trial is stuck, and fails the run.
// Streams demote every block as it seals (a 1-byte warm budget rewrites its
// KV layer-major on disk) and rebuild their index every 3 blocks, so kills
// land during demotions and rebuilds as well as appends. The WAL policy
// (--wal_sync) rotates per trial; kill -9 must lose nothing under any of
// them. After the last trial, CloseStream seals the partial blocks, whose
// bytes are checked too, and SIGTERM must exit 0.
//
// Exit status 0 when every check held; 1 with the first failure printed
// (and the work directory kept for inspection).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/kvmem_client.h"
#include "tests/stream_model.h"
#include "tests/tool_util.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

ABSL_FLAG(int32_t, trials, 10, "kill -9 trials.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of frames, queries and kill times.");
ABSL_FLAG(int32_t, streams, 4, "Camera streams written concurrently.");
ABSL_FLAG(std::string, wal_sync, "all",
          "kvmem-server --wal_sync: commit, interval, off, or all (rotated "
          "per trial).");
ABSL_FLAG(int32_t, full_check_every, 1,
          "Re-read every sealed block at every Nth restart (and the last); "
          "the restarts between read the blocks sealed since the previous "
          "one and 16 older ones at random. 1: every restart reads all (the "
          "run's cost then grows with the square of the trials).");
ABSL_FLAG(int32_t, min_kill_ms, 200, "Earliest kill after the writers start.");
ABSL_FLAG(int32_t, max_kill_ms, 1200, "Latest kill after the writers start.");
ABSL_FLAG(std::string, work_dir, "",
          "Data directory, socket and logs (default /tmp/kvmem-crash-PID); "
          "emptied first, removed after a passing run.");
ABSL_FLAG(std::string, server, KVMEM_SERVER_BINARY, "The kvmem-server binary.");

namespace kvmem {
namespace {

using testing::ModelFrame;
using testing::StreamModel;
using testing::TestGeometry;
using testing::ToOutgoing;

constexpr uint32_t kFpb = 4;
constexpr uint32_t kWindow = 64;
constexpr uint32_t kTokens = 16;
constexpr int kBatch = 8;

struct Camera {
  Camera(std::string id, const TestGeometry& g, uint64_t seed)
      : id(std::move(id)), model(g, kFpb, kWindow, {1, 2}), rng(seed) {}
  std::string id;
  StreamModel model;  // Holds exactly the frames sent.
  std::mt19937_64 rng;
  int64_t acked = -1;            // Last frame the server acknowledged.
  uint64_t verified_blocks = 0;  // Blocks [0, this) were read back intact.
};

struct Totals {
  int trials = 0;
  uint64_t acked = 0;            // Frames acknowledged, all trials.
  uint64_t unacked_durable = 0;  // Sent, not acknowledged, found durable.
  uint64_t unacked_lost = 0;     // Sent, not acknowledged, not durable.
  uint64_t verified_frames = 0;  // Frame copies compared byte for byte.
  uint64_t verified_bytes = 0;
  uint64_t recalls = 0;       // Recalls compared with the oracle.
  uint64_t tied_recalls = 0;  // ... whose order differed within a float tie.
  double max_mass_error = 0;  // Largest |server - oracle| / oracle mass.
  double min_rank_gap = 1;    // Closest relative gap in the oracle's top k+1.
  uint64_t demotions = 0, rebuilds = 0;  // In the servers before each kill.
};

v1::StreamConfig Config(const TestGeometry& g) {
  v1::StreamConfig c = testing::WireConfig(g, kWindow, kFpb, {1, 2});
  c.mutable_tier_policy()->set_warm_budget_bytes(1);
  c.mutable_tier_policy()->set_rebuild_every_blocks(3);
  return c;
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("status ", s.error_code(), ": ", s.error_message());
}

// Fetches blocks `all` and compares them with the model. "" when equal.
std::string CheckBlocks(KvmemClient& client, const Camera& cam,
                        const std::vector<uint64_t>& all, Totals* t) {
  for (size_t first = 0; first < all.size(); first += 256) {
    const std::vector<uint64_t> ids(
        all.begin() + first,
        all.begin() + std::min<size_t>(all.size(), first + 256));
    std::vector<FetchedBlock> got;
    grpc::Status s = client.FetchBlocks(cam.id, ids, &got);
    if (!s.ok()) return absl::StrCat("FetchBlocks: ", Describe(s));
    if (got.size() != ids.size()) {
      return absl::StrCat("FetchBlocks returned ", got.size(), " of ",
                          ids.size(), " blocks");
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string want = cam.model.BlockBytes(ids[i]);
      if (got[i].payload != want) {
        return absl::StrCat("block ", ids[i], ": ", got[i].payload.size(),
                            " bytes differ from the ", want.size(), " sent");
      }
      t->verified_frames +=
          got[i].info.last_frame() - got[i].info.first_frame() + 1;
      t->verified_bytes += want.size();
    }
  }
  return "";
}

// Blocks [0, n).
std::vector<uint64_t> AllBlocks(uint64_t n) {
  std::vector<uint64_t> ids(n);
  for (uint64_t b = 0; b < n; ++b) ids[b] = b;
  return ids;
}

// Checks one stream after a restart and brings the camera's record to the
// server's resume point. "" when every check held. full: every sealed
// block is read back; else those not read back yet and 16 older ones.
std::string Verify(KvmemClient& client, Camera& cam, Totals* t, bool full) {
  v1::StreamStats st;
  grpc::Status s = client.GetStreamStats(cam.id, &st);
  if (!s.ok()) return absl::StrCat("GetStreamStats: ", Describe(s));
  const int64_t durable = st.last_durable_frame();
  const int64_t sent = static_cast<int64_t>(cam.model.frames().size());
  if (durable < cam.acked) {
    return absl::StrCat("acknowledged frames lost: frame ", cam.acked,
                        " was acknowledged, last durable frame is ", durable);
  }
  if (durable >= sent) {
    return absl::StrCat("last durable frame ", durable, " was never sent (",
                        sent, " sent)");
  }
  t->unacked_durable += durable - cam.acked;
  t->unacked_lost += sent - 1 - durable;
  cam.model.Truncate(static_cast<size_t>(durable + 1));
  cam.acked = durable;
  const uint64_t frames = static_cast<uint64_t>(durable + 1);
  if (st.sealed_blocks() != frames / kFpb ||
      st.open_block_frames() != frames % kFpb) {
    return absl::StrCat(frames, " durable frames but ", st.sealed_blocks(),
                        " sealed blocks and ", st.open_block_frames(),
                        " frames in the open block");
  }
  const uint64_t sealed = frames / kFpb;
  std::vector<uint64_t> ids;
  if (full) {
    ids = AllBlocks(sealed);
  } else {
    for (int i = 0; i < 16 && cam.verified_blocks > 0; ++i) {
      ids.push_back(cam.rng() % cam.verified_blocks);
    }
    for (uint64_t b = cam.verified_blocks; b < sealed; ++b) ids.push_back(b);
  }
  const std::string blocks = CheckBlocks(client, cam, ids, t);
  if (!blocks.empty()) return blocks;
  cam.verified_blocks = sealed;
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> q =
        testing::RandomQuery(cam.rng, cam.model.summary_dim());
    const uint32_t k = 1 + i % 6, tokens = kTokens * kFpb * (1 + i);
    v1::RecallRequest req;
    req.set_stream_id(cam.id);
    req.mutable_query()->Assign(q.begin(), q.end());
    req.mutable_budget()->set_top_k(k);
    req.mutable_budget()->set_max_tokens(tokens);
    v1::RecallResponse resp;
    s = client.Recall(req, &resp);
    if (!s.ok()) return absl::StrCat("Recall: ", Describe(s));
    // The default score (per-head mass) with kvmem's own window estimate:
    // it reads the open block as recovered, too.
    std::map<uint64_t, double> density;  // Every recallable block's.
    const auto want = cam.model.MassRecall(q, {}, k, tokens, 0, 0, &density);
    // Each returned block's mass is the oracle's for that block (within
    // kTol), and it ranks where the oracle's j-th does, up to a tie within
    // kTieTol: the server sums in float, the oracle in double, so two blocks
    // whose masses differ by less than the server's error may come in
    // either order (every block here has the same tokens). Measured over
    // 240 trials (seeds 1-8, 3,840 recalls): the server's largest relative
    // mass error 2.8e-7, the oracle's closest gap between adjacent ranks
    // 9.5e-7 (1e-6 to 3e-5 per 30 trials; both are printed at the end), so
    // a swap is expected about once in several hundred trials, as the one
    // seen in ~700 before this allowance. A block counted twice, or one
    // missing from the index, fails either test.
    constexpr double kTol = 1e-4, kTieTol = 1e-5;
    bool same = resp.blocks_size() == static_cast<int>(want.size());
    bool tied = false;
    for (int j = 0; same && j < resp.blocks_size(); ++j) {
      const v1::RecalledBlock& b = resp.blocks(j);
      const auto d = density.find(b.block_id());
      const double own =
          d == density.end() ? -1.0 : d->second * b.token_count();
      same = own >= 0 && b.token_count() == want[j].tokens &&
             std::abs(b.mass() - own) <= kTol * own + 1e-12 &&
             std::abs(own - want[j].mass) <= kTieTol * want[j].mass + 1e-12;
      tied = tied || (same && b.block_id() != want[j].block_id);
      if (own > 0) {
        t->max_mass_error =
            std::max(t->max_mass_error, std::abs(b.mass() - own) / own);
      }
    }
    // How close the oracle's ranking came to a tie (the margin the server's
    // float sums must stay within for the orders to agree).
    std::vector<double> top;
    for (const auto& [id, d] : density) top.push_back(d);
    const size_t keep = std::min(top.size(), size_t{k} + 1);
    std::partial_sort(top.begin(), top.begin() + keep, top.end(),
                      std::greater<double>());
    for (size_t j = 0; j + 1 < keep; ++j) {
      if (top[j] > 0) {
        t->min_rank_gap =
            std::min(t->min_rank_gap, (top[j] - top[j + 1]) / top[j]);
      }
    }
    if (!same) {
      std::string got_ids, want_ids;
      // Ids with their masses: a one-off mismatch (seen once in about 700
      // trials, 2026-12-06) says more with both lists' values beside it.
      for (const auto& b : resp.blocks()) {
        const auto d = density.find(b.block_id());
        absl::StrAppend(&got_ids, " ", b.block_id(), ":", b.mass(), " (oracle ",
                        d == density.end() ? -1.0 : d->second * b.token_count(),
                        ")");
      }
      for (const auto& h : want) {
        absl::StrAppend(&want_ids, " ", h.block_id, ":", h.mass);
      }
      return absl::StrCat("recall ", i, " returned blocks [", got_ids,
                          " ], the oracle [", want_ids, " ]");
    }
    t->tied_recalls += tied ? 1 : 0;
    ++t->recalls;
  }
  return "";
}

// Appends until the server goes away. Even streams use a Session (an ack
// per frame), odd ones AppendFrames calls of kBatch frames.
void Write(KvmemClient& client, Camera& cam, bool session_mode) {
  if (session_mode) {
    std::unique_ptr<SessionClient> session;
    if (!client.StartSession(cam.id, nullptr, &session).ok()) return;
    for (;;) {
      const uint64_t i = cam.model.frames().size();
      const ModelFrame& m = cam.model.AddFrame(cam.rng, kTokens);
      v1::AppendAck ack;
      if (!session->Append(ToOutgoing(m, i), &ack).ok()) return;
      cam.acked = ack.last_durable_frame();
    }
  }
  for (;;) {
    std::vector<OutgoingFrame> batch;
    for (int j = 0; j < kBatch; ++j) {
      const uint64_t i = cam.model.frames().size();
      batch.push_back(ToOutgoing(cam.model.AddFrame(cam.rng, kTokens), i));
    }
    v1::AppendFramesResponse resp;
    if (!client.AppendFrames(cam.id, batch, &resp).ok()) return;
    cam.acked = resp.last_durable_frame();
  }
}

int Fail(const std::string& what, const std::string& dir) {
  return testing::ToolFailure("kvmem_crash_test", what, dir);
}

int Run() {
  const int trials = absl::GetFlag(FLAGS_trials);
  const int streams = absl::GetFlag(FLAGS_streams);
  const int min_ms = absl::GetFlag(FLAGS_min_kill_ms);
  const int max_ms = absl::GetFlag(FLAGS_max_kill_ms);
  const int full_every = absl::GetFlag(FLAGS_full_check_every);
  const std::string policy = absl::GetFlag(FLAGS_wal_sync);
  std::vector<std::string> policies = {policy};
  if (policy == "all") policies = {"commit", "interval", "off"};
  if (trials < 1 || streams < 1 || full_every < 1 || min_ms < 0 ||
      max_ms < min_ms) {
    std::fprintf(stderr,
                 "kvmem_crash_test: --trials, --streams and "
                 "--full_check_every must be >= 1 and 0 <= --min_kill_ms <= "
                 "--max_kill_ms\n");
    return 2;
  }
  const std::string dir =
      testing::FreshWorkDir(absl::GetFlag(FLAGS_work_dir), "crash");

  const TestGeometry g;
  const v1::StreamConfig config = Config(g);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::vector<std::unique_ptr<Camera>> cams;
  for (int s = 0; s < streams; ++s) {
    cams.push_back(std::make_unique<Camera>(absl::StrCat("cam-", s), g,
                                            rng() ^ static_cast<uint64_t>(s)));
  }
  Totals t;
  std::unique_ptr<ServerProcess> server;
  // Starts the server with the trial's WAL policy and connects one client
  // per stream.
  auto start = [&](int trial, std::vector<std::unique_ptr<KvmemClient>>* cl,
                   std::string* error) {
    ServerProcessOptions o;
    o.binary = absl::GetFlag(FLAGS_server);
    o.data_dir = dir + "/data";
    o.unix_socket = dir + "/kvmem.sock";
    o.log_file = absl::StrCat(dir, "/server-", trial, ".log");
    o.extra_args = {
        absl::StrCat("--wal_sync=", policies[trial % policies.size()]),
        "--wal_sync_interval_ms=50",
        // Rebuilds every 3 blocks however many the streams keep.
        "--rebuild_kept_per_sealed=0"};
    server = std::make_unique<ServerProcess>(o);
    if (!server->Start(std::chrono::seconds(60), error)) return false;
    cl->clear();
    ClientOptions co;
    co.own_connection = true;
    co.chunk_bytes = 4096;  // Frames of 6 KiB: two chunks each.
    for (int s = 0; s < streams; ++s) {
      cl->push_back(KvmemClient::Connect(server->target(), co));
    }
    return true;
  };

  std::vector<std::unique_ptr<KvmemClient>> clients;
  for (int trial = 0; trial < trials; ++trial) {
    std::string error;
    if (!start(trial, &clients, &error)) {
      return Fail(absl::StrCat("trial ", trial, ": start: ", error), dir);
    }
    std::vector<int64_t> acked_before(streams);
    for (int s = 0; s < streams; ++s) {
      Camera& cam = *cams[s];
      if (trial == 0) {
        v1::OpenStreamResponse opened;
        grpc::Status st = clients[s]->OpenStream(cam.id, config, &opened);
        if (!st.ok()) return Fail("OpenStream: " + Describe(st), dir);
      } else {
        const std::string e =
            Verify(*clients[s], cam, &t, trial % full_every == 0);
        if (!e.empty()) {
          return Fail(absl::StrCat("trial ", trial, ", ", cam.id, ": ", e),
                      dir);
        }
      }
      acked_before[s] = cam.acked;
    }
    std::vector<std::thread> writers;
    for (int s = 0; s < streams; ++s) {
      writers.emplace_back([&, s] {
        Write(*clients[s], *cams[s], /*session_mode=*/s % 2 == 0);
      });
    }
    const int wait_ms = std::uniform_int_distribution<int>(min_ms, max_ms)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    // The server's counters (per process) just before the kill: the tier
    // moves and rebuilds the trial's kill could land in.
    for (int s = 0; s < streams; ++s) {
      v1::StreamStats st;
      if (clients[s]->GetStreamStats(cams[s]->id, &st).ok()) {
        t.demotions += st.policy().demotions();
        t.rebuilds += st.policy().rebuilds();
      }
    }
    server->Kill();
    for (auto& w : writers) w.join();
    ++t.trials;
    for (int s = 0; s < streams; ++s) {
      if (cams[s]->acked <= acked_before[s]) {
        return Fail(
            absl::StrCat("trial ", trial, ", ", cams[s]->id,
                         ": stuck, no frame acknowledged in ", wait_ms, " ms"),
            dir);
      }
      t.acked += cams[s]->acked - acked_before[s];
    }
    std::printf("trial %d (wal_sync %s): killed after %d ms\n", trial,
                policies[trial % policies.size()].c_str(), wait_ms);
    std::fflush(stdout);
  }

  // Final restart: verify, close (sealing the partial blocks), verify those.
  std::string error;
  if (!start(trials, &clients, &error))
    return Fail("final start: " + error, dir);
  for (int s = 0; s < streams; ++s) {
    Camera& cam = *cams[s];
    std::string e = Verify(*clients[s], cam, &t, /*full=*/true);
    if (!e.empty()) return Fail(absl::StrCat("final, ", cam.id, ": ", e), dir);
    v1::StreamStats closed;
    grpc::Status st = clients[s]->CloseStream(cam.id, &closed);
    if (!st.ok()) return Fail("CloseStream: " + Describe(st), dir);
    cam.model.Close();
    e = CheckBlocks(*clients[s], cam, AllBlocks(cam.model.sealed_blocks()), &t);
    if (!e.empty()) {
      return Fail(absl::StrCat("after close, ", cam.id, ": ", e), dir);
    }
  }
  clients.clear();
  const int code = server->Stop();
  if (code != 0) {
    return Fail(absl::StrCat("SIGTERM exit status ", code), dir);
  }
  std::printf(
      "kvmem_crash_test: %d kill -9 trials, %d streams, wal_sync %s: %llu "
      "frames acknowledged, 0 lost; %llu sent but unacknowledged frames "
      "found durable, %llu not; %llu frame copies (%.1f MiB) verified "
      "byte-identical; %llu recalls equal to the oracle (%llu of them in "
      "another order within a float tie; largest mass error %.2g, closest "
      "relative gap in the oracle's ranking %.2g); %llu demotions and "
      "%llu index rebuilds ran in the killed servers\n",
      t.trials, streams, policy.c_str(),
      static_cast<unsigned long long>(t.acked),
      static_cast<unsigned long long>(t.unacked_durable),
      static_cast<unsigned long long>(t.unacked_lost),
      static_cast<unsigned long long>(t.verified_frames),
      t.verified_bytes / 1048576.0, static_cast<unsigned long long>(t.recalls),
      static_cast<unsigned long long>(t.tied_recalls), t.max_mass_error,
      t.min_rank_gap, static_cast<unsigned long long>(t.demotions),
      static_cast<unsigned long long>(t.rebuilds));
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvmem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvmem::Run();
}
