// The kvmem policies of `kvmem eval`: the real engine, in process or behind a
// kvmem-server, queried as a front end would (eval_policies.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "engine/index/dot.h"
#include "engine/memory_engine.h"
#include "server/service/proto_convert.h"
#include "storage/rocks_cold_store.h"
#include "tools/eval/eval_policies.h"

namespace kvmem {

std::vector<float> WindowLogSumExp(
    const std::vector<std::vector<float>>& q_vectors, const CameraTokens& cam,
    uint64_t window_start, uint32_t head_dim) {
  const size_t heads = cam.per_token / head_dim;
  const uint64_t sinks = std::min<uint64_t>(cam.sink_tokens, cam.tokens);
  const float inv = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> out;
  std::vector<float> logit;
  for (const std::vector<float>& q : q_vectors) {
    for (size_t h = 0; h < heads; ++h) {
      logit.clear();
      auto add = [&](uint64_t i) {
        logit.push_back(inv *
                        Dot(q.data() + h * head_dim,
                            cam.keys.data() + i * cam.per_token + h * head_dim,
                            head_dim));
      };
      for (uint64_t i = 0; i < sinks; ++i) add(i);
      for (uint64_t i = std::max(window_start, sinks); i < cam.tokens; ++i) {
        add(i);
      }
      const float mx = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (float x : logit) sum += std::exp(static_cast<double>(x - mx));
      out.push_back(mx + static_cast<float>(std::log(sum)));
    }
  }
  return out;
}

namespace {

class KvmemPolicy : public EvalPolicy {
 public:
  KvmemPolicy(std::string name, const PolicyBudget& b, KvmemBackend* backend,
              std::string id, const KvmemRequestOptions& request)
      : name_(std::move(name)),
        b_(b),
        backend_(backend),
        id_(std::move(id)),
        request_(request) {}
  const char* name() const override { return name_.c_str(); }
  absl::Status OnFrame(const WorkloadFrame& frame,
                       const CameraTokens&) override {
    absl::Status s = backend_->Append(id_, frame.frame);
    if (!s.ok()) return s;
    // Stats are sampled every few frames: they scan the stream's blocks.
    if (frame.frame.header.frame_index() % 8 == 0) {
      v1::StreamStats st;
      s = backend_->Stats(id_, &st);
      if (!s.ok()) return s;
      stored_ = st.warm().bytes() + st.cold().bytes() + st.degraded().bytes() +
                st.summary_bytes();
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery& q, const CameraTokens& cam,
                      const QueryOracle&, Selection* out) override {
    v1::RecallRequest req;
    req.set_stream_id(id_);
    const std::vector<std::vector<float>> vectors =
        request_.query_heads ? q.q_heads : std::vector<std::vector<float>>{q.q};
    for (const auto& v : vectors) {
      req.mutable_query()->Add(v.begin(), v.end());
    }
    const uint64_t ws = b_.WindowStart(cam.tokens);
    if (request_.window_lse) {
      const std::vector<float> lse =
          WindowLogSumExp(vectors, cam, ws, request_.head_dim);
      *req.mutable_window_lse() = {lse.begin(), lse.end()};
    }
    if (request_.send_budget) req.mutable_budget()->set_max_tokens(b_.recall);
    req.set_per_head(request_.per_head);
    req.mutable_budget()->set_top_k(request_.top_k);
    *req.mutable_signals() = q.signals;
    v1::RecallResponse resp;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = backend_->Recall(id_, req, &resp);
    if (!s.ok()) return s;
    out->latency_us = std::chrono::duration<float, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
    const uint64_t lo = cam.sink_tokens;
    const float sets =
        std::max<float>(1.0f, static_cast<float>(resp.layer_sets_size()));
    out->query_tokens = resp.channels().query_tokens() / sets;
    out->track_tokens = resp.channels().track_tokens() / sets;
    if (request_.per_head) return PerHeadSets(resp, cam, ws, out);
    std::vector<Span> spans;
    for (const v1::RecalledBlock& blk : resp.blocks()) {
      const Span whole{blk.first_token_position(), blk.end_token_position()};
      out->units.push_back(whole);
      out->degraded_blocks += blk.degraded();
      out->unit_gates.push_back(blk.gate_weight());
      std::vector<Span> mine;
      if (blk.token_offsets().empty()) {
        mine.push_back(whole);
      } else {
        // Offsets are in append order; the workload's positions have no
        // gaps.
        if (whole.size() != blk.token_count()) {
          return absl::InternalError(absl::StrCat(
              "block ", blk.block_id(), " has position gaps; eval needs none"));
        }
        for (uint32_t off : blk.token_offsets()) {
          mine.push_back({whole.begin + off, whole.begin + off + 1});
        }
      }
      // kvmem does not know the front end's attention sinks (block 0 holds
      // them): sink tokens are clipped, not a violation.
      for (const Span& sp : mine) {
        if (sp.end > ws) out->violations |= 2;
      }
      spans.insert(spans.end(), mine.begin(), mine.end());
      out->unit_spans.push_back(ClipMerge(std::move(mine), lo, ws));
    }
    if (TotalTokens(spans) > b_.recall) out->violations |= 1;
    out->recalled = ClipMerge(std::move(spans), lo, ws);
    out->estimated_mass = resp.recalled_mass();
    recalled_now_ = TotalTokens(out->recalled);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResidentTokens(b_, cam) + recalled_now_;
  }
  uint64_t StoredBytes(const CameraTokens&) const override { return stored_; }

 private:
  // A set per KV head: each head's spans (clipped), and their union.
  absl::Status PerHeadSets(const v1::RecallResponse& resp,
                           const CameraTokens& cam, uint64_t ws,
                           Selection* out) {
    const size_t heads = cam.per_token / request_.head_dim;
    out->head_recalled.assign(heads, {});
    std::vector<Span> all;
    for (const v1::LayerRecallSet& set : resp.layer_sets()) {
      const size_t h = set.layer() * request_.kv_heads + set.kv_head();
      if (h >= heads) return absl::InternalError("layer set beyond the heads");
      std::vector<Span> spans;
      for (const v1::RecalledBlock& blk : set.blocks()) {
        const Span whole{blk.first_token_position(), blk.end_token_position()};
        if (blk.token_offsets().empty()) {
          spans.push_back(whole);
        } else {
          for (uint32_t off : blk.token_offsets()) {
            spans.push_back({whole.begin + off, whole.begin + off + 1});
          }
        }
      }
      for (const Span& sp : spans) {
        if (sp.end > ws) out->violations |= 2;
      }
      if (TotalTokens(spans) > b_.recall) out->violations |= 1;
      out->head_recalled[h] = ClipMerge(spans, cam.sink_tokens, ws);
      all.insert(all.end(), spans.begin(), spans.end());
    }
    out->recalled = ClipMerge(std::move(all), cam.sink_tokens, ws);
    recalled_now_ = TotalTokens(out->recalled);
    return absl::OkStatus();
  }

  std::string name_;
  PolicyBudget b_;
  KvmemBackend* backend_;
  std::string id_;
  KvmemRequestOptions request_;
  uint64_t stored_ = 0;
  uint64_t recalled_now_ = 0;
};

class InProcessBackend : public KvmemBackend {
 public:
  explicit InProcessBackend(std::unique_ptr<MemoryEngine> engine)
      : engine_(std::move(engine)) {}
  absl::Status Open(const std::string& id,
                    const v1::StreamConfig& config) override {
    return engine_->OpenStream(id, FromProto(config)).status();
  }
  absl::Status Append(const std::string& id,
                      const OutgoingFrame& frame) override {
    Frame f = FrameFromHeader(frame.header);
    f.payload = frame.payload;
    return engine_->Append(id, std::move(f)).status();
  }
  absl::Status Recall(const std::string& id, const v1::RecallRequest& req,
                      v1::RecallResponse* resp) override {
    auto r = engine_->Recall(id, FromProto(req));
    if (!r.ok()) return r.status();
    ToProto(*r, resp);
    return absl::OkStatus();
  }
  absl::Status Stats(const std::string& id, v1::StreamStats* out) override {
    auto s = engine_->GetStats(id);
    if (!s.ok()) return s.status();
    ToProto(*s, out);
    return absl::OkStatus();
  }
  void Settle() override { engine_->WaitForBackground(); }

 private:
  std::unique_ptr<MemoryEngine> engine_;
};

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

class GrpcBackend : public KvmemBackend {
 public:
  explicit GrpcBackend(std::unique_ptr<KvmemClient> client)
      : client_(std::move(client)) {}
  ~GrpcBackend() override {
    for (auto& [id, session] : sessions_) session->Finish();
  }
  absl::Status Open(const std::string& id,
                    const v1::StreamConfig& config) override {
    std::unique_ptr<SessionClient> session;
    grpc::Status s = client_->StartSession(id, &config, &session);
    if (!s.ok()) return FromGrpc(s, "Session " + id);
    sessions_[id] = std::move(session);
    return absl::OkStatus();
  }
  absl::Status Append(const std::string& id,
                      const OutgoingFrame& frame) override {
    v1::AppendAck ack;
    return FromGrpc(sessions_.at(id)->Append(frame, &ack), "append " + id);
  }
  absl::Status Recall(const std::string& id, const v1::RecallRequest& req,
                      v1::RecallResponse* resp) override {
    return FromGrpc(sessions_.at(id)->Recall(req, resp), "recall " + id);
  }
  absl::Status Stats(const std::string& id, v1::StreamStats* out) override {
    return FromGrpc(client_->GetStreamStats(id, out), "stats " + id);
  }

 private:
  std::unique_ptr<KvmemClient> client_;
  std::map<std::string, std::unique_ptr<SessionClient>> sessions_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvmemBackend>> OpenInProcessBackend(
    const std::string& data_dir) {
  RocksColdStoreOptions o;
  o.path = data_dir;
  auto store = OpenRocksColdStore(o);
  if (!store.ok()) return store.status();
  auto engine = MemoryEngine::Open(std::move(*store));
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<KvmemBackend>(
      std::make_unique<InProcessBackend>(std::move(*engine)));
}

absl::StatusOr<std::unique_ptr<KvmemBackend>> OpenGrpcBackend(
    const std::string& target) {
  auto client = KvmemClient::Connect(target);
  if (!client->WaitForReady(std::chrono::seconds(10))) {
    return absl::UnavailableError(
        absl::StrCat("kvmem-server at ", target, " is not reachable"));
  }
  return std::unique_ptr<KvmemBackend>(
      std::make_unique<GrpcBackend>(std::move(client)));
}

absl::StatusOr<std::unique_ptr<EvalPolicy>> MakeKvmemPolicy(
    const std::string& name, const PolicyBudget& b, KvmemBackend* backend,
    const std::string& stream_id, const v1::StreamConfig& config,
    const KvmemRequestOptions& request) {
  absl::Status s = backend->Open(stream_id, config);
  if (!s.ok()) return s;
  return std::unique_ptr<EvalPolicy>(
      std::make_unique<KvmemPolicy>(name, b, backend, stream_id, request));
}

}  // namespace kvmem
