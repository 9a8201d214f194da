#include "server/ops/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/ops/metric_series.h"
#include "server/service/shm_arenas.h"

namespace kvmem {
namespace {

using metric_series::AddShmSeries;
using metric_series::AddStoreCacheSeries;
using metric_series::AddValue;
using metric_series::Family;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Per-stream counters: each becomes kvmem_stream_<name>_total{stream} and
// the global kvmem_<name>_total.
struct CounterDef {
  const char* name;
  const char* help;
  double (*get)(const StreamStats&);
};

constexpr CounterDef kCounters[kStreamCounterCount] = {
    {"frames", "Frames appended.",
     [](const StreamStats& s) { return double(s.frames); }},
    {"appended_bytes", "KV payload bytes appended (full precision).",
     [](const StreamStats& s) { return double(s.payload_bytes); }},
    {"recalls", "Recalls served.",
     [](const StreamStats& s) { return double(s.recalls); }},
    {"recalled_blocks", "Blocks returned by recalls.",
     [](const StreamStats& s) { return double(s.recalled_blocks); }},
    {"recalled_tokens", "Tokens returned by recalls.",
     [](const StreamStats& s) { return double(s.recalled_tokens); }},
    {"stage_hits", "Prefetch-staged blocks a recall then chose.",
     [](const StreamStats& s) { return double(s.policy.stage_hits); }},
    {"stage_misses", "Staged blocks dropped unused.",
     [](const StreamStats& s) { return double(s.policy.stage_misses); }},
    {"demotions", "Blocks demoted warm -> cold.",
     [](const StreamStats& s) { return double(s.policy.demotions); }},
    {"degradations", "Blocks degraded cold -> degraded (int8).",
     [](const StreamStats& s) { return double(s.policy.degradations); }},
    {"promotions", "Blocks promoted back to warm after a recall.",
     [](const StreamStats& s) { return double(s.policy.promotions); }},
    {"promotions_declined",
     "Recalled blocks out of RAM not promoted (not recalled again within the "
     "half-life, or not hotter than the warm block they would displace).",
     [](const StreamStats& s) { return double(s.policy.promotions_declined); }},
    {"evictions", "Blocks evicted (payload dropped, summary kept).",
     [](const StreamStats& s) { return double(s.policy.evictions); }},
    {"index_rebuilds", "Index rebuilds swapped in.",
     [](const StreamStats& s) { return double(s.policy.rebuilds); }},
    {"shot_cuts", "Blocks sealed early because the scene changed.",
     [](const StreamStats& s) { return double(s.policy.shot_cuts); }},
    {"accel_searches", "Index searches run by the retrieval backend.",
     [](const StreamStats& s) { return double(s.accel.cost.searches); }},
    {"accel_measured_seconds", "Host time in retrieval-backend calls.",
     [](const StreamStats& s) { return s.accel.cost.measured_us * 1e-6; }},
    {"accel_modelled_seconds",
     "Modelled accelerator time (sim backend; 0 on cpu).",
     [](const StreamStats& s) { return s.accel.cost.modelled_us * 1e-6; }},
    {"accel_modelled_dram_bytes",
     "Modelled accelerator DRAM traffic (sim backend; 0 on cpu).",
     [](const StreamStats& s) { return double(s.accel.cost.dram_bytes); }},
};

struct Tier {
  const char* name;
  const TierCount StreamStats::*count;
};
constexpr Tier kTiers[] = {{"warm", &StreamStats::warm},
                           {"cold", &StreamStats::cold},
                           {"degraded", &StreamStats::degraded},
                           {"evicted", &StreamStats::evicted}};
constexpr int kTierCount = 4;

// One label set's figures: counters plus blocks and bytes per tier.
struct Sample {
  StreamCounters counters{};
  std::array<double, kTierCount> blocks{}, bytes{};
  // Counters less `base` (their values when this process started).
  void Add(const StreamStats& s, const StreamCounters* base) {
    for (int i = 0; i < kStreamCounterCount; ++i) {
      counters[i] += std::max(
          0.0, kCounters[i].get(s) - (base != nullptr ? (*base)[i] : 0.0));
    }
    for (int t = 0; t < kTierCount; ++t) {
      blocks[t] += double((s.*kTiers[t].count).blocks);
      bytes[t] += double((s.*kTiers[t].count).bytes);
    }
  }
};

StreamCounters CountersOf(const StreamStats& s) {
  StreamCounters c{};
  for (int i = 0; i < kStreamCounterCount; ++i) c[i] = kCounters[i].get(s);
  return c;
}

}  // namespace

// Reads the engine at scrape time. Counters count from this process's
// start (streams recovered at start are baselined), so a restart is an
// ordinary counter reset. A stream keeps its label from its first scrape
// until it is deleted; streams beyond the cap share "~other" (not a valid
// stream id). No counter series goes down between scrapes, even when a
// stream in "~other" is deleted or a scrape races a deletion.
class MetricsCollector final : public prometheus::Collectable {
 public:
  MetricsCollector(const MemoryEngine* engine, uint32_t max_streams,
                   std::shared_ptr<prometheus::Registry> calls)
      : engine_(engine), cap_(max_streams), calls_(std::move(calls)) {
    for (const StreamStats& s : engine_->ListStreams()) {
      baseline_[s.stream_id] = CountersOf(s);
    }
  }

  // A deleted stream: its work stays in the global counters, its label
  // and series go.
  void Retire(const StreamStats& s) ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    Sample gone;
    auto b = baseline_.find(s.stream_id);
    gone.Add(s, b == baseline_.end() ? nullptr : &b->second);
    for (int i = 0; i < kStreamCounterCount; ++i) {
      retired_[i] += gone.counters[i];
    }
    if (b != baseline_.end()) baseline_.erase(b);
    if (labelled_.erase(s.stream_id) > 0) {
      for (int i = 0; i < kStreamCounterCount; ++i) {
        last_.erase(SeriesKey(i, s.stream_id));
      }
    }
  }

  void WatchSharedMemory(const ShmArenas* shm) ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    shm_ = shm;
  }

  std::vector<MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<MetricFamily> out = CollectStreams();
    kvmem::MutexLock lock(&mu_);
    if (shm_ != nullptr) AddShmSeries(shm_->Stats(), &out);
    if (cache_ != nullptr) AddStoreCacheSeries(*cache_, &out);
    return out;
  }

  void WatchStoreCache(const ReadCacheCounters* c) ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    cache_ = c;
  }

 private:
  std::vector<MetricFamily> CollectStreams() const ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<StreamStats> streams = engine_->ListStreams();
    std::sort(streams.begin(), streams.end(),
              [](const StreamStats& a, const StreamStats& b) {
                return a.stream_id < b.stream_id;
              });
    std::vector<std::pair<std::string, Sample>> labelled;
    Sample other, global;
    bool any_other = false;
    double open = 0, closed = 0;
    kvmem::MutexLock lock(&mu_);
    for (const StreamStats& s : streams) {
      (s.closed ? closed : open) += 1;
      auto b = baseline_.find(s.stream_id);
      const StreamCounters* base = b == baseline_.end() ? nullptr : &b->second;
      global.Add(s, base);
      if (labelled_.count(s.stream_id) > 0 ||
          (labelled_.size() < cap_ && labelled_.insert(s.stream_id).second)) {
        labelled.emplace_back(s.stream_id, Sample());
        labelled.back().second.Add(s, base);
      } else {
        other.Add(s, base);
        any_other = true;
      }
    }
    if (any_other || last_.count(SeriesKey(0, kOther)) > 0) {
      labelled.emplace_back(kOther, other);
    }
    for (int i = 0; i < kStreamCounterCount; ++i) {
      global.counters[i] += retired_[i];
    }

    std::vector<MetricFamily> out = calls_->Collect();
    MetricFamily count =
        Family("kvmem_streams", "Streams held, by state.", MetricType::Gauge);
    AddValue(&count, {{"state", "open"}}, open);
    AddValue(&count, {{"state", "closed"}}, closed);
    AddValue(&count, {{"state", "quarantined"}},
             static_cast<double>(engine_->Quarantined().size()));
    out.push_back(std::move(count));
    for (int i = 0; i < kStreamCounterCount; ++i) {
      const std::string n = kCounters[i].name;
      MetricFamily per = Family("kvmem_stream_" + n + "_total",
                                kCounters[i].help, MetricType::Counter);
      for (const auto& [id, sample] : labelled) {
        AddValue(&per, {{"stream", id}}, Monotone(i, id, sample.counters[i]));
      }
      MetricFamily all = Family(
          "kvmem_" + n + "_total",
          std::string(kCounters[i].help) +
              " All streams, deleted included, since the server started.",
          MetricType::Counter);
      AddValue(&all, {}, Monotone(i, "", global.counters[i]));
      out.push_back(std::move(per));
      out.push_back(std::move(all));
    }
    const char* kBlocksHelp = "Sealed blocks by tier.";
    const char* kBytesHelp =
        "Bytes by tier (RAM for warm, disk payload bytes otherwise).";
    MetricFamily sb =
        Family("kvmem_stream_blocks", kBlocksHelp, MetricType::Gauge);
    MetricFamily sy =
        Family("kvmem_stream_bytes", kBytesHelp, MetricType::Gauge);
    MetricFamily gb = Family("kvmem_blocks", kBlocksHelp, MetricType::Gauge);
    MetricFamily gy = Family("kvmem_bytes", kBytesHelp, MetricType::Gauge);
    for (int t = 0; t < kTierCount; ++t) {
      for (const auto& [id, sample] : labelled) {
        AddValue(&sb, {{"stream", id}, {"tier", kTiers[t].name}},
                 sample.blocks[t]);
        AddValue(&sy, {{"stream", id}, {"tier", kTiers[t].name}},
                 sample.bytes[t]);
      }
      AddValue(&gb, {{"tier", kTiers[t].name}}, global.blocks[t]);
      AddValue(&gy, {{"tier", kTiers[t].name}}, global.bytes[t]);
    }
    for (MetricFamily* f : {&sb, &sy, &gb, &gy}) out.push_back(std::move(*f));
    out.push_back(MetadataBytes(streams));
    return out;
  }

 private:
  static constexpr const char* kOther = "~other";

  // What no RAM flag bounds: it grows with the blocks streams keep.
  static MetricFamily MetadataBytes(const std::vector<StreamStats>& streams) {
    double summaries = 0, codes = 0, indexes = 0, signals = 0;
    for (const StreamStats& s : streams) {
      summaries += static_cast<double>(s.summary_bytes);
      codes += static_cast<double>(s.token_code_bytes);
      indexes += static_cast<double>(s.index_bytes);
      signals += static_cast<double>(s.signal_bytes);
    }
    MetricFamily meta = Family(
        "kvmem_metadata_bytes",
        "RAM the streams' sealed blocks hold for recall, by kind: summaries "
        "(and token groups), token codes, index rows, signals (scene means, "
        "track presences). Freed by eviction.",
        MetricType::Gauge);
    AddValue(&meta, {{"kind", "summaries"}}, summaries);
    AddValue(&meta, {{"kind", "token_codes"}}, codes);
    AddValue(&meta, {{"kind", "indexes"}}, indexes);
    AddValue(&meta, {{"kind", "signals"}}, signals);
    return meta;
  }

  static std::string SeriesKey(int counter, const std::string& label) {
    return std::to_string(counter) + "/" + label;
  }
  // v, or the last value this series reported when that was larger.
  double Monotone(int counter, const std::string& label, double v) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    double& last = last_[SeriesKey(counter, label)];
    last = std::max(last, v);
    return last;
  }

  const MemoryEngine* const engine_;
  const ShmArenas* shm_ ABSL_GUARDED_BY(mu_) = nullptr;
  const ReadCacheCounters* cache_ ABSL_GUARDED_BY(mu_) = nullptr;
  const size_t cap_;
  const std::shared_ptr<prometheus::Registry> calls_;
  mutable kvmem::Mutex mu_;
  mutable std::set<std::string> labelled_ ABSL_GUARDED_BY(mu_);
  mutable std::map<std::string, double> last_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, StreamCounters> baseline_ ABSL_GUARDED_BY(mu_);
  StreamCounters retired_ ABSL_GUARDED_BY(mu_){};
};

namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3,
      20e-3, 50e-3,  0.1,    0.25,   0.5,  1.0,  2.5,  10.0};
  return *b;
}

// Methods beyond this many share the label "other" (a client can call
// unknown method names).
constexpr size_t kMaxMethods = 64;

// "/kvmem.v1.KvMemory/Recall" -> "Recall"; other services keep their name
// ("grpc.health.v1.Health/Check").
std::string MethodLabel(absl::string_view full) {
  absl::ConsumePrefix(&full, "/");
  absl::ConsumePrefix(&full, "kvmem.v1.KvMemory/");
  return std::string(full);
}

class CallInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallInterceptor(ServerMetrics* metrics, const char* method)
      : metrics_(metrics),
        method_(method == nullptr ? "" : method),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* b) override {
    using grpc::experimental::InterceptionHookPoints;
    if (b->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) &&
        !metrics_->options().instance_name.empty()) {
      b->GetSendInitialMetadata()->emplace("kvmem-instance",
                                           metrics_->options().instance_name);
    }
    if (b->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->OnCallDone(method_, b->GetSendStatus().error_code(),
                           std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - start_)
                               .count());
    }
    b->Proceed();
  }

 private:
  ServerMetrics* const metrics_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
};

class InterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InterceptorFactory(ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallInterceptor(metrics_, info->method());
  }

 private:
  ServerMetrics* const metrics_;
};

}  // namespace

struct ServerMetrics::MethodSeries {
  prometheus::Counter* requests;
  prometheus::Histogram* latency;
  std::string label;
};

ServerMetrics::ServerMetrics(const MemoryEngine* engine, const Options& options)
    : options_(options), registry_(std::make_shared<prometheus::Registry>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("kvmem_rpc_requests_total")
                   .Help("Calls finished, by method.")
                   .Register(*registry_);
  errors_ = &prometheus::BuildCounter()
                 .Name("kvmem_rpc_errors_total")
                 .Help(
                     "Calls finished with a status other than OK, by "
                     "method and gRPC code.")
                 .Register(*registry_);
  rpc_latency_ =
      &prometheus::BuildHistogram()
           .Name("kvmem_rpc_latency_seconds")
           .Help(
               "Call duration from arrival to status, by method (streaming "
               "calls: their whole life).")
           .Register(*registry_);
  auto& recall = prometheus::BuildHistogram()
                     .Name("kvmem_recall_latency_seconds")
                     .Help(
                         "Recall time in the service (lookup, scoring, "
                         "planning), by the RPC that asked.")
                     .Register(*registry_);
  recall_latency_ = &recall.Add({{"method", "Recall"}}, LatencyBuckets());
  session_recall_latency_ =
      &recall.Add({{"method", "Session"}}, LatencyBuckets());
  tokens_scored_ = &prometheus::BuildCounter()
                        .Name("kvmem_recall_tokens_scored_total")
                        .Help(
                            "Tokens recalls scored one by one from their "
                            "token codes (scorer mass).")
                        .Register(*registry_)
                        .Add({});
  token_scan_seconds_ = &prometheus::BuildCounter()
                             .Name("kvmem_recall_token_scan_seconds_total")
                             .Help(
                                 "Time recalls spent scoring tokens from "
                                 "their codes.")
                             .Register(*registry_)
                             .Add({});
  collector_ = std::make_shared<MetricsCollector>(engine, options.max_streams,
                                                  registry_);
}

ServerMetrics::~ServerMetrics() = default;

ServerMetrics::MethodSeries* ServerMetrics::Method(const std::string& method) {
  kvmem::MutexLock lock(&mu_);
  auto it = methods_.find(method);
  if (it != methods_.end()) return it->second.get();
  // Past the cap every new name shares one series (key "" is never a
  // method: gRPC's names start with '/').
  const bool capped = methods_.size() >= kMaxMethods;
  const std::string key = capped ? "" : method;
  if (capped && (it = methods_.find(key)) != methods_.end()) {
    return it->second.get();
  }
  auto series = std::make_unique<MethodSeries>();
  series->label = capped ? "other" : MethodLabel(method);
  series->requests = &requests_->Add({{"method", series->label}});
  series->latency =
      &rpc_latency_->Add({{"method", series->label}}, LatencyBuckets());
  return methods_.emplace(key, std::move(series)).first->second.get();
}

void ServerMetrics::OnCallDone(const std::string& method, grpc::StatusCode code,
                               double seconds) {
  MethodSeries* m = Method(method);
  m->requests->Increment();
  m->latency->Observe(seconds);
  if (code != grpc::StatusCode::OK) {
    errors_
        ->Add({{"method", m->label},
               {"code",
                absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}})
        .Increment();
  }
}

void ServerMetrics::ObserveRecall(bool session, double seconds) {
  (session ? session_recall_latency_ : recall_latency_)->Observe(seconds);
}

void ServerMetrics::ObserveTokenScan(uint64_t tokens, double seconds) {
  if (tokens == 0) return;
  tokens_scored_->Increment(static_cast<double>(tokens));
  token_scan_seconds_->Increment(seconds);
}

void ServerMetrics::RetireStream(const StreamStats& stats) {
  collector_->Retire(stats);
}

void ServerMetrics::WatchStoreCache(const ReadCacheCounters* counters) {
  collector_->WatchStoreCache(counters);
}

void ServerMetrics::WatchSharedMemory(const ShmArenas* shm) {
  collector_->WatchSharedMemory(shm);
}

std::shared_ptr<prometheus::Collectable> ServerMetrics::collectable() const {
  return collector_;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ServerMetrics::NewInterceptorFactory() {
  return std::make_unique<InterceptorFactory>(this);
}

}  // namespace kvmem
