#include "server/service/handlers.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/timing.h"
#include "engine/stream_config.h"
#include "google/protobuf/io/coded_stream.h"
#include "server/service/delivery.h"
#include "server/service/delivery_sinks.h"
#include "server/service/proto_convert.h"
#include "server/service/shm_arenas.h"

namespace kvmem {

absl::Status RunOpen(MemoryEngine* engine, const Caller& caller,
                     const v1::OpenStreamRequest& req,
                     v1::OpenStreamResponse* resp) {
  KVMEM_ASSIGN_OR_RETURN(const std::string id,
                         caller.EngineId(req.stream_id()));
  // New streams count against the tenant's limit; reopening does not. The
  // check and the creation are one step (no two creations pass together).
  kvmem::MutexLock creating(caller.creation_mu());
  absl::StatusOr<StreamHandle> found = engine->Find(id);
  // Another server's stream (or this server's ownership lapsing): say so,
  // whatever the tenant's stream count.
  if (found.status().code() == absl::StatusCode::kUnavailable) {
    return found.status();
  }
  if (!found.ok()) KVMEM_RETURN_IF_ERROR(caller.AdmitNewStream());
  absl::StatusOr<OpenStreamResult> r =
      engine->OpenStream(id, FromProto(req.config()));
  if (!r.ok()) return r.status();
  resp->set_created(r->created);
  ToProto(r->stats, resp->mutable_stats());
  resp->mutable_stats()->set_stream_id(req.stream_id());
  return absl::OkStatus();
}

namespace {

// The recall's answer within max_bytes (0: unchecked), or what it holds
// and what to ask for instead.
absl::Status CheckAnswerSize(const v1::RecallRequest& req,
                             const v1::RecallResponse& resp,
                             uint64_t max_bytes) {
  if (max_bytes == 0) return absl::OkStatus();
  const uint64_t bytes = resp.ByteSizeLong();
  if (bytes <= max_bytes) return absl::OkStatus();
  uint64_t blocks = resp.blocks_size(), offsets = 0;
  for (const v1::RecalledBlock& b : resp.blocks()) {
    offsets += b.token_offsets_size();
  }
  for (const v1::LayerRecallSet& s : resp.layer_sets()) {
    blocks += s.blocks_size();
    for (const v1::RecalledBlock& b : s.blocks()) {
      offsets += b.token_offsets_size();
    }
  }
  const std::string stream =
      req.stream_id().empty()
          ? std::string()
          : absl::StrCat(" on stream \"", req.stream_id(), "\"");
  return absl::ResourceExhaustedError(absl::StrCat(
      "the recall's answer", stream, " is ", bytes, " bytes (",
      std::max(resp.layer_sets_size(), 1), " sets, ", blocks,
      " recalled blocks, ", offsets, " token offsets), over the ", max_bytes,
      " a message may carry (--max_message_bytes): ask for fewer tokens "
      "(budget.max_tokens), ",
      req.per_head() ? "per_layer sets instead of per_head, " : "",
      "or a smaller window_fraction"));
}

}  // namespace

absl::Status RunRecall(MemoryEngine* engine, const std::string& engine_id,
                       const v1::RecallRequest& req, v1::RecallResponse* resp,
                       ServerMetrics* metrics, bool session,
                       uint64_t max_answer_bytes) {
  const auto t0 = SteadyClock::now();
  absl::StatusOr<RecallResult> r = engine->Recall(engine_id, FromProto(req));
  if (metrics != nullptr)
    metrics->ObserveRecall(session, MicrosSince(t0) / 1e6);
  if (!r.ok()) return r.status();
  if (metrics != nullptr) {
    metrics->ObserveTokenScan(r->tokens_scored, r->token_us / 1e6);
  }
  ToProto(*r, resp);
  return CheckAnswerSize(req, *resp, max_answer_bytes);
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

// The sink req.mode names: inline (at most inline_bytes of KV), or the
// caller's shared-memory arena.
absl::StatusOr<std::unique_ptr<DeliverySink>> RecallSink(
    const RecallDeliveryCall& call, const v1::RecallDelivery& req,
    uint64_t inline_bytes) {
  switch (req.mode()) {
    case v1::RecallDelivery::MODE_SHARED_MEMORY:
      if (call.options->shm == nullptr) return NoSharedMemory();
      return std::make_unique<ShmSink>(call.options->shm, call.caller->tenant(),
                                       req.shm_arena_id());
    case v1::RecallDelivery::MODE_INLINE:
      if (req.shm_arena_id() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("delivery.shm_arena_id is ", req.shm_arena_id(),
                         " with delivery.mode MODE_INLINE; an arena needs "
                         "MODE_SHARED_MEMORY"));
      }
      return std::make_unique<InlineSink>(inline_bytes);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("delivery.mode is ", static_cast<int>(req.mode()),
                       "; use MODE_INLINE or MODE_SHARED_MEMORY"));
  }
}

constexpr int kMaxHeldTokenEntries = 4096;

// The client's held tokens per block (req.held_tokens), checked.
absl::StatusOr<absl::flat_hash_map<uint64_t, std::vector<uint32_t>>> HeldTokens(
    const v1::RecallDelivery& req) {
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> held;
  if (req.held_tokens_size() == 0) return held;
  if (!GathersTokens(req.layout())) {
    return absl::InvalidArgumentError(
        "delivery.held_tokens is set; it needs delivery.layout "
        "PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR");
  }
  if (req.held_tokens_size() > kMaxHeldTokenEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("delivery.held_tokens has ", req.held_tokens_size(),
                     " entries; at most ", kMaxHeldTokenEntries));
  }
  for (const v1::BlockTokens& b : req.held_tokens()) {
    std::vector<uint32_t> offsets(b.token_offsets().begin(),
                                  b.token_offsets().end());
    for (size_t i = 1; i < offsets.size(); ++i) {
      if (offsets[i] <= offsets[i - 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("delivery.held_tokens of block ", b.block_id(),
                         " has ", offsets[i], " after ", offsets[i - 1],
                         "; offsets must be strictly increasing"));
      }
    }
    if (!held.emplace(b.block_id(), std::move(offsets)).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "delivery.held_tokens names block ", b.block_id(), " twice"));
    }
  }
  return held;
}

// Each recalled block's chosen tokens over every set of the response, in
// RecalledIds' order: the union of its token_offsets (all token_count
// tokens where a set takes it whole); counts[i]: block i's token_count.
std::vector<std::vector<uint32_t>> RecalledTokens(
    const v1::RecallResponse& resp, const std::vector<uint64_t>& ids,
    std::vector<uint32_t>* counts) {
  absl::flat_hash_map<uint64_t, size_t> index;
  for (size_t i = 0; i < ids.size(); ++i) index[ids[i]] = i;
  std::vector<std::vector<uint32_t>> tokens(ids.size());
  std::vector<bool> whole(ids.size(), false);
  counts->assign(ids.size(), 0);
  auto add =
      [&](const google::protobuf::RepeatedPtrField<v1::RecalledBlock>& blocks) {
        for (const v1::RecalledBlock& b : blocks) {
          const size_t i = index[b.block_id()];
          (*counts)[i] = b.token_count();
          if (whole[i]) continue;
          std::vector<uint32_t>& t = tokens[i];
          if (b.token_offsets().empty()) {
            whole[i] = true;
            t.resize(b.token_count());
            for (uint32_t j = 0; j < b.token_count(); ++j) t[j] = j;
            continue;
          }
          t.insert(t.end(), b.token_offsets().begin(), b.token_offsets().end());
        }
      };
  add(resp.blocks());
  for (const v1::LayerRecallSet& s : resp.layer_sets()) add(s.blocks());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (whole[i]) continue;
    std::sort(tokens[i].begin(), tokens[i].end());
    tokens[i].erase(std::unique(tokens[i].begin(), tokens[i].end()),
                    tokens[i].end());
  }
  return tokens;
}

// The bytes `blocks` delivered blocks' descriptors add to an answer: a
// DeliveredBlock each (its tag and length, block id, and a region or the
// data field's tag and length, the offsets' tag and length: at most 58
// bytes) and, gathering tokens, their offsets' varints (`described`).
uint64_t DescriptorBytes(size_t blocks,
                         const std::vector<std::vector<uint32_t>>& described) {
  uint64_t bytes = 58 * uint64_t{blocks};
  for (const std::vector<uint32_t>& offsets : described) {
    for (uint32_t t : offsets) {
      bytes += google::protobuf::io::CodedOutputStream::VarintSize32(t);
    }
  }
  return bytes;
}

// The KV bytes inline delivery may add to a recall's answer `resp` beside
// `described` bytes of descriptors (and 64 for delivered_bytes and
// held_blocks), or RESOURCE_EXHAUSTED when those alone may not fit.
absl::StatusOr<uint64_t> InlineRoom(const ServiceOptions& o,
                                    const v1::RecallResponse& resp,
                                    size_t blocks, uint64_t described) {
  if (o.max_answer_bytes == 0) return o.max_inline_bytes;
  const uint64_t need = resp.ByteSizeLong() + described + 64;
  if (need > o.max_answer_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the recall's answer with its ", blocks, " blocks delivered needs ",
        need, " bytes before their KV, over the ", o.max_answer_bytes,
        " a message may carry (--max_message_bytes): ask for fewer tokens "
        "(budget.max_tokens), or fetch the blocks with FetchBlocks"));
  }
  return std::min(o.max_inline_bytes, o.max_answer_bytes - need);
}

// Fills resp->delivered for a recall made with req.delivery.
absl::Status DeliverRecall(const RecallDeliveryCall& call,
                           const StreamHandle& stream,
                           const v1::RecallDelivery& req,
                           v1::RecallResponse* resp) {
  DeliveryRequest d;
  d.stream = &stream;
  KVMEM_ASSIGN_OR_RETURN(
      d.layout, LayoutFromProto(req.layout(), req.layers_size(), "delivery."));
  d.layers.assign(req.layers().begin(), req.layers().end());
  KVMEM_RETURN_IF_ERROR(
      ValidateLayerList(stream.config().geometry, d.layers, "delivery.layers"));
  d.executor = call.executor;
  d.helpers = call.options->copy_helpers;
  KVMEM_ASSIGN_OR_RETURN(const auto held_tokens, HeldTokens(req));
  const std::vector<uint64_t> ids = RecalledIds(*resp);
  const absl::flat_hash_set<uint64_t> held(req.held_block_ids().begin(),
                                           req.held_block_ids().end());
  const bool gather = GathersTokens(req.layout());
  std::vector<std::vector<uint32_t>> chosen;
  std::vector<uint32_t> counts;
  if (gather) chosen = RecalledTokens(*resp, ids, &counts);
  std::vector<std::vector<uint32_t>> described;  // Token layout: each's.
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<uint32_t> missing;
    if (gather && !held.contains(ids[i])) {
      auto h = held_tokens.find(ids[i]);
      if (h == held_tokens.end()) {
        missing = std::move(chosen[i]);
      } else {
        // Held offsets of a recalled block are checked against it (those
        // of other blocks are ignored, as held_block_ids' are).
        KVMEM_RETURN_IF_ERROR(ValidateTokenList(h->second, counts[i], ids[i],
                                                "delivery.held_tokens"));
        std::set_difference(chosen[i].begin(), chosen[i].end(),
                            h->second.begin(), h->second.end(),
                            std::back_inserter(missing));
      }
    }
    if (held.contains(ids[i]) || (gather && missing.empty())) {
      resp->set_held_blocks(resp->held_blocks() + 1);
      continue;
    }
    d.block_ids.push_back(ids[i]);
    if (gather) {
      d.tokens.push_back(missing);
      described.push_back(std::move(missing));
    }
  }
  KVMEM_ASSIGN_OR_RETURN(
      const uint64_t inline_bytes,
      InlineRoom(*call.options, *resp, d.block_ids.size(),
                 DescriptorBytes(d.block_ids.size(), described)));
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<DeliverySink> sink,
                         RecallSink(call, req, inline_bytes));
  KVMEM_ASSIGN_OR_RETURN(const Delivered delivered, Deliver(d, sink.get()));
  for (size_t i = 0; i < d.block_ids.size(); ++i) {
    v1::DeliveredBlock* out = resp->add_delivered();
    out->set_block_id(d.block_ids[i]);
    sink->Describe(i, out);
    if (gather) {
      out->mutable_token_offsets()->Assign(described[i].begin(),
                                           described[i].end());
    }
  }
  resp->set_delivered_bytes(delivered.bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRecallDelivering(const RecallDeliveryCall& call,
                                 const v1::RecallRequest& req,
                                 v1::RecallResponse* resp) {
  if (req.delivery().mode() == v1::RecallDelivery::MODE_SHARED_MEMORY) {
    const auto& ids = req.delivery().release_lease_ids();
    KVMEM_RETURN_IF_ERROR(ReleaseNamedLeases(
        call.options->shm, call.caller->tenant(), req.delivery().shm_arena_id(),
        absl::MakeConstSpan(ids.data(), ids.size()),
        "delivery.release_lease_ids"));
  }
  if (!call.engine_id.ok()) return call.engine_id.status();
  KVMEM_RETURN_IF_ERROR(RunRecall(call.engine, *call.engine_id, req, resp,
                                  call.options->metrics, call.session,
                                  call.options->max_answer_bytes));
  if (!Delivers(req)) return absl::OkStatus();
  KVMEM_ASSIGN_OR_RETURN(const StreamHandle stream,
                         call.engine->Find(*call.engine_id));
  return DeliverRecall(call, stream, req.delivery(), resp);
}

}  // namespace kvmem
