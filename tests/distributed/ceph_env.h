// The test cluster the `distributed` tests run on: its configuration
// (KVMEM_CEPH_CONF, set by ctest; tests/distributed/CMakeLists.txt), the
// reason they skip without one, and prefixes that keep tests apart in the
// shared pool.
#ifndef KVMEM_TESTS_DISTRIBUTED_CEPH_ENV_H_
#define KVMEM_TESTS_DISTRIBUTED_CEPH_ENV_H_

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvmem::testing {

// The cluster's configuration, or "" when there is none.
inline std::string CephConf() {
  const char* conf = std::getenv("KVMEM_CEPH_CONF");
  return conf != nullptr && std::filesystem::exists(conf) ? conf : "";
}

inline constexpr char kNoCephCluster[] =
    "no Ceph test cluster: KVMEM_CEPH_CONF is unset or missing (ctest starts "
    "one with the ceph_cluster_up fixture, tests/distributed/ceph_cluster.sh)";

// A RADOS prefix no other test (or run) uses: `tag`, pid, a counter, time.
inline std::string UniquePrefix(const std::string& tag) {
  static std::atomic<int> next{0};
  return absl::StrCat(tag, getpid(), "-", next++, "-",
                      absl::ToUnixNanos(absl::Now()), "/");
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_DISTRIBUTED_CEPH_ENV_H_
