#include "server/tenancy.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/status_macros.h"
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

size_t Tenancy::tenants() const {
  std::set<std::string> names;
  for (const auto& [key, tenant] : keys_) names.insert(tenant);
  return names.size();
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
  // Every key is compared, so the time taken does not tell which matched.
  const std::string* found = nullptr;
  for (absl::string_view k : offered) {
    for (const auto& [key, tenant] : keys_) {
      if (ConstantTimeEqual(k, key)) found = &tenant;
    }
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
  return absl::Status(
      s.code(), absl::StrReplaceAll(s.message(),
                                    {{absl::StrCat("\"", tenant, "/"), "\""}}));
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

absl::Status Admission::AdmitBytes(const std::string& tenant,
                                   const Stream& stream, uint64_t bytes) const {
  auto over = [&](const char* what, uint64_t held, uint64_t limit,
                  const char* flag) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " retains ", held, " payload bytes and this frame adds ", bytes,
        "; the server allows ", limit, " (", flag,
        "): set tier_policy.storage_cap_bytes so old blocks are evicted, or "
        "delete streams"));
  };
  if (limits_.max_stream_bytes > 0) {
    const uint64_t held = stream.RetainedPayloadBytes();
    if (held + bytes > limits_.max_stream_bytes) {
      return over("the stream", held, limits_.max_stream_bytes,
                  "--max_stream_bytes");
    }
  }
  if (limits_.max_tenant_bytes > 0 && tenancy_->enabled()) {
    uint64_t held = 0;
    for (const auto& s :
         engine_->StreamsWithPrefix(tenancy_->EngineId(tenant, ""))) {
      held += s->RetainedPayloadBytes();
    }
    if (held + bytes > limits_.max_tenant_bytes) {
      return over("the tenant", held, limits_.max_tenant_bytes,
                  "--max_tenant_bytes");
    }
  }
  if (limits_.max_total_bytes > 0) {
    uint64_t held = 0;
    for (const auto& s : engine_->StreamsWithPrefix("")) {
      held += s->RetainedPayloadBytes();
    }
    if (held + bytes > limits_.max_total_bytes) {
      return over("the server", held, limits_.max_total_bytes,
                  "--max_total_bytes");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Admission::Slot> Admission::EnterCall() const {
  const uint32_t now = in_flight_.fetch_add(1) + 1;
  Slot slot(this);
  if (limits_.max_calls_in_flight > 0 && now > limits_.max_calls_in_flight) {
    return absl::ResourceExhaustedError(
        absl::StrCat(now - 1, " calls are in flight; the server allows ",
                     limits_.max_calls_in_flight,
                     " (--max_calls_in_flight): retry with backoff"));
  }
  return slot;
}

absl::StatusOr<Caller> Caller::Enter(const Tenancy* tenancy,
                                     const Admission* admission,
                                     const grpc::CallbackServerContext& ctx) {
  absl::StatusOr<Admission::Slot> slot = admission->EnterCall();
  if (!slot.ok()) return slot.status();
  absl::StatusOr<std::string> tenant =
      tenancy->Authenticate(ctx.client_metadata());
  if (!tenant.ok()) return tenant.status();
  return Caller(tenancy, admission, *std::move(tenant),
                std::make_shared<Admission::Slot>(*std::move(slot)));
}

absl::StatusOr<std::string> Caller::EngineId(
    const std::string& client_id) const {
  KVMEM_RETURN_IF_ERROR(ValidateStreamId(client_id));
  return tenancy_->EngineId(tenant_, client_id);
}

}  // namespace kvmem
