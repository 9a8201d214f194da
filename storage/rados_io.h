// Helpers of RadosColdStore (storage/rados_cold_store.h): librados return
// codes as statuses, a batch of aio operations waited on together, the head
// object's keys and the manifest's references to payload objects.
#ifndef KVMEM_STORAGE_RADOS_IO_H_
#define KVMEM_STORAGE_RADOS_IO_H_

#include <cstdint>
#include <functional>
#include <rados/librados.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvmem::rados_io {

// What a librados return code means under the ColdStore contract. `what`
// names the operation and object. -ECANCELED (a failed epoch compare) is
// ABORTED; -ETIMEDOUT and lost connections UNAVAILABLE; -ENOSPC / -EDQUOT
// RESOURCE_EXHAUSTED; -ENOENT NOT_FOUND; -EIO DATA_LOSS.
absl::Status FromRc(int rc, absl::string_view what);

// aio operations started together and waited on together.
class AioBatch {
 public:
  AioBatch() = default;
  AioBatch(const AioBatch&) = delete;
  AioBatch& operator=(const AioBatch&) = delete;
  ~AioBatch();

  // A completion for the next operation; `what` names it in errors.
  librados::AioCompletion* Add(std::string what);
  // Marks the last Add as not started (its aio call failed with rc).
  void NotStarted(int rc);
  // Waits for every operation; the first failure's status (in Add order),
  // or OK.
  absl::Status Wait();
  // The return value of operation i after Wait.
  int rc(size_t i) const { return rcs_[i]; }
  size_t size() const { return ops_.size(); }

 private:
  struct Op {
    librados::AioCompletion* c;
    std::string what;
    int start_rc;
  };
  std::vector<Op> ops_;
  std::vector<int> rcs_;
  bool waited_ = false;
};

// A payload object's part that one record occupies. A layer record written
// since 2026-12-04 ends with the CRC32C trailer of storage/layer_trailer.h
// (`trailer`, its 8 bytes counted in `length`), encoded as a "t:" prefix;
// refs without it (older records, frames, block records) decode as before.
struct Ref {
  std::string object;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool trailer = false;
};
std::string EncodeRef(const Ref& ref);
bool DecodeRef(absl::string_view bytes, Ref* ref);

// Head omap keys. Numbers are fixed-width hex, so omap order is numeric.
inline constexpr char kHead[] = "head";
inline constexpr char kIndex[] = "kvmem.streams";
inline constexpr char kEpochAttr[] = "kvmem.epoch";
inline constexpr char kConfigKey[] = "c";
inline constexpr char kStateKey[] = "s";
inline constexpr char kAckKey[] = "a";
std::string FrameKey(uint64_t frame);                  // "f/<16 hex>"
std::string MetaKey(uint64_t frame);                   // "m/<16 hex>"
std::string BlockKey(uint64_t block);                  // "b/<16 hex>"
std::string LayerKey(uint64_t block, uint32_t layer);  // "l/<16>/<8 hex>"
// Parses the number(s) after a key's prefix; false when malformed.
bool ParseKey(absl::string_view key, uint64_t* a, uint32_t* b = nullptr);

std::string U64(uint64_t v);  // Decimal: what cmpxattr's u64 mode parses.
bool ParseU64(absl::string_view text, uint64_t* v);

// Reads every key (and value) of `oid`'s omap that starts with `prefix`,
// in key order, page by page; fn returns false to stop early.
absl::Status ScanOmap(
    librados::IoCtx& io, const std::string& oid, const std::string& prefix,
    const std::function<bool(const std::string&, librados::bufferlist&)>& fn);

// Payload objects are striped: a logical object "<base>.<bytes>" is stored
// as "<base>.<bytes>/<k>" for k < ceil(bytes / kStripeBytes) (at least
// one), so a large frame or block is written and read as several RADOS
// objects in parallel, spread over placement groups.
inline constexpr uint64_t kStripeBytes = 4 << 20;
std::string StripedName(const std::string& base, uint64_t bytes);
// The stripes of a logical object; empty when the name has no size.
std::vector<std::string> Stripes(const std::string& logical);

// Writes each logical object's stripes (write_full), all in parallel.
absl::Status WriteObjects(
    librados::IoCtx& io,
    const std::vector<std::pair<std::string, librados::bufferlist>>& objects);

// A copy of s. (Not a view of the caller's bytes: an operation that timed
// out may still sit in the messenger's queue after the call returns.)
librados::bufferlist Text(absl::string_view s);

// Reads each ref's bytes, one read operation per stripe, all in parallel,
// into the returned strings (copied out of librados' buffers). DATA_LOSS
// when an object holds fewer bytes than its ref says.
absl::StatusOr<std::vector<std::string>> ReadRefs(librados::IoCtx& io,
                                                  const std::vector<Ref>& refs);

// Removes objects, in parallel: logical ones (every stripe) or, with
// striped false, RADOS objects by their own names. A failure only leaves
// garbage behind.
void RemoveObjects(librados::IoCtx& io, const std::vector<std::string>& names,
                   bool striped = true);

}  // namespace kvmem::rados_io

#endif  // KVMEM_STORAGE_RADOS_IO_H_
