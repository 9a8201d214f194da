#include "server/ops/metric_series.h"

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "server/service/shm_arenas.h"
#include "storage/read_cache_store.h"

namespace kvmem::metric_series {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

struct Series {
  const char* name;
  const char* help;
  MetricType type;
  double value;
};

// One unlabelled family per series.
void AddAll(std::initializer_list<Series> series,
            std::vector<MetricFamily>* out) {
  for (const Series& x : series) {
    MetricFamily f = Family(x.name, x.help, x.type);
    AddValue(&f, {}, x.value);
    out->push_back(std::move(f));
  }
}

double Read(const std::atomic<uint64_t>& v) {
  return static_cast<double>(v.load(std::memory_order_relaxed));
}

}  // namespace

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddValue(MetricFamily* f,
              std::vector<prometheus::ClientMetric::Label> labels, double v) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  f->metric.push_back(std::move(m));
}

void AddShmSeries(const ShmStats& s, std::vector<MetricFamily>* out) {
  AddAll(
      {
          {"kvmem_shm_arenas",
           "Shared-memory arenas attached (or awaiting their hand-off).",
           MetricType::Gauge, double(s.arenas)},
          {"kvmem_shm_arena_bytes", "Their sizes summed.", MetricType::Gauge,
           double(s.arena_bytes)},
          {"kvmem_shm_leases", "Live leases (delivered, not released).",
           MetricType::Gauge, double(s.leases)},
          {"kvmem_shm_leased_bytes", "Bytes under live leases.",
           MetricType::Gauge, double(s.leased_bytes)},
          {"kvmem_shm_reclaimed_leases_total",
           "Leases held past --shm_lease_ms and taken back for room.",
           MetricType::Counter, double(s.reclaimed_leases)},
          {"kvmem_shm_dead_clients_total",
           "Arenas freed because their client's hand-off connection closed "
           "without a goodbye.",
           MetricType::Counter, double(s.dead_clients)},
      },
      out);
}

void AddStoreCacheSeries(const ReadCacheCounters& c,
                         std::vector<MetricFamily>* out) {
  constexpr MetricType kCounter = MetricType::Counter;
  AddAll(
      {
          {"kvmem_store_cache_hits_total",
           "Payloads (frames, layer records) the local read cache answered.",
           kCounter, Read(c.hits)},
          {"kvmem_store_cache_misses_total",
           "Payloads read from the shared store through the cache.", kCounter,
           Read(c.misses)},
          {"kvmem_store_cache_hit_bytes_total", "Bytes the cache answered.",
           kCounter, Read(c.hit_bytes)},
          {"kvmem_store_cache_inserted_bytes_total", "Bytes put in the cache.",
           kCounter, Read(c.inserted_bytes)},
          {"kvmem_store_cache_insert_errors_total",
           "Inserts that failed (a full disk; the read still answered).",
           kCounter, Read(c.insert_errors)},
          {"kvmem_store_cache_inner_errors_total",
           "Cache misses the shared store failed (unreachable, ...).", kCounter,
           Read(c.inner_errors)},
      },
      out);
}

}  // namespace kvmem::metric_series
