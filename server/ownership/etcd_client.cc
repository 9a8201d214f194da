#include "server/ownership/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace kvmem {
namespace {

namespace pb = etcdserverpb;

// One member's stubs.
struct Member {
  std::string endpoint;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
};

class GrpcEtcdClient final : public EtcdClient {
 public:
  GrpcEtcdClient(EtcdOptions options, std::vector<Member> members)
      : options_(std::move(options)), members_(std::move(members)) {}

  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override {
    pb::LeaseGrantRequest req;
    req.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
    pb::LeaseGrantResponse resp;
    std::string on;
    KVMEM_RETURN_IF_ERROR(Call(
        "LeaseGrant",
        [&](Member& m, grpc::ClientContext* ctx) {
          return m.lease->LeaseGrant(ctx, req, &resp);
        },
        &on));
    if (!resp.error().empty()) {
      return absl::UnavailableError(
          absl::StrCat("etcd ", on, ": LeaseGrant: ", resp.error()));
    }
    return resp.id();
  }

  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) override {
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    pb::LeaseKeepAliveResponse resp;
    bool exchanged = false;
    std::string on;
    KVMEM_RETURN_IF_ERROR(Call(
        "LeaseKeepAlive",
        [&](Member& m, grpc::ClientContext* ctx) {
          auto stream = m.lease->LeaseKeepAlive(ctx);
          exchanged =
              stream->Write(req) && stream->WritesDone() && stream->Read(&resp);
          return stream->Finish();
        },
        &on));
    if (!exchanged) {
      return absl::UnavailableError(
          absl::StrCat("etcd ", on, ": LeaseKeepAlive got no answer"));
    }
    if (resp.ttl() <= 0) {
      return absl::NotFoundError(
          absl::StrCat("etcd lease ", lease, " has expired or was revoked"));
    }
    return absl::Seconds(resp.ttl());
  }

  absl::Status RevokeLease(int64_t lease) override {
    pb::LeaseRevokeRequest req;
    req.set_id(lease);
    pb::LeaseRevokeResponse resp;
    return Call("LeaseRevoke", [&](Member& m, grpc::ClientContext* ctx) {
      return m.lease->LeaseRevoke(ctx, req, &resp);
    });
  }

  absl::StatusOr<EtcdHolder> CreateIfAbsent(const std::string& key,
                                            const std::string& value,
                                            int64_t lease) override {
    pb::TxnRequest req;
    pb::Compare* absent = req.add_compare();
    absent->set_result(pb::Compare::EQUAL);
    absent->set_target(pb::Compare::CREATE);
    absent->set_key(key);
    absent->set_create_revision(0);
    pb::PutRequest* put = req.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    put->set_lease(lease);
    req.add_success()->mutable_request_range()->set_key(key);
    req.add_failure()->mutable_request_range()->set_key(key);
    pb::TxnResponse resp;
    std::string on;
    // Tried again on another member after a failure, the transaction finds
    // the key this one created, if the first made it: the same holding.
    KVMEM_RETURN_IF_ERROR(Call(
        "Txn",
        [&](Member& m, grpc::ClientContext* ctx) {
          return m.kv->Txn(ctx, req, &resp);
        },
        &on));
    for (const pb::ResponseOp& op : resp.responses()) {
      if (op.has_response_range() && op.response_range().kvs_size() > 0) {
        return Holder(op.response_range().kvs(0));
      }
    }
    return absl::AbortedError(absl::StrCat(
        "etcd ", on, ": key ", key,
        " vanished within its own transaction (its lease expired?)"));
  }

  absl::StatusOr<std::optional<EtcdHolder>> Get(
      const std::string& key) override {
    pb::RangeRequest req;
    req.set_key(key);
    pb::RangeResponse resp;
    KVMEM_RETURN_IF_ERROR(
        Call("Range", [&](Member& m, grpc::ClientContext* ctx) {
          return m.kv->Range(ctx, req, &resp);
        }));
    if (resp.kvs_size() == 0) return std::optional<EtcdHolder>();
    return std::optional<EtcdHolder>(Holder(resp.kvs(0)));
  }

  absl::Status DeleteIfHeld(const std::string& key, int64_t lease) override {
    pb::TxnRequest req;
    pb::Compare* held = req.add_compare();
    held->set_result(pb::Compare::EQUAL);
    held->set_target(pb::Compare::LEASE);
    held->set_key(key);
    held->set_lease(lease);
    req.add_success()->mutable_request_delete_range()->set_key(key);
    pb::TxnResponse resp;
    return Call("Txn", [&](Member& m, grpc::ClientContext* ctx) {
      return m.kv->Txn(ctx, req, &resp);
    });
  }

  std::string member() const override {
    return members_[current_.load()].endpoint;
  }

 private:
  using Attempt = std::function<grpc::Status(Member&, grpc::ClientContext*)>;

  // Runs `attempt` on the member in use, each with its own deadline. A
  // member that cannot be reached (UNAVAILABLE: refused, down, without a
  // leader) passes the call on to the next, each member tried once; one
  // that did not answer in time (DEADLINE_EXCEEDED: paused, partitioned)
  // ends the call, and the next call starts at the next member. Other
  // failures are etcd's answer and end the call. *on: the member that
  // answered (or failed last).
  absl::Status Call(const char* name, const Attempt& attempt,
                    std::string* on = nullptr) {
    const size_t n = members_.size();
    const size_t first = current_.load();
    std::string failures;  // Each member's, when several failed.
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (first + k) % n;
      Member& m = members_[i];
      if (on != nullptr) *on = m.endpoint;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options_.call_timeout));
      // A member without a leader (an election under way, or cut off from
      // the quorum) answers UNAVAILABLE at once instead of holding the call
      // (etcd's require-leader metadata, as clientv3.WithRequireLeader).
      ctx.AddMetadata("hasleader", "true");
      const grpc::Status st = attempt(m, &ctx);
      if (st.ok()) {
        Use(first, i);
        return absl::OkStatus();
      }
      absl::StrAppend(&failures, k > 0 ? "; " : "", m.endpoint, ": ",
                      st.error_message());
      const bool next =
          st.error_code() == grpc::StatusCode::UNAVAILABLE && k + 1 < n;
      if (next) continue;
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
          st.error_code() == grpc::StatusCode::UNAVAILABLE) {
        Use(first, (i + 1) % n);
      }
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                          k == 0 ? absl::StrCat("etcd ", m.endpoint, ": ", name,
                                                ": ", st.error_message())
                                 : absl::StrCat("etcd ", name, " failed on ",
                                                k + 1, " members: ", failures));
    }
    return absl::InternalError("etcd: no members");  // Connect refuses.
  }

  // Moves the member in use from `from` to `to`, unless another call moved
  // it meanwhile.
  void Use(size_t from, size_t to) {
    size_t expected = from;
    current_.compare_exchange_strong(expected, to);
  }

  static EtcdHolder Holder(const mvccpb::KeyValue& kv) {
    return EtcdHolder{kv.value(), kv.lease(), kv.create_revision()};
  }

  const EtcdOptions options_;
  std::vector<Member> members_;
  std::atomic<size_t> current_{0};
};

}  // namespace

absl::StatusOr<std::vector<std::string>> EtcdMembers(
    const std::string& endpoints) {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("etcd endpoint is empty");
  }
  std::vector<std::string> members;
  for (absl::string_view e : absl::StrSplit(endpoints, ',')) {
    e = absl::StripAsciiWhitespace(e);
    if (e.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoints \"", endpoints, "\" name an empty member"));
    }
    if (std::find(members.begin(), members.end(), e) != members.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoints \"", endpoints, "\" name ", e, " twice"));
    }
    members.emplace_back(e);
  }
  if (members.size() > kMaxEtcdMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoints \"", endpoints, "\" name ", members.size(),
                     " members; at most ", kMaxEtcdMembers));
  }
  return members;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const EtcdOptions& options) {
  KVMEM_ASSIGN_OR_RETURN(const std::vector<std::string> endpoints,
                         EtcdMembers(options.endpoint));
  grpc::ChannelArguments args;
  // Pings on an idle connection too: a paused or partitioned etcd leader
  // fails calls instead of leaving them on a half-open connection.
  args.SetInt(
      GRPC_ARG_KEEPALIVE_TIME_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  args.SetInt(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.call_timeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::vector<Member> members;
  for (const std::string& e : endpoints) {
    auto channel =
        grpc::CreateCustomChannel(e, grpc::InsecureChannelCredentials(), args);
    members.push_back(
        {e, pb::KV::NewStub(channel), pb::Lease::NewStub(channel)});
  }
  return std::unique_ptr<EtcdClient>(
      std::make_unique<GrpcEtcdClient>(options, std::move(members)));
}

}  // namespace kvmem
