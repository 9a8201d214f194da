// ServerMetrics: what kvmem-server exposes to Prometheus on
// --metrics_listen (/metrics, text format). Two sources:
//  - per-call figures recorded as calls happen: RPCs and errors by method
//    and code, RPC latency, recall latency (Recall and Session recalls);
//  - per-stream figures read from the engine at scrape time: tier blocks and
//    bytes, frames, recalls, recalled tokens, stage hits, demotions,
//    promotions, evictions, index rebuilds, modelled accelerator cost.
// Counters count from the server's start. Label cardinality is bounded: the
// first max_streams streams seen get their own `stream` label (until
// deleted), the rest are summed into stream="~other". Global counters are
// sums over all streams plus those deleted since start; no counter series
// goes down between scrapes.
//
// Thread safety: every method may be called from any thread.
#ifndef KVMEM_SERVER_OPS_METRICS_H_
#define KVMEM_SERVER_OPS_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "base/sync.h"
#include "engine/memory_engine.h"

namespace prometheus {
class Collectable;
class Registry;
class Counter;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace kvmem {

class ShmArenas;           // server/service/shm_arenas.h
struct ReadCacheCounters;  // storage/read_cache_store.h

// The per-stream counters the scrape reads (index into StreamCounters).
inline constexpr int kStreamCounterCount = 18;
using StreamCounters = std::array<double, kStreamCounterCount>;

class MetricsCollector;

class ServerMetrics {
 public:
  struct Options {
    uint32_t max_streams = 32;  // Streams with a label of their own.
    std::string instance_name;  // Sent as response metadata kvmem-instance.
  };
  ServerMetrics(const MemoryEngine* engine, const Options& options);
  ~ServerMetrics();

  // One finished call: method is gRPC's "/package.Service/Method".
  void OnCallDone(const std::string& method, grpc::StatusCode code,
                  double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // One recall (method "Recall" or "Session"), successful or not.
  void ObserveRecall(bool session, double seconds);
  // A recall's token-resolution stage: tokens scored from their codes and
  // the time that took (kvmem_recall_tokens_scored_total,
  // kvmem_recall_token_scan_seconds_total: their rates' ratio is the scan
  // rate in tokens per second).
  void ObserveTokenScan(uint64_t tokens, double seconds);
  // Keeps a stream's counters in the global totals; call with its last
  // stats when it is deleted.
  void RetireStream(const StreamStats& stats);
  // Shared-memory arenas and leases (kvmem_shm_*), read at scrape time.
  // REQUIRES: shm outlives the metrics endpoint; set before serving.
  void WatchSharedMemory(const ShmArenas* shm);
  // The local read cache's counters (kvmem_store_cache_*), read at scrape
  // time. REQUIRES: they outlive the metrics endpoint.
  void WatchStoreCache(const ReadCacheCounters* counters);

  // What Exposer::RegisterCollectable takes.
  std::shared_ptr<prometheus::Collectable> collectable() const;
  // The interceptor that counts calls and tags responses with
  // kvmem-instance; pass to ServerBuilder::experimental().
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

  const Options& options() const { return options_; }

 private:
  struct MethodSeries;
  MethodSeries* Method(const std::string& method) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Family<prometheus::Histogram>* rpc_latency_;
  prometheus::Histogram* recall_latency_;
  prometheus::Histogram* session_recall_latency_;
  prometheus::Counter* tokens_scored_;
  prometheus::Counter* token_scan_seconds_;
  std::shared_ptr<MetricsCollector> collector_;

  mutable kvmem::Mutex mu_;
  std::map<std::string, std::unique_ptr<MethodSeries>> methods_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_OPS_METRICS_H_
