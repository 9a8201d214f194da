#include "server/service/handlers.h"

#include <chrono>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/timing.h"
#include "server/service/delivery.h"
#include "server/service/delivery_sinks.h"
#include "server/service/proto_convert.h"

namespace kvmem {

absl::Status RunOpen(MemoryEngine* engine, const Caller& caller,
                     const v1::OpenStreamRequest& req,
                     v1::OpenStreamResponse* resp) {
  KVMEM_ASSIGN_OR_RETURN(const std::string id,
                         caller.EngineId(req.stream_id()));
  // New streams count against the tenant's limit; reopening does not. The
  // check and the creation are one step (no two creations pass together).
  kvmem::MutexLock creating(caller.creation_mu());
  if (!engine->Find(id).ok()) KVMEM_RETURN_IF_ERROR(caller.AdmitNewStream());
  absl::StatusOr<OpenStreamResult> r =
      engine->OpenStream(id, FromProto(req.config()));
  if (!r.ok()) return r.status();
  resp->set_created(r->created);
  ToProto(r->stats, resp->mutable_stats());
  resp->mutable_stats()->set_stream_id(req.stream_id());
  return absl::OkStatus();
}

absl::Status RunRecall(MemoryEngine* engine, const std::string& engine_id,
                       const v1::RecallRequest& req, v1::RecallResponse* resp,
                       ServerMetrics* metrics, bool session) {
  const auto t0 = SteadyClock::now();
  absl::StatusOr<RecallResult> r = engine->Recall(engine_id, FromProto(req));
  if (metrics != nullptr)
    metrics->ObserveRecall(session, MicrosSince(t0) / 1e6);
  if (!r.ok()) return r.status();
  if (metrics != nullptr) {
    metrics->ObserveTokenScan(r->tokens_scored, r->token_us / 1e6);
  }
  ToProto(*r, resp);
  return absl::OkStatus();
}

bool Delivers(const v1::RecallRequest& req) {
  return req.delivery().mode() != v1::RecallDelivery::MODE_UNSPECIFIED;
}

namespace {

// The blocks of a recall response (all its sets), each once, in order.
std::vector<uint64_t> RecalledIds(const v1::RecallResponse& resp) {
  std::vector<uint64_t> ids;
  absl::flat_hash_set<uint64_t> seen;
  auto add =
      [&](const google::protobuf::RepeatedPtrField<v1::RecalledBlock>& blocks) {
        for (const v1::RecalledBlock& b : blocks) {
          if (seen.insert(b.block_id()).second) ids.push_back(b.block_id());
        }
      };
  add(resp.blocks());
  for (const v1::LayerRecallSet& s : resp.layer_sets()) add(s.blocks());
  return ids;
}

// The sink req.mode names: inline, or the caller's shared-memory arena.
absl::StatusOr<std::unique_ptr<DeliverySink>> RecallSink(
    const RecallDeliveryCall& call, const v1::RecallDelivery& req) {
  switch (req.mode()) {
    case v1::RecallDelivery::MODE_SHARED_MEMORY:
      if (call.options->shm == nullptr) return NoSharedMemory();
      return std::make_unique<ShmSink>(
          call.options->shm, call.caller->tenant(), req.shm_arena_id(),
          std::vector<uint64_t>(req.release_lease_ids().begin(),
                                req.release_lease_ids().end()));
    case v1::RecallDelivery::MODE_INLINE:
      if (req.shm_arena_id() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("delivery.shm_arena_id is ", req.shm_arena_id(),
                         " with delivery.mode MODE_INLINE; an arena needs "
                         "MODE_SHARED_MEMORY"));
      }
      return std::make_unique<InlineSink>(call.options->max_inline_bytes);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("delivery.mode is ", static_cast<int>(req.mode()),
                       "; use MODE_INLINE or MODE_SHARED_MEMORY"));
  }
}

// Fills resp->delivered for a recall made with req.delivery.
absl::Status DeliverRecall(const RecallDeliveryCall& call,
                           const StreamHandle& stream,
                           const v1::RecallDelivery& req,
                           v1::RecallResponse* resp) {
  DeliveryRequest d;
  d.stream = &stream;
  KVMEM_ASSIGN_OR_RETURN(d.layout,
                         LayoutFromProto(req.layout(), req.layers_size()));
  d.layers.assign(req.layers().begin(), req.layers().end());
  d.executor = call.executor;
  d.helpers = call.options->copy_helpers;
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<DeliverySink> sink,
                         RecallSink(call, req));
  const absl::flat_hash_set<uint64_t> held(req.held_block_ids().begin(),
                                           req.held_block_ids().end());
  for (uint64_t id : RecalledIds(*resp)) {
    if (held.contains(id)) {
      resp->set_held_blocks(resp->held_blocks() + 1);
    } else {
      d.block_ids.push_back(id);
    }
  }
  KVMEM_ASSIGN_OR_RETURN(const Delivered delivered, Deliver(d, sink.get()));
  for (size_t i = 0; i < d.block_ids.size(); ++i) {
    v1::DeliveredBlock* out = resp->add_delivered();
    out->set_block_id(d.block_ids[i]);
    sink->Describe(i, out);
  }
  resp->set_delivered_bytes(delivered.bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRecallDelivering(const RecallDeliveryCall& call,
                                 const v1::RecallRequest& req,
                                 v1::RecallResponse* resp) {
  KVMEM_RETURN_IF_ERROR(RunRecall(call.engine, call.engine_id, req, resp,
                                  call.options->metrics, call.session));
  if (!Delivers(req)) return absl::OkStatus();
  KVMEM_ASSIGN_OR_RETURN(const StreamHandle stream,
                         call.engine->Find(call.engine_id));
  return DeliverRecall(call, stream, req.delivery(), resp);
}

}  // namespace kvmem
