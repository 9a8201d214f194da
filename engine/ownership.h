// StreamOwnership: who may serve a stream when several servers share one
// store (ColdStore::shared(), e.g. RADOS). A coordinator implements it
// (server/ownership/etcd_ownership.h: an etcd lease and one key per
// stream); the engine asks it before it takes a stream up and before every
// write, and drops a stream it no longer owns.
//
// With an ownership, MemoryEngine recovers nothing at Open: a stream is
// taken up (claimed in the store with its fencing token, its records read,
// its indexes rebuilt) on the first call that names it, and dropped from RAM
// when another server takes it over or this server's ownership lapses.
//
// Thread safety: every method may be called from any thread.
#ifndef KVMEM_ENGINE_OWNERSHIP_H_
#define KVMEM_ENGINE_OWNERSHIP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvmem {

// The payload of an UNAVAILABLE status that names the server owning a
// stream (its address, as clients reach it): the server puts it in the
// call's trailing metadata (kvmem-owner) so clients can follow.
inline constexpr char kOwnerPayload[] = "type.kvmem.dev/owner";

// Returns `s` with the owner's address attached (kOwnerPayload).
absl::Status WithOwner(absl::Status s, absl::string_view owner);
// The owner's address attached to s, if any.
std::optional<std::string> OwnerOf(const absl::Status& s);

class StreamOwnership {
 public:
  virtual ~StreamOwnership() = default;

  // Makes (or confirms) this server the stream's owner: the holding's
  // fencing token (> 0; a later holding's is larger). UNAVAILABLE when
  // another server owns it (WithOwner: its address) or when the
  // coordinator cannot be asked.
  virtual absl::StatusOr<uint64_t> Acquire(const std::string& id) = 0;
  // Gives the stream up when this server holds it (it does not exist, or
  // was deleted); nothing when another server holds it.
  virtual void Release(const std::string& id) = 0;
  // The status for calls on a stream another server took over (cause: the
  // store's refusal): UNAVAILABLE naming the new owner when known.
  virtual absl::Status Moved(const std::string& id,
                             const absl::Status& cause) = 0;
  // OK while this server may serve and write the streams it holds; an
  // UNAVAILABLE status once its ownership may be about to lapse (a lease
  // not renewed in time). Cheap: called before every write and lookup.
  virtual absl::Status CheckServing() = 0;
  // fn is called (from any thread) when this server's ownership of every
  // stream it held has lapsed, with the reason; the engine drops them all.
  virtual void OnLost(std::function<void(const absl::Status&)> fn) = 0;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_OWNERSHIP_H_
