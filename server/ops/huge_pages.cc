#include "server/ops/huge_pages.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvmem {

std::string TransparentHugePageMode(const char* enabled_file) {
  std::ifstream in(enabled_file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  const size_t open = s.find('['), close = s.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    return "";
  }
  return s.substr(open + 1, close - open - 1);
}

std::string TunablesWithHugePages(const char* current) {
  const std::string now = current == nullptr ? "" : current;
  if (absl::StrContains(now, "glibc.malloc.hugetlb")) return "";
  return now.empty() ? "glibc.malloc.hugetlb=1"
                     : absl::StrCat(now, ":glibc.malloc.hugetlb=1");
}

void ReexecWithHugePages(char** argv, std::string* why) {
  std::string unused;
  if (why == nullptr) why = &unused;
  const std::string mode = TransparentHugePageMode();
  if (mode != "always" && mode != "madvise") {
    *why = absl::StrCat("transparent huge pages are \"",
                        mode.empty() ? "unknown" : mode, "\" here");
    return;
  }
  const std::string tunables = TunablesWithHugePages(getenv("GLIBC_TUNABLES"));
  if (tunables.empty()) {
    *why = "GLIBC_TUNABLES sets glibc.malloc.hugetlb";
    return;
  }
  // The binary's own path, not /proc/self/exe: the process keeps its name
  // (ps, pgrep and /proc/PID/comm show kvmem-server).
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) {
    *why =
        absl::StrCat("could not read /proc/self/exe: ", std::strerror(errno));
    return;
  }
  path[n] = '\0';
  setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  execv(path, argv);
  // Still here: the server goes on with 4 KiB pages.
  *why = absl::StrCat("could not start again: ", std::strerror(errno));
  unsetenv("GLIBC_TUNABLES");
}

}  // namespace kvmem
