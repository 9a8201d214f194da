#include "tools/bench/bench_stages.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "tools/bench/bench_util.h"

namespace kvmem {
namespace {

double Outside(const IngestStages& s) {
  double in = 0;
  for (double v : s.cpu_s) in += v;
  return std::max(0.0, s.server_cpu_s - in);
}

}  // namespace

void AddIngestCpu(const v1::IngestCpu& c, IngestStages* out) {
  const uint64_t ns[IngestStages::kStages] = {
      c.validate_ns(),  c.summarize_ns(), c.token_groups_ns(), c.warm_copy_ns(),
      c.seal_rest_ns(), c.encode_ns(),    c.commit_ns(),       c.install_ns()};
  for (int i = 0; i < IngestStages::kStages; ++i) out->cpu_s[i] += ns[i] / 1e9;
}

void WriteIngestStagesJson(const IngestStages& s, JsonWriter* w) {
  w->Key("ingest_stages").Object();
  auto stage = [&](const char* name, double cpu) {
    w->Key(name).Object();
    w->Key("cpu_s").Num(cpu, 3);
    w->Key("mb_per_s").Num(Ratio(s.mb, cpu), 1);
    w->Key("share").Num(Ratio(cpu, s.server_cpu_s), 3);
    w->EndObject();
  };
  for (int i = 0; i < IngestStages::kStages; ++i)
    stage(kIngestStageNames[i], s.cpu_s[i]);
  stage("other", Outside(s));
  w->EndObject();
}

std::string IngestStagesText(const IngestStages& s) {
  std::string out = absl::StrFormat(
      "  ingest by stage     server CPU %.2f s for %.0f MB (the append "
      "path's own CPU per stage; MB/s of one core, share of the server's "
      "CPU)\n",
      s.server_cpu_s, s.mb);
  auto line = [&](const char* name, double cpu) {
    out +=
        absl::StrFormat("    %-14s %7.3f s  %9.1f MB/s  %5.1f %%\n", name, cpu,
                        Ratio(s.mb, cpu), 100 * Ratio(cpu, s.server_cpu_s));
  };
  for (int i = 0; i < IngestStages::kStages; ++i)
    line(kIngestStageNames[i], s.cpu_s[i]);
  line("other", Outside(s));
  return out;
}

}  // namespace kvmem
