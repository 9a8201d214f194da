#include "server/ops/huge_pages.h"

#include <sys/auxv.h>
#include <sys/stat.h>
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

namespace {

constexpr char kOnHugePages[] = "heap on transparent huge pages";
constexpr char kOnSmallPages[] = "heap on 4 KiB pages: ";

}  // namespace

std::string StartWithHugePages(char** argv,
                               const std::vector<std::string>& reread) {
  const char* tunables = getenv("GLIBC_TUNABLES");
  const bool set_on = tunables != nullptr &&
                      absl::StrContains(tunables, "glibc.malloc.hugetlb=1");
  const std::string mode = TransparentHugePageMode();
  const bool offered = mode == "always" || mode == "madvise";
  if (getenv(kHugePagesReexecMarker) != nullptr) {  // Started again by us.
    unsetenv(kHugePagesReexecMarker);
    if (set_on && offered) {
      return absl::StrCat(kOnHugePages, " (glibc.malloc.hugetlb=1)");
    }
    return absl::StrCat(kOnSmallPages,
                        "started again with glibc.malloc.hugetlb=1, which "
                        "did not reach the new process (a secure exec drops "
                        "glibc's tunables)");
  }
  if (!offered) {
    return absl::StrCat(kOnSmallPages, "transparent huge pages are \"",
                        mode.empty() ? "unknown" : mode, "\" here");
  }
  if (TunablesWithHugePages(tunables).empty()) {
    return set_on
               ? absl::StrCat(kOnHugePages,
                              " (GLIBC_TUNABLES sets glibc.malloc.hugetlb=1)")
               : absl::StrCat(kOnSmallPages,
                              "GLIBC_TUNABLES sets glibc.malloc.hugetlb");
  }
  if (getauxval(AT_SECURE) != 0) {
    return absl::StrCat(kOnSmallPages,
                        "a setuid or file-capability binary ignores glibc's "
                        "tunables");
  }
  for (const std::string& file : reread) {
    struct stat st;
    if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::StrCat(kOnSmallPages, file,
                          " is not a regular file, and starting again would "
                          "read it twice");
    }
  }
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) {
    return absl::StrCat(
        kOnSmallPages, "could not read /proc/self/exe: ", std::strerror(errno));
  }
  path[n] = '\0';
  const std::string before = tunables == nullptr ? "" : tunables;
  setenv("GLIBC_TUNABLES", TunablesWithHugePages(tunables).c_str(), 1);
  setenv(kHugePagesReexecMarker, "1", 1);
  execv(path, argv);
  // Still here: the server goes on as it was.
  const int err = errno;
  unsetenv(kHugePagesReexecMarker);
  if (before.empty()) {
    unsetenv("GLIBC_TUNABLES");
  } else {
    setenv("GLIBC_TUNABLES", before.c_str(), 1);
  }
  return absl::StrCat(kOnSmallPages, "could not start again (", path,
                      "): ", std::strerror(err));
}

}  // namespace kvmem
