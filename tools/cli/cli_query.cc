// `kvmem recall` and `kvmem stats`.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cpp/kvmem_client.h"
#include "tools/cli/cli.h"
#include "tools/common/json_writer.h"
#include "tools/common/terminal.h"

ABSL_FLAG(std::string, stream, "", "Stream id (recall, stats).");
ABSL_FLAG(std::string, query, "",
          "recall: comma-separated floats, summary_dim of them.");
ABSL_FLAG(int64_t, query_seed, -1,
          "recall: use a random N(0,1) query of the stream's summary_dim "
          "from this seed instead of --query.");
ABSL_FLAG(uint32_t, top_k, 0, "recall: candidate blocks (0: stream default).");
ABSL_FLAG(uint32_t, max_tokens, 0, "recall: token budget (0: stream default).");
ABSL_FLAG(bool, per_layer, false, "recall: one recall set per indexed layer.");
ABSL_FLAG(uint32_t, priority, 0,
          "recall: priority in the accelerator's queue (higher first).");

namespace kvmem {
namespace {

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

void PrintStatsHuman(const v1::StreamStats& s) {
  const auto& g = s.config().geometry();
  std::printf(
      "stream %s%s\n"
      "  geometry        %u layers x %u kv_heads x %u head_dim, %s, <= %u "
      "tokens/frame\n"
      "  hot window      %u tokens; %u frames/block; summary dim %u\n"
      "  frames          %llu (last durable %lld), %llu tokens, next position "
      "%llu\n"
      "  blocks          %llu sealed, %u frames in the open block\n"
      "  memory          %.2f MiB KV appended, %.1f KiB summaries, %.1f KiB "
      "token codes, %.1f KiB of indexes and %.1f KiB of signals (%llu "
      "tracks) in RAM\n"
      "  recalls         %llu, %llu blocks, %llu tokens recalled\n",
      s.stream_id().c_str(), s.closed() ? " (closed)" : "", g.layers(),
      g.kv_heads(), g.head_dim(), v1::DType_Name(g.dtype()).c_str(),
      g.max_tokens_per_frame(), s.config().hot_window_tokens(),
      s.config().block_policy().frames_per_block(), s.summary_dim(),
      static_cast<unsigned long long>(s.frames()),
      static_cast<long long>(s.last_durable_frame()),
      static_cast<unsigned long long>(s.tokens()),
      static_cast<unsigned long long>(s.next_token_position()),
      static_cast<unsigned long long>(s.sealed_blocks()), s.open_block_frames(),
      s.payload_bytes() / 1048576.0, s.summary_bytes() / 1024.0,
      s.token_code_bytes() / 1024.0, s.index().bytes() / 1024.0,
      s.signal_bytes() / 1024.0,
      static_cast<unsigned long long>(s.track_histories()),
      static_cast<unsigned long long>(s.recalls()),
      static_cast<unsigned long long>(s.recalled_blocks()),
      static_cast<unsigned long long>(s.recalled_tokens()));
  const v1::IngestCpu& c = s.ingest_cpu();
  const double ms = 1e-6;
  const double total =
      ms * (c.validate_ns() + c.summarize_ns() + c.token_groups_ns() +
            c.warm_copy_ns() + c.seal_rest_ns() + c.encode_ns() +
            c.commit_ns() + c.install_ns());
  std::printf(
      "  ingest CPU      %.1f ms in this server: token groups %.1f, warm copy "
      "%.1f, commit %.1f, the other stages %.1f\n",
      total, ms * c.token_groups_ns(), ms * c.warm_copy_ns(),
      ms * c.commit_ns(),
      total - ms * (c.token_groups_ns() + c.warm_copy_ns() + c.commit_ns()));
  const std::pair<const char*, const v1::TierStats*> tiers[] = {
      {"warm (RAM)", &s.warm()},
      {"cold (disk, full precision)", &s.cold()},
      {"degraded (disk, int8)", &s.degraded()},
      {"evicted", &s.evicted()}};
  // Bars: each tier's share of the sealed blocks.
  const double sealed = std::max<double>(1.0, s.sealed_blocks());
  for (const auto& [name, t] : tiers) {
    std::printf("  %-28s %6llu blocks, %9.2f MiB  %s\n", name,
                static_cast<unsigned long long>(t->blocks()),
                t->bytes() / 1048576.0, Bar(t->blocks() / sealed, 30).c_str());
  }
  const v1::PolicyStats& p = s.policy();
  std::printf(
      "  policy          %s: %llu demoted, %llu degraded, %llu evicted, %llu "
      "promoted (%llu declined); %llu staged, %llu stage hits; %llu rebuilds; "
      "recall p50 %u "
      "us, p99 %u us\n",
      v1::ReplacementPolicy_Name(s.config().tier_policy().replacement())
          .c_str(),
      static_cast<unsigned long long>(p.demotions()),
      static_cast<unsigned long long>(p.degradations()),
      static_cast<unsigned long long>(p.evictions()),
      static_cast<unsigned long long>(p.promotions()),
      static_cast<unsigned long long>(p.promotions_declined()),
      static_cast<unsigned long long>(p.staged()),
      static_cast<unsigned long long>(p.stage_hits()),
      static_cast<unsigned long long>(p.rebuilds()), p.recall_us_p50(),
      p.recall_us_p99());
  const v1::AcceleratorStats& a = s.accelerator();
  std::printf("  accelerator     %s: %llu searches, %.0f us on the host",
              a.backend().c_str(),
              static_cast<unsigned long long>(a.searches()), a.measured_us());
  if (a.backend() == "sim") {
    std::printf(
        "; modelled %.1f us (%.1f queued), %.2f MiB DRAM, %.1f uJ, %llu "
        "injections; SRAM %llu KiB hot window / %llu KiB staging, %llu "
        "re-partitions; recall floor %.2f",
        a.modelled_us(), a.modelled_queue_us(),
        a.modelled_dram_bytes() / 1048576.0, a.modelled_energy_uj(),
        static_cast<unsigned long long>(a.injections()),
        static_cast<unsigned long long>(a.sram_hot_bytes() / 1024),
        static_cast<unsigned long long>(a.sram_staging_bytes() / 1024),
        static_cast<unsigned long long>(a.sram_repartitions()),
        a.recall_floor());
  }
  std::printf("\n");
  if (!a.warning().empty()) std::printf("  WARNING: %s\n", a.warning().c_str());
}

void PrintBlock(const v1::RecalledBlock& b) {
  // With token groups, only some of the block's tokens were chosen.
  const std::string tokens = b.token_offsets().empty()
                                 ? absl::StrCat(b.token_count(), " tokens")
                                 : absl::StrCat(b.token_offsets_size(), " of ",
                                                b.token_count(), " tokens");
  std::printf(
      "  block %6llu  frames %llu-%llu  positions [%llu, %llu)  %s  "
      "score %.4f  priority %.4f  gate %.3f  %s%s%s\n",
      static_cast<unsigned long long>(b.block_id()),
      static_cast<unsigned long long>(b.first_frame()),
      static_cast<unsigned long long>(b.last_frame()),
      static_cast<unsigned long long>(b.first_token_position()),
      static_cast<unsigned long long>(b.end_token_position()), tokens.c_str(),
      b.score(), b.priority(), b.gate_weight(), v1::Tier_Name(b.tier()).c_str(),
      b.degraded() ? " degraded" : "", b.was_staged() ? " staged" : "");
}

}  // namespace

int RunStats(const std::vector<std::string>&) {
  auto client = KvmemClient::Connect(AddrOrDefault(), CliClientOptions());
  const std::string id = absl::GetFlag(FLAGS_stream);
  v1::ListStreamsResponse list;
  grpc::Status s;
  if (id.empty()) {
    s = client->ListStreams(&list);
  } else {
    s = client->GetStreamStats(id, list.add_streams());
  }
  if (!s.ok()) return ReportError("stats", s);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ToJson(list).c_str());
    return 0;
  }
  if (list.streams_size() == 0 && list.quarantined_size() == 0) {
    std::printf("no streams\n");
  }
  for (const auto& st : list.streams()) PrintStatsHuman(st);
  for (const auto& q : list.quarantined()) {
    std::printf("stream %s: QUARANTINED (%s) %s\n", q.stream_id().c_str(),
                q.code().c_str(), q.reason().c_str());
  }
  return 0;
}

int RunHealth(const std::vector<std::string>&) {
  auto client = KvmemClient::Connect(AddrOrDefault(), CliClientOptions());
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = client->CheckHealth("kvmem.v1.KvMemory", &resp);
  if (!s.ok()) return ReportError("health", s);
  const std::string status =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  if (absl::GetFlag(FLAGS_json)) {
    JsonWriter w;
    w.Object();
    w.Key("service").Str("kvmem.v1.KvMemory");
    w.Key("status").Str(status);
    w.EndObject();
    std::printf("%s", w.Take().c_str());
  } else {
    std::printf("kvmem.v1.KvMemory: %s\n", status.c_str());
  }
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0
                                                                         : 1;
}

int RunRecall(const std::vector<std::string>&) {
  const std::string id = absl::GetFlag(FLAGS_stream);
  if (id.empty()) {
    std::fprintf(stderr, "kvmem recall: --stream=ID is required\n");
    return 2;
  }
  auto client = KvmemClient::Connect(AddrOrDefault(), CliClientOptions());
  v1::RecallRequest req;
  req.set_stream_id(id);
  req.mutable_budget()->set_top_k(absl::GetFlag(FLAGS_top_k));
  req.mutable_budget()->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  req.set_per_layer(absl::GetFlag(FLAGS_per_layer));
  req.set_priority(absl::GetFlag(FLAGS_priority));
  const int64_t seed = absl::GetFlag(FLAGS_query_seed);
  if (seed >= 0) {
    v1::StreamStats stats;
    grpc::Status s = client->GetStreamStats(id, &stats);
    if (!s.ok()) return ReportError("recall", s);
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (uint32_t i = 0; i < stats.summary_dim(); ++i) req.add_query(n(rng));
  } else {
    for (absl::string_view part :
         absl::StrSplit(absl::GetFlag(FLAGS_query), ',', absl::SkipEmpty())) {
      float v;
      if (!absl::SimpleAtof(part, &v)) {
        std::fprintf(stderr,
                     "kvmem recall: --query value \"%s\" is not a "
                     "number\n",
                     std::string(part).c_str());
        return 2;
      }
      req.add_query(v);
    }
  }
  v1::RecallResponse resp;
  grpc::Status s = client->Recall(req, &resp);
  if (!s.ok()) return ReportError("recall", s);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ToJson(resp).c_str());
    return 0;
  }
  std::printf(
      "recall on %s: %s, budget %u tokens, top_k %u, %u candidates outside "
      "the hot window, %u us in the engine\n",
      id.c_str(),
      resp.layer_sets_size() > 0
          ? absl::StrCat(resp.layer_sets_size(), " layer sets").c_str()
          : absl::StrCat(resp.blocks_size(), " blocks, ", resp.total_tokens(),
                         " tokens")
                .c_str(),
      resp.budget_tokens(), resp.top_k(), resp.candidates(),
      resp.timing().total_us());
  if (const v1::RecallTiming& t = resp.timing(); t.modelled_us() > 0) {
    std::printf(
        "modelled on the sim accelerator: %.2f us (%.2f us queued), %.1f KiB "
        "DRAM, %.2f uJ, %u injections\n",
        t.modelled_us(), t.modelled_queue_us(),
        t.modelled_dram_bytes() / 1024.0, t.modelled_energy_uj(),
        t.injections());
  }
  for (const auto& b : resp.blocks()) PrintBlock(b);
  for (const auto& set : resp.layer_sets()) {
    std::printf(" layer %u: %d blocks, %u tokens\n", set.layer(),
                set.blocks_size(), set.total_tokens());
    for (const auto& b : set.blocks()) PrintBlock(b);
  }
  return 0;
}

}  // namespace kvmem
