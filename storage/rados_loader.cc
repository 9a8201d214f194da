// OpenRadosColdStore: loads the RADOS store module (libkvmem_rados.so,
// built from rados_cold_store.cc, rados_store_reads.cc and rados_io.cc and
// linked to librados) on first use, and opens a store through it.
//
// Why a module: every library a program is linked with puts its static
// thread-local storage on every thread's stack, and librados brings
// libceph-common's. OpenBLAS already takes 60 KiB there; with Ceph's on
// top, the 100 KiB stacks of the metrics endpoint's (civetweb) threads
// overflowed on the first scrape. Loaded with dlopen, librados' TLS is
// allocated on first use per thread instead, and only a server that opens a
// rados: store loads it at all.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/rados_cold_store.h"

namespace kvmem {
namespace {

using OpenFn = ColdStore* (*)(const RadosColdStoreOptions*, absl::Status*);

// Where the module may be: $KVMEM_RADOS_MODULE, beside the running binary,
// or in ../lib/kvmem from it.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("KVMEM_RADOS_MODULE"); env && *env) {
    out.push_back(env);
  }
  std::error_code ec;
  const std::filesystem::path exe =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / "libkvmem_rados.so").string());
    out.push_back(
        (exe.parent_path() / "../lib/kvmem/libkvmem_rados.so").string());
  }
  return out;
}

absl::StatusOr<OpenFn> LoadModule() {
  static std::mutex mu;
  static OpenFn open = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (open != nullptr) return open;
  std::vector<std::string> tried;
  for (const std::string& path : Candidates()) {
    if (!std::filesystem::exists(path)) {
      tried.push_back(path + " (missing)");
      continue;
    }
    // Never closed: stores it made may live until the process ends.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried.push_back(absl::StrCat(path, " (", ::dlerror(), ")"));
      continue;
    }
    open = reinterpret_cast<OpenFn>(::dlsym(handle, "kvmem_rados_open"));
    if (open == nullptr) {
      tried.push_back(path + " (no kvmem_rados_open)");
      continue;
    }
    return open;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rados store: cannot load its module libkvmem_rados.so: tried ",
      absl::StrJoin(tried, ", ")));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ColdStore>> OpenRadosColdStore(
    const RadosColdStoreOptions& options) {
  absl::StatusOr<OpenFn> open = LoadModule();
  if (!open.ok()) return open.status();
  absl::Status status;
  ColdStore* store = (*open)(&options, &status);
  if (store == nullptr) return status;
  return std::unique_ptr<ColdStore>(store);
}

}  // namespace kvmem
