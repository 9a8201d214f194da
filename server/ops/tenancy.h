// Tenancy: API keys, tenants and their stream namespaces, and the limits a
// server puts on callers.
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
// Limits (0 = none): streams per tenant; retained bytes per stream, per
// tenant and in all (the full-precision size of every frame not evicted,
// and the RAM its signals hold); calls in flight; bytes of frames being
// received (a frame's buffer is allocated whole when its header arrives). Over
// a limit the caller gets RESOURCE_EXHAUSTED naming the limit and the flag that
// sets it.
//
// With keys, the server-wide limits (calls in flight, total bytes, frame
// bytes in flight) are split into equal shares, one per tenant of the keys
// file: no tenant can use another's share, so none can refuse another, and
// a refusal names only the caller's own use and share, never the server's
// totals. A frame's bytes are reserved from its header until it is stored,
// and checks and reservations are made under one lock, as are stream
// creations: concurrent calls cannot pass a limit together.
//
// Thread safety: Tenancy is const after construction; Admission locks
// internally; both are safe to share across gRPC threads.
#ifndef KVMEM_SERVER_OPS_TENANCY_H_
#define KVMEM_SERVER_OPS_TENANCY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/sync.h"
#include "engine/memory_engine.h"
#include "engine/ownership.h"
#include "grpcpp/grpcpp.h"

namespace kvmem {

// Trailing metadata of a call refused because another server owns the
// stream: that server's address (engine/ownership.h's kOwnerPayload).
inline constexpr char kOwnerHeader[] = "kvmem-owner";
// Trailing metadata of a FetchBlocks refused for room after some of its
// blocks ("FetchBlocks sent N of M blocks"): N, the blocks sent whole (the
// status's kBlocksSentPayload), so that clients resume with the rest
// without reading the message.
inline constexpr char kBlocksSentHeader[] = "kvmem-blocks-sent";
inline constexpr char kBlocksSentPayload[] = "type.kvmem.dev/blocks-sent";

struct Limits {
  uint32_t max_streams_per_tenant = 0;
  uint64_t max_stream_bytes = 0;
  uint64_t max_tenant_bytes = 0;
  uint64_t max_total_bytes = 0;
  uint32_t max_calls_in_flight = 0;
  uint64_t max_frame_bytes_in_flight = 0;
  // Session responses computed and not yet written (a client that reads
  // slowly, or not at all): never refused, but a Session holding some stops
  // reading while its tenant's pass their share.
  uint64_t max_queued_response_bytes = 0;
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
  std::vector<std::string> tenant_names() const;

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
  Admission(const Tenancy* tenancy, MemoryEngine* engine, Limits limits);

  const Limits& limits() const { return limits_; }

  // Held across the admission and the creation of a stream, so concurrent
  // creations cannot pass --max_streams_per_tenant together.
  kvmem::Mutex* creation_mu() const ABSL_LOCK_RETURNED(creation_mu_) {
    return &creation_mu_;
  }
  // Before creating a stream for tenant.
  absl::Status AdmitNewStream(const std::string& tenant) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(creation_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  // A frame's bytes, reserved from its header until it is stored (or the
  // call ends); released on destruction.
  using Reservation = std::shared_ptr<void>;
  // Before buffering a frame of `bytes` payload bytes for stream (engine
  // id) of tenant: checks the retained-bytes limits and the frame bytes in
  // flight, counting other frames' reservations, and reserves.
  absl::StatusOr<Reservation> AdmitBytes(const std::string& tenant,
                                         const StreamHandle& stream,
                                         uint64_t bytes) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // A Session response's bytes, from when it is queued until gRPC has
  // taken it (released on destruction). Never refused: see
  // ResponsesOverShare.
  Reservation HoldResponseBytes(const std::string& tenant, uint64_t bytes) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the tenant's held response bytes pass its share of
  // --max_queued_response_bytes (false when it has no limit).
  bool ResponsesOverShare(const std::string& tenant) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes of a block a FetchBlocks call is about to read and hold until
  // they are written, counted with the Sessions' held responses: refused
  // (RESOURCE_EXHAUSTED naming --max_queued_response_bytes) when the tenant
  // already holds some and these would pass its share. A tenant holding
  // none may always take one block, however large. A read `ahead` (the
  // call holds its current block) must leave half the share free, so one
  // call reading ahead does not refuse the tenant's other calls.
  absl::StatusOr<Reservation> ReserveAnswerBytes(const std::string& tenant,
                                                 uint64_t bytes,
                                                 bool ahead) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // A call in flight, released on destruction.
  using Slot = std::shared_ptr<void>;
  // Server-wide, before the call is authenticated.
  absl::StatusOr<Slot> EnterCall() const ABSL_LOCKS_EXCLUDED(mu_);
  // The tenant's share, once it is known.
  absl::StatusOr<Slot> EnterTenantCall(const std::string& tenant) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // A tenant's share of a server-wide limit (0: none).
  uint64_t Share(uint64_t limit) const;

 private:
  struct TenantUse {
    uint32_t calls = 0;
    uint64_t reserved = 0;  // Frame bytes in flight.
    // Session responses queued and FetchBlocks' blocks held, in bytes.
    uint64_t responses = 0;
  };
  TenantUse& Use(const std::string& tenant) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `bytes` of the tenant's responses back on destruction.
  Reservation ResponsesHeld(const std::string& tenant, uint64_t bytes) const;
  uint64_t RetainedBytes(const std::string& prefix) const;

  const Tenancy* const tenancy_;
  MemoryEngine* const engine_;
  const Limits limits_;
  const uint64_t shares_;  // Tenants the server-wide limits are split among.
  mutable kvmem::Mutex creation_mu_;
  mutable kvmem::Mutex mu_ ABSL_ACQUIRED_AFTER(creation_mu_);
  mutable uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::map<std::string, TenantUse> use_ ABSL_GUARDED_BY(mu_);
  // Frame bytes reserved per stream (engine id), while any are.
  mutable std::map<std::string, uint64_t> stream_reserved_ ABSL_GUARDED_BY(mu_);
};

// One call's view: who is calling, its slot among the calls in flight, and
// the mapping of its stream ids. Cheap to copy (the slot is shared).
class Caller {
 public:
  // Authenticates the call and takes a slot; the status to finish the call
  // with otherwise.
  // The call's context must outlive the Caller's use (until the call
  // finishes): Scrub adds trailing metadata to it.
  static absl::StatusOr<Caller> Enter(const Tenancy* tenancy,
                                      const Admission* admission,
                                      grpc::CallbackServerContext& ctx);

  // The engine id of a stream id the caller sent (checked: non-empty, at
  // most 128 bytes of [A-Za-z0-9._:-]).
  absl::StatusOr<std::string> EngineId(const std::string& client_id) const;
  // The id the caller knows an engine id by; nullopt for another tenant's.
  std::optional<std::string> ClientId(const std::string& engine_id) const {
    return tenancy_->ClientId(tenant_, engine_id);
  }
  // The status as this caller may see it (other tenants' ids removed);
  // a status naming the stream's owner (engine/ownership.h) also puts it
  // in the call's trailing metadata kOwnerHeader, and one naming the
  // blocks a fetch sent (kBlocksSentPayload) in kBlocksSentHeader, each
  // once per call.
  absl::Status Scrub(const absl::Status& s) const;
  // REQUIRES: creation_mu() held (the check and the creation are one step).
  absl::Status AdmitNewStream() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(creation_mu()) {
    return admission_->AdmitNewStream(tenant_);
  }
  kvmem::Mutex* creation_mu() const
      ABSL_LOCK_RETURNED(admission_->creation_mu()) {
    return admission_->creation_mu();
  }
  // For FrameIngest.
  absl::StatusOr<Admission::Reservation> AdmitBytes(const StreamHandle& stream,
                                                    uint64_t bytes) const {
    return admission_->AdmitBytes(tenant_, stream, bytes);
  }
  // For the Session reactor (Admission::HoldResponseBytes).
  Admission::Reservation HoldResponseBytes(uint64_t bytes) const {
    return admission_->HoldResponseBytes(tenant_, bytes);
  }
  bool ResponsesOverShare() const {
    return admission_->ResponsesOverShare(tenant_);
  }
  // For the FetchBlocks reactor.
  absl::StatusOr<Admission::Reservation> ReserveAnswerBytes(uint64_t bytes,
                                                            bool ahead) const {
    return admission_->ReserveAnswerBytes(tenant_, bytes, ahead);
  }
  const std::string& tenant() const { return tenant_; }

 private:
  Caller(const Tenancy* t, const Admission* a, std::string tenant,
         Admission::Slot server_slot, Admission::Slot tenant_slot,
         grpc::CallbackServerContext* ctx)
      : tenancy_(t),
        admission_(a),
        tenant_(std::move(tenant)),
        server_slot_(std::move(server_slot)),
        tenant_slot_(std::move(tenant_slot)),
        ctx_(ctx),
        headers_sent_(std::make_shared<std::atomic<uint32_t>>(0)) {}
  const Tenancy* tenancy_;
  const Admission* admission_;
  std::string tenant_;
  Admission::Slot server_slot_, tenant_slot_;
  grpc::CallbackServerContext* ctx_;
  // Trailing headers Scrub added (a bit each), shared by copies.
  std::shared_ptr<std::atomic<uint32_t>> headers_sent_;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_OPS_TENANCY_H_
