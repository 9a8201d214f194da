// Tenancy: API keys, tenants and their stream namespaces, and the limits a
// server puts on callers (issue 7).
//
// Without keys (the default) there is one implicit tenant, calls need no
// credentials and stream ids reach the engine unchanged. With keys (from
// --api_keys_file or $KVMEM_API_KEYS, lines "tenant:key"), every call must
// carry one in its metadata ("authorization: Bearer <key>" or
// "x-api-key: <key>"), else UNAUTHENTICATED; the key's tenant then owns the
// call, and its stream "cam" is the engine's "<tenant>/cam" ('/' cannot
// occur in a stream id, so namespaces cannot collide). A tenant cannot
// name, list, read, recall, fetch or delete another tenant's streams: they
// do not exist for it (NOT_FOUND). Keys are compared in constant time and
// never logged; only tenant names are.
//
// Limits (0 = none): streams per tenant; retained payload bytes per stream,
// per tenant and in all (the full-precision size of every frame not
// evicted); calls in flight. Over a limit the caller gets RESOURCE_EXHAUSTED
// naming the limit and the flag that sets it.
//
// Thread safety: const after construction, except the in-flight counter
// (atomic); safe to share across gRPC threads.
#ifndef KVMEM_SERVER_TENANCY_H_
#define KVMEM_SERVER_TENANCY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/memory_engine.h"
#include "grpcpp/grpcpp.h"

namespace kvmem {

struct Limits {
  uint32_t max_streams_per_tenant = 0;
  uint64_t max_stream_bytes = 0;
  uint64_t max_tenant_bytes = 0;
  uint64_t max_total_bytes = 0;
  uint32_t max_calls_in_flight = 0;
};

class Tenancy {
 public:
  Tenancy() = default;  // No keys: one implicit tenant, no checks.
  // Parses "tenant:key" lines (blank lines and '#' comments ignored).
  // Tenant names follow stream id rules; keys are at least 16 characters.
  // INVALID_ARGUMENT naming the line (never the key) when malformed.
  static absl::StatusOr<Tenancy> Parse(const std::string& text);

  bool enabled() const { return !keys_.empty(); }
  size_t tenants() const;

  // The caller's tenant ("" when tenancy is off); UNAUTHENTICATED when a key
  // is needed and missing or unknown.
  absl::StatusOr<std::string> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

  // The engine's id of a tenant's stream, and back: nullopt when the engine
  // id belongs to another tenant.
  std::string EngineId(const std::string& tenant, const std::string& id) const;
  std::optional<std::string> ClientId(const std::string& tenant,
                                      const std::string& engine_id) const;
  // s with the tenant's namespace prefix removed from its message.
  absl::Status Scrub(const std::string& tenant, const absl::Status& s) const;

 private:
  std::map<std::string, std::string> keys_;  // key -> tenant
};

// Admission against Limits, over the engine's live streams.
class Admission {
 public:
  Admission(const Tenancy* tenancy, MemoryEngine* engine, Limits limits)
      : tenancy_(tenancy), engine_(engine), limits_(limits) {}

  const Limits& limits() const { return limits_; }

  // Before creating a stream for tenant.
  absl::Status AdmitNewStream(const std::string& tenant) const;
  // Before appending `bytes` of payload to stream (engine id) of tenant.
  absl::Status AdmitBytes(const std::string& tenant, const Stream& stream,
                          uint64_t bytes) const;

  // A call in flight, released on destruction; !ok() when over the limit.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept : owner_(o.owner_) { o.owner_ = nullptr; }
    Slot& operator=(Slot&& o) noexcept {
      std::swap(owner_, o.owner_);
      return *this;
    }
    ~Slot() {
      if (owner_ != nullptr) owner_->in_flight_.fetch_sub(1);
    }

   private:
    friend class Admission;
    explicit Slot(const Admission* owner) : owner_(owner) {}
    const Admission* owner_ = nullptr;
  };
  absl::StatusOr<Slot> EnterCall() const;

 private:
  const Tenancy* const tenancy_;
  MemoryEngine* const engine_;
  const Limits limits_;
  mutable std::atomic<uint32_t> in_flight_{0};
};

// One call's view: who is calling, its slot among the calls in flight, and
// the mapping of its stream ids. Cheap to copy (the slot is shared).
class Caller {
 public:
  // Authenticates the call and takes a slot; the status to finish the call
  // with otherwise.
  static absl::StatusOr<Caller> Enter(const Tenancy* tenancy,
                                      const Admission* admission,
                                      const grpc::CallbackServerContext& ctx);

  // The engine id of a stream id the caller sent (checked: non-empty, at
  // most 128 bytes of [A-Za-z0-9._:-]).
  absl::StatusOr<std::string> EngineId(const std::string& client_id) const;
  // The id the caller knows an engine id by; nullopt for another tenant's.
  std::optional<std::string> ClientId(const std::string& engine_id) const {
    return tenancy_->ClientId(tenant_, engine_id);
  }
  absl::Status Scrub(const absl::Status& s) const {
    return tenancy_->Scrub(tenant_, s);
  }
  absl::Status AdmitNewStream() const {
    return admission_->AdmitNewStream(tenant_);
  }
  // For FrameIngest.
  absl::Status AdmitBytes(const Stream& stream, uint64_t bytes) const {
    return admission_->AdmitBytes(tenant_, stream, bytes);
  }
  const std::string& tenant() const { return tenant_; }

 private:
  Caller(const Tenancy* t, const Admission* a, std::string tenant,
         std::shared_ptr<Admission::Slot> slot)
      : tenancy_(t),
        admission_(a),
        tenant_(std::move(tenant)),
        slot_(std::move(slot)) {}
  const Tenancy* tenancy_;
  const Admission* admission_;
  std::string tenant_;
  std::shared_ptr<Admission::Slot> slot_;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_TENANCY_H_
