// The ingest phase's CPU by stage of the append path (StreamStats.ingest_cpu,
// summed over the streams) beside the server's whole CPU over the phase:
// issue 28's "a figure per stage" (MB/s and share of ingest CPU).
#ifndef KVMEM_TOOLS_BENCH_BENCH_STAGES_H_
#define KVMEM_TOOLS_BENCH_BENCH_STAGES_H_

#include <array>
#include <string>

#include "engine/types.h"
#include "kvmem/v1/types.pb.h"
#include "tools/common/json_writer.h"

namespace kvmem {

struct IngestStages {
  static constexpr int kStages = kIngestStages;
  // CPU seconds of each stage, in IngestCpu's field order.
  std::array<double, kStages> cpu_s{};
  double server_cpu_s = 0;  // The server process over the phase.
  double mb = 0;            // Payload appended in the phase (MB).
  bool measured = false;    // Stats came back from every stream.
};

// Adds one stream's stage times.
void AddIngestCpu(const v1::IngestCpu& c, IngestStages* out);
// "ingest_stages": {"validate": {"cpu_s", "mb_per_s", "share"}, ...,
// "other": {...}} where share is of the server's CPU over the phase and
// "other" is the server's CPU outside the stages (gRPC and protobuf,
// RocksDB's background flushes, the rest).
void WriteIngestStagesJson(const IngestStages& s, JsonWriter* w);
// One line per stage for the human summary.
std::string IngestStagesText(const IngestStages& s);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_BENCH_BENCH_STAGES_H_
