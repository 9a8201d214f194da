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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "tools/cli/cli.h"

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
  const char* hint = nullptr;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      hint =
          "is kvmem-server running there? Start it (build/bin/kvmem-server "
          "--listen=127.0.0.1:50551) or pass --addr=unix:/path or "
          "--addr=host:port";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      hint = "the server has tenants: pass --api_key=KEY or set $KVMEM_API_KEY";
      break;
    case grpc::StatusCode::NOT_FOUND:
      hint = "`kvmem stats` lists the streams this caller can see";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      hint =
          "a server limit was reached (the message names the flag): delete "
          "streams or raise the limit";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      hint = "the server is overloaded or stuck; check its log";
      break;
    default:
      break;
  }
  if (hint != nullptr) std::fprintf(stderr, "kvmem: hint: %s\n", hint);
  return 1;
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

namespace {

// A subcommand: the file defining its own flags, the flags it borrows from
// other subcommands' files, and how to run it.
struct Subcommand {
  const char* name;
  const char* file;
  const char* synopsis;
  std::vector<std::string> borrowed;
  int (*run)(const std::vector<std::string>&);
};

const std::vector<Subcommand>& Subcommands() {
  static const auto* subs = new std::vector<Subcommand>{
      {"demo",
       "tools/cli/cli_demo.cc",
       "stream a synthetic multi-camera workload through kvmem-server\n"
       "  (starts one on a unix socket unless --addr is given)",
       {},
       kvmem::RunDemo},
      {"recall",
       "tools/cli/cli_query.cc",
       "--stream=ID [--query=f,f,...|--query_seed=N] [--top_k=K] "
       "[--max_tokens=T]:\n  one recall against a stream",
       {},
       kvmem::RunRecall},
      {"stats",
       "tools/cli/cli_query.cc",
       "[--stream=ID]: statistics of one or every stream",
       {},
       kvmem::RunStats},
      {"health",
       "tools/cli/cli_query.cc",
       "the server's gRPC health (kvmem.v1.KvMemory): exit 0 when\n"
       "  SERVING (no API key needed: container and probe health checks)",
       {},
       kvmem::RunHealth},
      {"eval",
       "tools/cli/cli_eval.cc",
       "[--out=DIR] [--via=inproc|grpc] [--trace=DIR]: every policy\n"
       "  against an exact-attention oracle on a synthetic video workload\n"
       "  or a recorded trace (--write_trace=DIR records one)",
       {"cameras", "frames", "places", "seed", "layers", "kv_heads", "head_dim",
        "tokens_per_frame", "hot_window_tokens", "frames_per_block",
        "warm_budget_bytes", "data_dir", "top_k", "ingest_precision"},
       kvmem::RunEval},
      {"roofline",
       "tools/cli/cli_roofline.cc",
       "[--profile=FILE]: KV growth, bytes per decode step and the\n"
       "  memory- or compute-bound verdict, full KV vs kvmem",
       {"layers", "kv_heads", "head_dim", "tokens_per_frame",
        "hot_window_tokens", "fps", "recall_fraction"},
       kvmem::RunRoofline},
      {"bench",
       "tools/cli/cli_bench.cc",
       "[--streams=N] [--live_fps=F] [--fetch] [--cameras=N]: load a server\n"
       "  (one it starts unless --addr) and report its figures beside\n"
       "  references measured in the same run (storage alone, transport\n"
       "  alone, FAISS)",
       {"cameras", "frames", "layers", "kv_heads", "head_dim",
        "tokens_per_frame", "hot_window_tokens", "seed"},
       kvmem::RunBench},
  };
  return *subs;
}

const Subcommand* FindSubcommand(const std::string& name) {
  for (const Subcommand& s : Subcommands()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::string Overview() {
  std::string out =
      "kvmem: command-line client of kvmem-server.\n"
      "Usage: kvmem <subcommand> [flags]    (kvmem <subcommand> --help: its "
      "flags)\n\n";
  for (const Subcommand& s : Subcommands()) {
    absl::StrAppend(
        &out, "  ", s.name, std::string(10 - strlen(s.name), ' '),
        absl::StrReplaceAll(s.synopsis, {{"\n  ", "\n            "}}), "\n");
  }
  absl::StrAppend(
      &out,
      "\nCommon flags: --addr, --json, --api_key, --tls_*. Flag names take - "
      "or _\n(--kv-heads = --kv_heads). Progress bars appear on a terminal "
      "(KVMEM_PROGRESS=0/1\nturns them off/on).\n"
      "Exit codes: 0 success, 1 the server or the run failed, 2 bad usage.\n");
  return out;
}

bool IsFromFile(const absl::CommandLineFlag& f, const char* file) {
  return absl::EndsWith(f.Filename(), file);
}

void PrintFlag(const absl::CommandLineFlag& f) {
  std::printf("  --%s (default: %s)\n      %s\n", std::string(f.Name()).c_str(),
              f.DefaultValue().empty() ? "\"\"" : f.DefaultValue().c_str(),
              f.Help().c_str());
}

// `kvmem <sub> --help`: the synopsis, its own flags, the ones it shares.
void PrintSubcommandHelp(const Subcommand& sub) {
  std::vector<const absl::CommandLineFlag*> own, shared, common;
  for (const auto& [name, f] : absl::GetAllFlags()) {
    if (IsFromFile(*f, sub.file)) {
      own.push_back(f);
    } else if (std::find(sub.borrowed.begin(), sub.borrowed.end(),
                         std::string(name)) != sub.borrowed.end()) {
      shared.push_back(f);
    } else if (IsFromFile(*f, "tools/cli/cli_main.cc")) {
      common.push_back(f);
    }
  }
  auto by_name = [](const absl::CommandLineFlag* a,
                    const absl::CommandLineFlag* b) {
    return a->Name() < b->Name();
  };
  std::printf("kvmem %s %s\n", sub.name, sub.synopsis);
  for (auto* group : {&own, &shared, &common}) {
    if (group->empty()) continue;
    std::sort(group->begin(), group->end(), by_name);
    std::printf("\n%s:\n", group == &own      ? "Flags"
                           : group == &shared ? "Workload and model flags"
                                              : "Common flags");
    for (const absl::CommandLineFlag* f : *group) PrintFlag(*f);
  }
}

// Levenshtein distance, for "did you mean".
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Flags absl handles itself.
bool IsBuiltinFlag(const std::string& name) {
  for (const char* b :
       {"help", "helpfull", "helpshort", "helppackage", "version",
        "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}) {
    if (name == b) return true;
  }
  return false;
}

// The first unknown flag among args, with a suggestion; "" when all known.
// A value given as the next argument of a non-bool flag ("--query_seed -3")
// is not a flag.
std::string UnknownFlag(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    const bool has_value = name.find('=') != std::string::npos;
    name = name.substr(0, name.find('='));
    if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name)) {
      if (!has_value && !f->IsOfType<bool>()) ++i;  // Skip its value.
      continue;
    }
    if (IsBuiltinFlag(name)) continue;
    if (absl::StartsWith(name, "no")) {
      const absl::CommandLineFlag* f =
          absl::FindCommandLineFlag(name.substr(2));
      if (f != nullptr && f->IsOfType<bool>()) continue;
    }
    std::string best;
    size_t best_d = 4;
    for (const auto& [flag, f] : absl::GetAllFlags()) {
      if (!absl::StrContains(f->Filename(), "tools/cli/")) continue;
      const size_t d = Distance(name, std::string(flag));
      if (d < best_d) best_d = d, best = std::string(flag);
    }
    return absl::StrCat(
        "unknown flag --", name,
        best.empty() ? "" : absl::StrCat(" (did you mean --", best, "?)"));
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // --helpfull lists the flags defined in kvmem's own sources.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "tools/cli/");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(Overview());
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
  // `kvmem <sub> --help` and `kvmem help <sub>`: that subcommand's flags.
  const Subcommand* sub = nullptr;
  bool help = false;
  for (size_t i = 1; i < normalized.size() && normalized[i] != "--"; ++i) {
    const std::string& a = normalized[i];
    if (a == "--help" || a == "-h" || a == "-help" || a == "--helpshort") {
      help = true;
    }
    if (i == 1 && a == "help") {
      help = true;
      if (i + 1 < normalized.size() && normalized[i + 1][0] != '-' &&
          FindSubcommand(normalized[i + 1]) == nullptr) {
        std::fprintf(stderr, "kvmem: unknown subcommand \"%s\"\n\n%s",
                     normalized[i + 1].c_str(), Overview().c_str());
        return 2;
      }
    }
    if (sub == nullptr && !a.empty() && a[0] != '-') sub = FindSubcommand(a);
  }
  if (help) {
    if (sub != nullptr) {
      PrintSubcommandHelp(*sub);
    } else {
      std::printf("%s", Overview().c_str());
    }
    return 0;
  }
  if (const std::string unknown = UnknownFlag(normalized); !unknown.empty()) {
    std::fprintf(stderr, "kvmem: %s; `kvmem %s --help` lists the flags\n",
                 unknown.c_str(), sub != nullptr ? sub->name : "<subcommand>");
    return 2;
  }
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(args_in.size()), args_in.data());
  if (rest.size() < 2) {
    std::fprintf(stderr, "%s", Overview().c_str());
    return 2;
  }
  const std::string cmd = rest[1];
  std::vector<std::string> args(rest.begin() + 2, rest.end());
  if (const Subcommand* s = FindSubcommand(cmd)) return s->run(args);
  std::fprintf(stderr, "kvmem: unknown subcommand \"%s\"\n\n%s", cmd.c_str(),
               Overview().c_str());
  return 2;
}
