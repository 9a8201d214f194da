// OwnedStore: the engine's view of a shared store when an ownership
// (engine/ownership.h) decides who serves each stream. Every write first
// asks the ownership whether this server may still write (a lease about to
// lapse stops writes before it can expire); a write the store refuses
// because another server took the stream over (ABORTED) answers the
// ownership's UNAVAILABLE naming the new owner, and moved(stream) is told
// so the engine drops the stream.
#ifndef KVMEM_ENGINE_OWNED_STORE_H_
#define KVMEM_ENGINE_OWNED_STORE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "engine/ownership.h"
#include "storage/forwarding_store.h"

namespace kvmem {

class OwnedStore final : public ForwardingColdStore {
 public:
  using MovedFn = std::function<void(const std::string&, const absl::Status&)>;
  // REQUIRES: ownership outlives the store.
  OwnedStore(std::shared_ptr<ColdStore> inner, StreamOwnership* ownership,
             MovedFn moved)
      : ForwardingColdStore(std::move(inner)),
        ownership_(ownership),
        moved_(std::move(moved)) {}

  absl::Status Commit(const StreamWrite& w) override;
  absl::Status DeleteStream(absl::string_view id) override;
  absl::Status RecordAcknowledged(
      const std::map<std::string, uint64_t>& frames) override;

 private:
  // A refusal by the store for want of ownership becomes the owner's
  // redirect; other statuses pass.
  absl::Status Checked(absl::string_view id, absl::Status s);

  StreamOwnership* const ownership_;
  const MovedFn moved_;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_OWNED_STORE_H_
