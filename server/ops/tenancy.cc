#include "server/ops/tenancy.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "engine/ownership.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Equal strings of equal length, in time independent of where they differ.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<Tenancy> Tenancy::Parse(const std::string& text) {
  Tenancy t;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "API keys line ", line_no, " has no ':'; expected tenant:key"));
    }
    const std::string tenant(absl::StripAsciiWhitespace(line.substr(0, colon)));
    const std::string key(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    absl::Status id = ValidateStreamId(tenant);
    if (!id.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "API keys line ", line_no, ": tenant name: ", id.message()));
    }
    if (key.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "API keys line ", line_no, " (tenant ", tenant, "): the key has ",
          key.size(), " characters; use at least 16"));
    }
    if (!t.keys_.emplace(key, tenant).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("API keys line ", line_no, " (tenant ", tenant,
                       "): the same key is listed twice"));
    }
  }
  return t;
}

size_t Tenancy::tenants() const { return tenant_names().size(); }

std::vector<std::string> Tenancy::tenant_names() const {
  std::set<std::string> names;
  for (const auto& [key, tenant] : keys_) names.insert(tenant);
  return std::vector<std::string>(names.begin(), names.end());
}

absl::StatusOr<std::string> Tenancy::Authenticate(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (!enabled()) return std::string();
  std::vector<absl::string_view> offered;
  for (const auto& [name, value] : metadata) {
    const absl::string_view n(name.data(), name.size());
    absl::string_view v(value.data(), value.size());
    if (n == "x-api-key") {
      offered.push_back(v);
    } else if (n == "authorization" && absl::ConsumePrefix(&v, "Bearer ")) {
      offered.push_back(v);
    }
  }
  if (offered.empty()) {
    return absl::UnauthenticatedError(
        "this server needs an API key: send metadata \"authorization: Bearer "
        "<key>\" or \"x-api-key: <key>\" (kvmem --api_key)");
  }
  // Exactly one credential: the same key repeated is one, two different
  // ones (even one valid and one not) are refused, so a call never has
  // two tenants and which header "wins" never matters.
  for (absl::string_view k : offered) {
    if (k != offered[0]) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the call carries ", offered.size(),
          " different credentials (authorization and x-api-key metadata); "
          "send exactly one"));
    }
  }
  // Every key is compared, so the time taken does not tell which matched.
  const std::string* found = nullptr;
  for (const auto& [key, tenant] : keys_) {
    if (ConstantTimeEqual(offered[0], key)) found = &tenant;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError("the API key is not valid");
  }
  return *found;
}

std::string Tenancy::EngineId(const std::string& tenant,
                              const std::string& id) const {
  return enabled() ? absl::StrCat(tenant, "/", id) : id;
}

std::optional<std::string> Tenancy::ClientId(
    const std::string& tenant, const std::string& engine_id) const {
  if (!enabled()) return engine_id;
  absl::string_view id = engine_id;
  if (!absl::ConsumePrefix(&id, absl::StrCat(tenant, "/"))) {
    return std::nullopt;
  }
  return std::string(id);
}

absl::Status Tenancy::Scrub(const std::string& tenant,
                            const absl::Status& s) const {
  if (!enabled() || s.ok()) return s;
  absl::Status out(
      s.code(), absl::StrReplaceAll(s.message(),
                                    {{absl::StrCat("\"", tenant, "/"), "\""}}));
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

Admission::Admission(const Tenancy* tenancy, MemoryEngine* engine,
                     Limits limits)
    : tenancy_(tenancy),
      engine_(engine),
      limits_(limits),
      shares_(tenancy->enabled() ? std::max<size_t>(1, tenancy->tenants())
                                 : 1) {}

uint64_t Admission::Share(uint64_t limit) const {
  return limit == 0 ? 0 : std::max<uint64_t>(1, limit / shares_);
}

Admission::TenantUse& Admission::Use(const std::string& tenant) const {
  return use_[tenant];
}

uint64_t Admission::RetainedBytes(const std::string& prefix) const {
  uint64_t held = 0;
  for (const auto& s : engine_->StreamsWithPrefix(prefix)) {
    held += s.RetainedBytes();
  }
  return held;
}

absl::Status Admission::AdmitNewStream(const std::string& tenant) const {
  if (limits_.max_streams_per_tenant == 0) return absl::OkStatus();
  const size_t n =
      engine_->StreamsWithPrefix(tenancy_->EngineId(tenant, "")).size();
  if (n >= limits_.max_streams_per_tenant) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the tenant has ", n, " streams; the server allows ",
                     limits_.max_streams_per_tenant,
                     " (--max_streams_per_tenant): delete one first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Admission::Reservation> Admission::AdmitBytes(
    const std::string& tenant, const StreamHandle& stream,
    uint64_t bytes) const {
  auto over = [&](const char* what, uint64_t held, uint64_t limit,
                  const char* flag) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " retains ", held,
        " bytes (payload, its blocks' signals in RAM, frames being received) "
        "and this frame adds ",
        bytes, "; the server allows ", limit, " (", flag,
        "): set (or lower) tier_policy.storage_cap_bytes so old blocks and "
        "their signals are evicted, or "
        "delete streams"));
  };
  const std::string prefix = tenancy_->EngineId(tenant, "");
  // The tenant's limit on retained bytes: its own, and its share of the
  // server's (the server's total is never reported to a tenant).
  uint64_t tenant_limit = 0;
  const char* tenant_flag = "--max_tenant_bytes";
  if (limits_.max_tenant_bytes > 0 && tenancy_->enabled()) {
    tenant_limit = limits_.max_tenant_bytes;
  }
  const uint64_t total_share = Share(limits_.max_total_bytes);
  if (total_share > 0 && (tenant_limit == 0 || total_share < tenant_limit)) {
    tenant_limit = total_share;
    tenant_flag = tenancy_->enabled()
                      ? "its share of --max_total_bytes, split among tenants"
                      : "--max_total_bytes";
  }
  const uint64_t frames_share = Share(limits_.max_frame_bytes_in_flight);
  kvmem::MutexLock lock(&mu_);
  TenantUse& use = Use(tenant);
  // One frame is always admitted (its size is bounded by the geometry's
  // 1 GiB cap): a share smaller than a frame must not refuse it for ever.
  if (frames_share > 0 && use.reserved > 0 &&
      use.reserved + bytes > frames_share) {
    return absl::ResourceExhaustedError(absl::StrCat(
        use.reserved, " bytes of frames are being received for ",
        tenancy_->enabled() ? "the tenant" : "the server",
        " and this frame needs ", bytes, "; ", frames_share,
        tenancy_->enabled() ? " are its share of --max_frame_bytes_in_flight"
                            : " are allowed (--max_frame_bytes_in_flight)",
        ": finish or cancel the frames in flight, or retry with backoff"));
  }
  uint64_t& stream_reserved = stream_reserved_[stream.id()];
  if (limits_.max_stream_bytes > 0) {
    const uint64_t held = stream.RetainedBytes() + stream_reserved;
    if (held + bytes > limits_.max_stream_bytes) {
      if (stream_reserved == 0) stream_reserved_.erase(stream.id());
      return over("the stream", held, limits_.max_stream_bytes,
                  "--max_stream_bytes");
    }
  }
  if (tenant_limit > 0) {
    const uint64_t held = RetainedBytes(prefix) + use.reserved;
    if (held + bytes > tenant_limit) {
      if (stream_reserved == 0) stream_reserved_.erase(stream.id());
      return over(tenancy_->enabled() ? "the tenant" : "the server", held,
                  tenant_limit, tenant_flag);
    }
  }
  use.reserved += bytes;
  reserved_ += bytes;
  stream_reserved += bytes;
  return Reservation(static_cast<void*>(nullptr),
                     [this, tenant, id = stream.id(), bytes](void*) {
                       kvmem::MutexLock l(&mu_);
                       Use(tenant).reserved -= bytes;
                       reserved_ -= bytes;
                       auto it = stream_reserved_.find(id);
                       if ((it->second -= bytes) == 0) {
                         stream_reserved_.erase(it);
                       }
                     });
}

Admission::Reservation Admission::HoldResponseBytes(const std::string& tenant,
                                                    uint64_t bytes) const {
  kvmem::MutexLock lock(&mu_);
  Use(tenant).responses += bytes;
  return ResponsesHeld(tenant, bytes);
}

Admission::Reservation Admission::ResponsesHeld(const std::string& tenant,
                                                uint64_t bytes) const {
  return Reservation(static_cast<void*>(nullptr), [this, tenant, bytes](void*) {
    kvmem::MutexLock l(&mu_);
    Use(tenant).responses -= bytes;
  });
}

absl::StatusOr<Admission::Reservation> Admission::ReserveAnswerBytes(
    const std::string& tenant, uint64_t bytes, bool ahead) const {
  const uint64_t share = Share(limits_.max_queued_response_bytes);
  {
    kvmem::MutexLock lock(&mu_);
    const uint64_t held = Use(tenant).responses;
    const uint64_t room = ahead ? share / 2 : share;
    if (share > 0 && held > 0 && held + bytes > room) {
      return absl::ResourceExhaustedError(absl::StrCat(
          tenancy_->enabled() ? "the tenant" : "the server", " holds ", held,
          " bytes of answers not yet written to its clients and the next "
          "block needs ",
          bytes, "; ", share,
          tenancy_->enabled() ? " are its share of --max_queued_response_bytes"
                              : " are allowed (--max_queued_response_bytes)",
          ": read the answers of its other calls first, or fetch fewer "
          "blocks at once"));
    }
    Use(tenant).responses += bytes;  // Checked and taken in one step.
  }
  return ResponsesHeld(tenant, bytes);
}

bool Admission::ResponsesOverShare(const std::string& tenant) const {
  const uint64_t share = Share(limits_.max_queued_response_bytes);
  if (share == 0) return false;
  kvmem::MutexLock lock(&mu_);
  return Use(tenant).responses > share;
}

absl::StatusOr<Admission::Slot> Admission::EnterCall() const {
  kvmem::MutexLock lock(&mu_);
  if (limits_.max_calls_in_flight > 0 &&
      in_flight_ >= limits_.max_calls_in_flight) {
    // Before authentication: with tenants, the caller is told no number.
    return absl::ResourceExhaustedError(
        tenancy_->enabled()
            ? "the server has no room for another call now; retry with "
              "backoff"
            : absl::StrCat(in_flight_,
                           " calls are in flight; the server "
                           "allows ",
                           limits_.max_calls_in_flight,
                           " (--max_calls_in_flight): retry with backoff"));
  }
  ++in_flight_;
  return Slot(static_cast<void*>(nullptr), [this](void*) {
    kvmem::MutexLock l(&mu_);
    --in_flight_;
  });
}

absl::StatusOr<Admission::Slot> Admission::EnterTenantCall(
    const std::string& tenant) const {
  if (!tenancy_->enabled()) return Slot();
  const uint64_t share = Share(limits_.max_calls_in_flight);
  kvmem::MutexLock lock(&mu_);
  TenantUse& use = Use(tenant);
  if (share > 0 && use.calls >= share) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the tenant has ", use.calls,
                     " calls in flight; its share of "
                     "--max_calls_in_flight is ",
                     share, ": retry with backoff"));
  }
  ++use.calls;
  return Slot(static_cast<void*>(nullptr), [this, tenant](void*) {
    kvmem::MutexLock l(&mu_);
    --Use(tenant).calls;
  });
}

absl::StatusOr<Caller> Caller::Enter(const Tenancy* tenancy,
                                     const Admission* admission,
                                     grpc::CallbackServerContext& ctx) {
  absl::StatusOr<Admission::Slot> slot = admission->EnterCall();
  if (!slot.ok()) return slot.status();
  absl::StatusOr<std::string> tenant =
      tenancy->Authenticate(ctx.client_metadata());
  if (!tenant.ok()) return tenant.status();
  absl::StatusOr<Admission::Slot> share = admission->EnterTenantCall(*tenant);
  if (!share.ok()) return share.status();
  return Caller(tenancy, admission, *std::move(tenant), *std::move(slot),
                *std::move(share), &ctx);
}

absl::Status Caller::Scrub(const absl::Status& s) const {
  if (s.ok()) return s;
  // Payloads that become trailing metadata.
  static constexpr std::pair<const char*, const char*> kHeaders[] = {
      {kOwnerPayload, kOwnerHeader}, {kBlocksSentPayload, kBlocksSentHeader}};
  for (uint32_t i = 0; i < std::size(kHeaders); ++i) {
    const auto value = s.GetPayload(kHeaders[i].first);
    const uint32_t bit = uint32_t{1} << i;
    if (value.has_value() && (headers_sent_->fetch_or(bit) & bit) == 0) {
      ctx_->AddTrailingMetadata(kHeaders[i].second, std::string(*value));
    }
  }
  return tenancy_->Scrub(tenant_, s);
}

absl::StatusOr<std::string> Caller::EngineId(
    const std::string& client_id) const {
  KVMEM_RETURN_IF_ERROR(ValidateStreamId(client_id));
  return tenancy_->EngineId(tenant_, client_id);
}

}  // namespace kvmem
