// Recorded traces (proto/kvmem/v1/trace.proto, docs/traces.md) as the
// evaluation's workload: one stream's frames and queries, as a model's
// attention appended and asked them. The reader loads and checks the whole
// trace at open (every size against the header; an error names the frame
// and the field); the writer records one camera of any workload source
// (`kvmem eval --write_trace`), labels included.
#ifndef KVMEM_TOOLS_EVAL_TRACE_WORKLOAD_H_
#define KVMEM_TOOLS_EVAL_TRACE_WORKLOAD_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tools/eval/workload_source.h"

namespace kvmem {

inline constexpr char kTraceFormat[] = "kvmem-trace";
inline constexpr uint32_t kTraceVersion = 1;

// The trace in `dir` as a workload of one camera. Its options() hold the
// header's geometry, frames, fps, sink tokens and query shape; the knobs
// of the synthetic video keep values that pass its checks and mean nothing.
absl::StatusOr<std::unique_ptr<WorkloadSource>> OpenTraceWorkload(
    const std::string& dir);

// Writes camera `camera` of `source` as a trace in `dir` (created; files in
// it replaced), with its labels (track ids, probes) and `labels` in the
// header.
absl::Status WriteTrace(const WorkloadSource& source, uint32_t camera,
                        const std::string& dir,
                        const std::map<std::string, std::string>& labels);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_TRACE_WORKLOAD_H_
