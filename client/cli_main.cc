// kvmem: command-line client of kvmem-server.
//   kvmem demo    run a synthetic multi-camera workload through a server
//   kvmem recall  run one recall against a stream
//   kvmem stats   show stream statistics
//   kvmem eval, roofline, bench: evaluation, capacity, load generation
// Every subcommand prints a human summary, or JSON with --json.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "client/cli.h"

ABSL_FLAG(std::string, addr, "",
          "Server address: unix:/path or host:port. demo: empty starts a "
          "local kvmem-server; recall/stats default to 127.0.0.1:50551.");
ABSL_FLAG(bool, json, false, "Print JSON instead of a human summary.");
ABSL_FLAG(std::string, api_key, "",
          "API key for a server with tenants (sent as \"authorization: "
          "Bearer <key>\"); default $KVMEM_API_KEY.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the server's certificate: connect with TLS.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate (with --tls_key) for servers that require "
          "one.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the server's certificate against (default: the "
          "host in --addr).");

namespace kvmem {

const char* StatusCodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? kNames[i] : "UNKNOWN_CODE";
}

int ReportError(const std::string& what, const grpc::Status& status) {
  std::fprintf(stderr, "kvmem: %s: %s: %s\n", what.c_str(),
               StatusCodeName(status.error_code()),
               status.error_message().c_str());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::fprintf(stderr,
                 "kvmem: is kvmem-server running? Pass --addr=unix:/path or "
                 "--addr=host:port\n");
  }
  return 1;
}

double Percentile(std::vector<double>& v, double pct) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(
      v.size() - 1,
      static_cast<size_t>(pct / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

ClientOptions CliClientOptions() {
  ClientOptions o;
  o.api_key = absl::GetFlag(FLAGS_api_key);
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("KVMEM_API_KEY")) o.api_key = env;
  }
  o.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  return o;
}

std::string AddrOrDefault() {
  const std::string a = absl::GetFlag(FLAGS_addr);
  return a.empty() ? "127.0.0.1:50551" : a;
}

}  // namespace kvmem

int main(int argc, char** argv) {
  // --help lists the flags defined in kvmem's own sources.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "client/");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "command-line client of kvmem-server.\nUsage: kvmem "
      "<demo|recall|stats|eval|roofline|bench> "
      "[flags]\n"
      "  demo    stream a synthetic multi-camera workload through "
      "kvmem-server\n"
      "          (starts one on a unix socket unless --addr is given)\n"
      "  recall  --stream=ID [--query=f,f,...|--query_seed=N] [--top_k=K]\n"
      "          [--max_tokens=T]: one recall against a stream\n"
      "  stats   [--stream=ID]: statistics of one or every stream\n"
      "  eval    [--out=DIR] [--via=inproc|grpc]: every policy against an\n"
      "          exact-attention oracle on a synthetic video workload\n"
      "  roofline [--profile=FILE]: KV growth, bytes per decode step and\n"
      "          the memory- or compute-bound verdict, full KV vs kvmem\n"
      "  bench   [--streams=N] [--live_fps=F]: load a server (one it starts "
      "unless\n"
      "          --addr) and report its figures beside references measured\n"
      "          in the same run (storage alone, transport alone, FAISS)\n"
      "Flag names take - or _ (--kv-heads = --kv_heads).\n"
      "Common flags: --addr, --json. Run `kvmem --helpfull` for all flags.");
  // Accept --kv-heads for --kv_heads: dashes in a flag's name (not its
  // value) become underscores.
  std::vector<std::string> normalized(argv, argv + argc);
  std::vector<char*> args_in;
  for (std::string& a : normalized) {
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t i = 2; i < end; ++i)
        if (a[i] == '-') a[i] = '_';
    }
    args_in.push_back(a.data());
  }
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(args_in.size()), args_in.data());
  if (rest.size() < 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string cmd = rest[1];
  std::vector<std::string> args(rest.begin() + 2, rest.end());
  if (cmd == "demo") return kvmem::RunDemo(args);
  if (cmd == "recall") return kvmem::RunRecall(args);
  if (cmd == "stats") return kvmem::RunStats(args);
  if (cmd == "eval") return kvmem::RunEval(args);
  if (cmd == "roofline") return kvmem::RunRoofline(args);
  if (cmd == "bench") return kvmem::RunBench(args);
  std::fprintf(stderr, "kvmem: unknown subcommand \"%s\"\n%s\n", cmd.c_str(),
               absl::ProgramUsageMessage().data());
  return 2;
}
