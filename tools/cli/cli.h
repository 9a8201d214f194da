// Subcommands of the `kvmem` CLI. Each returns the process exit code:
// 0 success, 1 the service reported an error, 2 bad usage.
#ifndef KVMEM_TOOLS_CLI_CLI_H_
#define KVMEM_TOOLS_CLI_CLI_H_

#include <grpcpp/support/status.h>

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "client/cpp/kvmem_client.h"

ABSL_DECLARE_FLAG(std::string, addr);
ABSL_DECLARE_FLAG(bool, json);

namespace kvmem {

int RunDemo(const std::vector<std::string>& args);
int RunRecall(const std::vector<std::string>& args);
int RunStats(const std::vector<std::string>& args);
int RunHealth(const std::vector<std::string>& args);
int RunEval(const std::vector<std::string>& args);
int RunRoofline(const std::vector<std::string>& args);
int RunBench(const std::vector<std::string>& args);

// Prints "kvmem: <what>: <CODE>: <message>" to stderr; returns 1.
int ReportError(const std::string& what, const grpc::Status& status);
const char* StatusCodeName(grpc::StatusCode code);

// Subcommands share some flags (--layers, --frames, ...) but not their
// defaults: the flag's value when set to something other than its declared
// default, else the subcommand's `fallback`.
template <typename T>
T FlagOr(const absl::Flag<T>& flag, const char* name, T fallback) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  return f != nullptr && f->CurrentValue() != f->DefaultValue()
             ? absl::GetFlag(flag)
             : fallback;
}

// --addr, or the default server address when it is empty.
std::string AddrOrDefault();
// Connection options from --api_key ($KVMEM_API_KEY) and --tls_*.
ClientOptions CliClientOptions();

}  // namespace kvmem

#endif  // KVMEM_TOOLS_CLI_CLI_H_
