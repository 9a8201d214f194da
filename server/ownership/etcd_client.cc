#include "server/ownership/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace kvmem {
namespace {

namespace pb = etcdserverpb;

// Returns the call's failure as a status naming etcd and the call.
#define KVMEM_ETCD_CALL(call, name)                                  \
  do {                                                               \
    const grpc::Status kvmem_etcd_st_ = (call);                      \
    if (!kvmem_etcd_st_.ok()) return FromGrpc(kvmem_etcd_st_, name); \
  } while (0)

class GrpcEtcdClient final : public EtcdClient {
 public:
  GrpcEtcdClient(EtcdOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        kv_(pb::KV::NewStub(channel)),
        lease_(pb::Lease::NewStub(channel)) {}

  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override {
    pb::LeaseGrantRequest req;
    req.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
    pb::LeaseGrantResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    KVMEM_ETCD_CALL(lease_->LeaseGrant(&ctx, req, &resp), "LeaseGrant");
    if (!resp.error().empty()) {
      return absl::UnavailableError(absl::StrCat(
          "etcd ", options_.endpoint, ": LeaseGrant: ", resp.error()));
    }
    return resp.id();
  }

  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) override {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    auto stream = lease_->LeaseKeepAlive(&ctx);
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    pb::LeaseKeepAliveResponse resp;
    const bool exchanged =
        stream->Write(req) && stream->WritesDone() && stream->Read(&resp);
    const grpc::Status st = stream->Finish();
    if (!st.ok()) return FromGrpc(st, "LeaseKeepAlive");
    if (!exchanged) {
      return absl::UnavailableError(absl::StrCat(
          "etcd ", options_.endpoint, ": LeaseKeepAlive got no answer"));
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
    grpc::ClientContext ctx;
    Deadline(&ctx);
    const grpc::Status st = lease_->LeaseRevoke(&ctx, req, &resp);
    return st.ok() ? absl::OkStatus() : FromGrpc(st, "LeaseRevoke");
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
    grpc::ClientContext ctx;
    Deadline(&ctx);
    KVMEM_ETCD_CALL(kv_->Txn(&ctx, req, &resp), "Txn");
    for (const pb::ResponseOp& op : resp.responses()) {
      if (op.has_response_range() && op.response_range().kvs_size() > 0) {
        return Holder(op.response_range().kvs(0));
      }
    }
    return absl::AbortedError(absl::StrCat(
        "etcd ", options_.endpoint, ": key ", key,
        " vanished within its own transaction (its lease expired?)"));
  }

  absl::StatusOr<std::optional<EtcdHolder>> Get(
      const std::string& key) override {
    pb::RangeRequest req;
    req.set_key(key);
    pb::RangeResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    KVMEM_ETCD_CALL(kv_->Range(&ctx, req, &resp), "Range");
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
    grpc::ClientContext ctx;
    Deadline(&ctx);
    const grpc::Status st = kv_->Txn(&ctx, req, &resp);
    return st.ok() ? absl::OkStatus() : FromGrpc(st, "Txn");
  }

 private:
  void Deadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.call_timeout));
  }

  absl::Status FromGrpc(const grpc::Status& st, const char* call) const {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("etcd ", options_.endpoint, ": ", call,
                                     ": ", st.error_message()));
  }

  static EtcdHolder Holder(const mvccpb::KeyValue& kv) {
    return EtcdHolder{kv.value(), kv.lease(), kv.create_revision()};
  }

  const EtcdOptions options_;
  std::unique_ptr<pb::KV::Stub> kv_;
  std::unique_ptr<pb::Lease::Stub> lease_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const EtcdOptions& options) {
  if (options.endpoint.empty()) {
    return absl::InvalidArgumentError("etcd endpoint is empty");
  }
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
  auto channel = grpc::CreateCustomChannel(
      options.endpoint, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<EtcdClient>(
      std::make_unique<GrpcEtcdClient>(options, std::move(channel)));
}

}  // namespace kvmem
