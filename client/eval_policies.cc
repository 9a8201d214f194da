#include "client/eval_policies.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/memory_engine.h"
#include "server/proto_convert.h"
#include "storage/rocks_cold_store.h"

namespace kvmem {

std::vector<Span> SpansOf(const std::vector<uint64_t>& sorted_positions) {
  std::vector<Span> out;
  for (uint64_t p : sorted_positions) {
    if (!out.empty() && out.back().end == p) {
      ++out.back().end;
    } else {
      out.push_back({p, p + 1});
    }
  }
  return out;
}

std::vector<Span> ClipMerge(std::vector<Span> spans, uint64_t lo, uint64_t hi) {
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::vector<Span> out;
  for (Span s : spans) {
    s.begin = std::max(s.begin, lo);
    s.end = std::min(s.end, hi);
    if (s.begin >= s.end) continue;
    if (!out.empty() && s.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, s.end);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

namespace {

uint64_t Total(const std::vector<Span>& spans) {
  uint64_t n = 0;
  for (const Span& s : spans) n += s.size();
  return n;
}

// Sinks + window, bounded by what exists.
uint64_t BaseResident(const PolicyBudget& b, const CameraTokens& cam) {
  return std::min<uint64_t>(cam.sink_tokens, cam.tokens) +
         std::min<uint64_t>(
             b.window,
             cam.tokens - std::min<uint64_t>(cam.sink_tokens, cam.tokens));
}

class FullPolicy : public EvalPolicy {
 public:
  explicit FullPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "full"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens&) override {
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      Selection* out) override {
    out->everything = true;
    out->recalled = ClipMerge({{0, cam.tokens}}, cam.sink_tokens,
                              b_.WindowStart(cam.tokens));
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return cam.tokens;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return cam.tokens * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
};

class StreamingLlmPolicy : public EvalPolicy {
 public:
  explicit StreamingLlmPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "streaming_llm"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens&) override {
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      Selection* out) override {
    const uint64_t ws = b_.WindowStart(cam.tokens);
    out->recalled = ClipMerge({{ws > b_.recall ? ws - b_.recall : 0, ws}},
                              cam.sink_tokens, ws);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    PolicyBudget wide = b_;
    wide.window += b_.recall;
    return BaseResident(wide, cam);
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return ResidentTokens(cam) * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
};

// Grid block b covers [b * block_tokens, (b + 1) * block_tokens), minus sinks.
Span GridBlock(const PolicyBudget& b, uint64_t block, uint32_t sinks) {
  Span s{block * b.block_tokens, (block + 1) * b.block_tokens};
  s.begin = std::max<uint64_t>(s.begin, sinks);
  return s;
}

class WindowLruPolicy : public EvalPolicy {
 public:
  explicit WindowLruPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "window_lru"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens& cam) override {
    const uint64_t ws = b_.WindowStart(cam.tokens);
    // Blocks that have left the window enter the cache as most recent.
    while ((next_ + 1) * b_.block_tokens <= ws) {
      const Span s = GridBlock(b_, next_, cam.sink_tokens);
      if (s.size() <= b_.recall && s.size() > 0) {
        lru_.push_front(next_);
        where_[next_] = lru_.begin();
        cached_ += s.size();
      }
      ++next_;
      while (cached_ > b_.recall) {
        const uint64_t victim = lru_.back();
        lru_.pop_back();
        where_.erase(victim);
        cached_ -= GridBlock(b_, victim, cam.sink_tokens).size();
      }
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      Selection* out) override {
    for (uint64_t blk : lru_) {
      out->units.push_back(GridBlock(b_, blk, cam.sink_tokens));
    }
    out->recalled =
        ClipMerge(out->units, cam.sink_tokens, b_.WindowStart(cam.tokens));
    return absl::OkStatus();
  }
  void Observe(const Selection& sel, const std::vector<double>& pbar,
               double mass, const CameraTokens&) override {
    if (mass <= 0) return;
    for (const Span& u : sel.units) {
      double m = 0;
      for (uint64_t p = u.begin; p < u.end; ++p) m += pbar[p];
      if (m / mass < 0.01) continue;
      const uint64_t blk = u.begin / b_.block_tokens;
      auto it = where_.find(blk);
      if (it == where_.end()) continue;
      lru_.splice(lru_.begin(), lru_, it->second);
    }
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + cached_;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return ResidentTokens(cam) * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
  uint64_t next_ = 0;  // Next grid block to leave the window.
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
  uint64_t cached_ = 0;
};

class H2oPolicy : public EvalPolicy {
 public:
  explicit H2oPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "h2o"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens& cam) override {
    acc_.resize(cam.tokens, 0.0);
    const uint64_t ws = b_.WindowStart(cam.tokens);
    for (uint64_t p = std::max<uint64_t>(left_, cam.sink_tokens); p < ws; ++p) {
      pool_.push_back(p);
    }
    left_ = std::max(left_, ws);
    if (pool_.size() > b_.recall) {
      // Keep the R heaviest; ties go to the newer token.
      std::nth_element(pool_.begin(), pool_.begin() + b_.recall, pool_.end(),
                       [&](uint64_t x, uint64_t y) {
                         return acc_[x] != acc_[y] ? acc_[x] > acc_[y] : x > y;
                       });
      pool_.resize(b_.recall);
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery&, const CameraTokens& cam,
                      Selection* out) override {
    std::vector<uint64_t> sorted = pool_;
    std::sort(sorted.begin(), sorted.end());
    out->recalled = SpansOf(sorted);
    // Units: the grid blocks the kept tokens fall in.
    for (const Span& s : out->recalled) {
      for (uint64_t p = s.begin; p < s.end;) {
        const uint64_t end = std::min<uint64_t>(
            s.end, (p / b_.block_tokens + 1) * b_.block_tokens);
        if (!out->units.empty() &&
            out->units.back().begin / b_.block_tokens == p / b_.block_tokens) {
          out->units.back().end = end;  // Same block: extend the unit.
        } else {
          out->units.push_back({p, end});
        }
        p = end;
      }
    }
    (void)cam;
    return absl::OkStatus();
  }
  void Observe(const Selection& sel, const std::vector<double>& pbar,
               double mass, const CameraTokens& cam) override {
    if (mass <= 0) return;
    const double k = 1.0 / mass;
    for (uint64_t p = 0; p < cam.sink_tokens && p < cam.tokens; ++p)
      acc_[p] += pbar[p] * k;
    for (uint64_t p = b_.WindowStart(cam.tokens); p < cam.tokens; ++p)
      acc_[p] += pbar[p] * k;
    for (uint64_t p : pool_) acc_[p] += pbar[p] * k;
    (void)sel;
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + pool_.size();
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return ResidentTokens(cam) * b_.bytes_per_token;
  }

 private:
  PolicyBudget b_;
  std::vector<double> acc_;     // Accumulated attention per position.
  std::vector<uint64_t> pool_;  // Kept tokens outside the window.
  uint64_t left_ = 0;           // Positions below this left the window.
};

class MeanKeyTopkPolicy : public EvalPolicy {
 public:
  explicit MeanKeyTopkPolicy(const PolicyBudget& b) : b_(b) {}
  const char* name() const override { return "mean_key_topk"; }
  absl::Status OnFrame(const WorkloadFrame&, const CameraTokens& cam) override {
    // Seal every complete grid block: its summary is the mean key.
    while ((sealed_ + 1) * b_.block_tokens <= cam.tokens) {
      const Span s = GridBlock(b_, sealed_, cam.sink_tokens);
      std::vector<double> sum(cam.per_token, 0.0);
      for (uint64_t p = s.begin; p < s.end; ++p) {
        const float* k = cam.keys.data() + p * cam.per_token;
        for (uint32_t i = 0; i < cam.per_token; ++i) sum[i] += k[i];
      }
      for (double& x : sum) x /= std::max<uint64_t>(1, s.size());
      means_.insert(means_.end(), sum.begin(), sum.end());
      ++sealed_;
    }
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery& q, const CameraTokens& cam,
                      Selection* out) override {
    const uint64_t ws = b_.WindowStart(cam.tokens);
    std::vector<std::pair<double, uint64_t>> scored;
    for (uint64_t blk = 0; blk < sealed_ && (blk + 1) * b_.block_tokens <= ws;
         ++blk) {
      const float* m = means_.data() + blk * cam.per_token;
      double dot = 0;
      for (uint32_t i = 0; i < cam.per_token; ++i) dot += m[i] * q.q[i];
      scored.emplace_back(dot, blk);
    }
    std::sort(scored.begin(), scored.end(),
              [](const auto& x, const auto& y) { return x.first > y.first; });
    uint64_t left = b_.recall;
    for (size_t i = 0; i < scored.size() && i < b_.top_k; ++i) {
      const Span s = GridBlock(b_, scored[i].second, cam.sink_tokens);
      if (s.size() == 0 || s.size() > left) continue;
      left -= s.size();
      out->units.push_back(s);
    }
    out->recalled = ClipMerge(out->units, cam.sink_tokens, ws);
    recalled_now_ = Total(out->recalled);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + recalled_now_;
  }
  uint64_t StoredBytes(const CameraTokens& cam) const override {
    return cam.tokens * b_.bytes_per_token + means_.size() * sizeof(float);
  }

 private:
  PolicyBudget b_;
  uint64_t sealed_ = 0;
  std::vector<float> means_;  // [block][per_token]
  uint64_t recalled_now_ = 0;
};

class KvmemPolicy : public EvalPolicy {
 public:
  KvmemPolicy(const PolicyBudget& b, KvmemBackend* backend, std::string id)
      : b_(b), backend_(backend), id_(std::move(id)) {}
  const char* name() const override { return "kvmem"; }
  absl::Status OnFrame(const WorkloadFrame& frame,
                       const CameraTokens& cam) override {
    absl::Status s = backend_->Append(id_, frame.frame);
    if (!s.ok()) return s;
    // Stats are sampled every few frames: they scan the stream's blocks.
    if (frame.frame.header.frame_index() % 8 == 0) {
      v1::StreamStats st;
      s = backend_->Stats(id_, &st);
      if (!s.ok()) return s;
      stored_ = st.warm().bytes() + st.cold().bytes() + st.degraded().bytes() +
                st.summary_bytes();
      stats_ = st;
    }
    (void)cam;
    return absl::OkStatus();
  }
  absl::Status Select(const WorkloadQuery& q, const CameraTokens& cam,
                      Selection* out) override {
    v1::RecallRequest req;
    req.set_stream_id(id_);
    *req.mutable_query() = {q.q.begin(), q.q.end()};
    req.mutable_budget()->set_max_tokens(b_.recall);
    req.mutable_budget()->set_top_k(b_.top_k);
    *req.mutable_signals() = q.signals;
    v1::RecallResponse resp;
    absl::Status s = backend_->Recall(id_, req, &resp);
    if (!s.ok()) return s;
    std::vector<Span> spans;
    for (const v1::RecalledBlock& blk : resp.blocks()) {
      const Span whole{blk.first_token_position(), blk.end_token_position()};
      out->units.push_back(whole);
      out->degraded_blocks += blk.degraded();
      if (blk.token_offsets().empty()) {
        spans.push_back(whole);
        continue;
      }
      // Offsets are in append order; the workload's positions have no gaps.
      if (whole.size() != blk.token_count()) {
        return absl::InternalError(absl::StrCat(
            "block ", blk.block_id(), " has position gaps; eval needs none"));
      }
      for (uint32_t off : blk.token_offsets()) {
        spans.push_back({whole.begin + off, whole.begin + off + 1});
      }
    }
    out->recalled = ClipMerge(std::move(spans), cam.sink_tokens,
                              b_.WindowStart(cam.tokens));
    recalled_now_ = Total(out->recalled);
    return absl::OkStatus();
  }
  uint64_t ResidentTokens(const CameraTokens& cam) const override {
    return BaseResident(b_, cam) + recalled_now_;
  }
  uint64_t StoredBytes(const CameraTokens&) const override { return stored_; }
  const v1::StreamStats& stats() const { return stats_; }

 private:
  PolicyBudget b_;
  KvmemBackend* backend_;
  std::string id_;
  uint64_t stored_ = 0;
  uint64_t recalled_now_ = 0;
  v1::StreamStats stats_;
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

std::unique_ptr<EvalPolicy> MakeFullPolicy(const PolicyBudget& b) {
  return std::make_unique<FullPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeStreamingLlmPolicy(const PolicyBudget& b) {
  return std::make_unique<StreamingLlmPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeWindowLruPolicy(const PolicyBudget& b) {
  return std::make_unique<WindowLruPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeH2oPolicy(const PolicyBudget& b) {
  return std::make_unique<H2oPolicy>(b);
}
std::unique_ptr<EvalPolicy> MakeMeanKeyTopkPolicy(const PolicyBudget& b) {
  return std::make_unique<MeanKeyTopkPolicy>(b);
}

absl::StatusOr<std::unique_ptr<EvalPolicy>> MakeKvmemPolicy(
    const PolicyBudget& b, KvmemBackend* backend, const std::string& stream_id,
    const v1::StreamConfig& config) {
  absl::Status s = backend->Open(stream_id, config);
  if (!s.ok()) return s;
  return std::unique_ptr<EvalPolicy>(
      std::make_unique<KvmemPolicy>(b, backend, stream_id));
}

}  // namespace kvmem
