// Prometheus metric families built by hand for ServerMetrics' scrape-time
// collector (server/ops/metrics.cc): the family and value helpers, and the
// unlabelled series of the shared-memory arenas (kvmem_shm_*) and of the
// local read cache in front of a shared store (kvmem_store_cache_*).
#ifndef KVMEM_SERVER_OPS_METRIC_SERIES_H_
#define KVMEM_SERVER_OPS_METRIC_SERIES_H_

#include <prometheus/metric_family.h>

#include <string>
#include <vector>

namespace kvmem {

struct ShmStats;           // server/service/shm_arenas.h
struct ReadCacheCounters;  // storage/read_cache_store.h

namespace metric_series {

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type);
// One value (a counter's or a gauge's, by the family's type).
void AddValue(prometheus::MetricFamily* f,
              std::vector<prometheus::ClientMetric::Label> labels, double v);

void AddShmSeries(const ShmStats& s,
                  std::vector<prometheus::MetricFamily>* out);
void AddStoreCacheSeries(const ReadCacheCounters& c,
                         std::vector<prometheus::MetricFamily>* out);

}  // namespace metric_series
}  // namespace kvmem

#endif  // KVMEM_SERVER_OPS_METRIC_SERIES_H_
