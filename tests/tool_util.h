// Shared by the standalone test tools (kvmem_crash_test, kvmem_soak_test):
// their work directory and how they report a failure.
#ifndef KVMEM_TESTS_TOOL_UTIL_H_
#define KVMEM_TESTS_TOOL_UTIL_H_

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvmem::testing {

// `dir`, or /tmp/kvmem-<tool>-<pid> when empty, emptied and created.
inline std::string FreshWorkDir(std::string dir, const std::string& tool) {
  if (dir.empty()) dir = absl::StrCat("/tmp/kvmem-", tool, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Prints "<tool>: FAILED: <what>" and where the work dir was kept; returns
// the tool's failure exit status, 1.
inline int ToolFailure(const char* tool, const std::string& what,
                       const std::string& dir) {
  std::fprintf(stderr, "%s: FAILED: %s\n(work dir kept: %s)\n", tool,
               what.c_str(), dir.c_str());
  return 1;
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_TOOL_UTIL_H_
