#include "tools/eval/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/codec/dtype.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/quantize.h"
#include "engine/index/dot.h"
#include "tools/eval/eval_metrics.h"

namespace kvmem {
namespace {

// The baselines, in report order; kvmem and its variants follow, then the
// reference policies.
constexpr const char* kBaselines[] = {"full", "streaming_llm", "window_lru",
                                      "h2o", "mean_key_topk"};

v1::StreamConfig KvmemConfig(const KvmemKnobs& k, const VideoWorkloadOptions& w,
                             uint32_t window, uint32_t recall) {
  v1::StreamConfig c;
  auto* g = c.mutable_geometry();
  g->set_layers(w.layers);
  g->set_kv_heads(w.kv_heads);
  g->set_head_dim(w.head_dim);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(w.tokens_per_frame);
  c.set_hot_window_tokens(window);
  c.mutable_recall_defaults()->set_max_tokens(std::max<uint32_t>(1, recall));
  // Everything else only where the knobs set it: the stream's defaults.
  c.mutable_block_policy()->set_mode(
      static_cast<v1::SegmentMode>(k.segment_mode));
  c.mutable_block_policy()->set_frames_per_block(k.frames_per_block);
  c.mutable_index_policy()->set_groups_per_block(k.groups_per_block);
  c.mutable_index_policy()->set_index_factory(k.index_factory);
  auto* t = c.mutable_tier_policy();
  t->set_warm_budget_bytes(k.warm_budget_bytes);
  t->set_prefetch_blocks(k.prefetch_blocks);
  if (k.prefetch_blocks > 0) {
    // Room to stage the prefetched blocks: prefetch_blocks of the largest.
    const uint32_t frames = k.frames_per_block > 0 ? k.frames_per_block : 32;
    t->set_stage_budget_bytes(static_cast<uint64_t>(k.prefetch_blocks) *
                              frames * w.tokens_per_frame * w.layers * 2 *
                              w.kv_heads * w.head_dim * 2);
  }
  t->set_rebuild_every_blocks(k.rebuild_every_blocks);
  t->set_ingest_precision(static_cast<v1::ColdPrecision>(k.ingest_precision));
  auto* r = c.mutable_recall_policy();
  r->set_track_weight(k.track_weight);
  r->set_scene_weight(k.scene_weight);
  r->set_iou_weight(k.iou_weight);
  r->set_score(static_cast<v1::ScoreMode>(k.score));
  r->set_scorer(k.scorer);
  if (k.identity_share >= 0) r->set_identity_share(k.identity_share);
  return c;
}

struct Config {
  PolicyBudget budget;
  double fraction = 0;
  // [camera][policy]
  std::vector<std::vector<std::unique_ptr<EvalPolicy>>> policies;
  std::vector<std::vector<std::string>> kvmem_ids;  // [kvmem policy][camera]
};

bool Intersects(const std::vector<Span>& a,
                const std::vector<std::pair<uint64_t, uint64_t>>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].end <= b[j].first) {
      ++i;
    } else if (b[j].second <= a[i].begin) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

}  // namespace

KvmemKnobs SummedKnobs() {
  KvmemKnobs k;
  k.segment_mode = 2;
  k.frames_per_block = 4;
  k.groups_per_block = 8;
  k.index_factory = "Flat";
  k.top_k = 16;
  k.score = 2;
  k.rebuild_every_blocks = 32;
  k.warm_budget_bytes = 16ull << 20;
  k.prefetch_blocks = 2;
  k.window_lse = false;
  k.query_heads = false;
  return k;
}

absl::StatusOr<KvmemKnobs> KvmemVariant(const std::string& name,
                                        const KvmemKnobs& base) {
  KvmemKnobs k = base;
  if (name == "kvmem_summed") {
    k = SummedKnobs();
  } else if (name == "kvmem_no_lse") {
    k.window_lse = false;
  } else if (name == "kvmem_blocks") {
    k.groups_per_block = 1;
  } else if (name == "kvmem_groups") {
    k.scorer = "mass_groups";
  } else if (name == "kvmem_group_mean") {
    k.query_heads = false;
  } else if (name == "kvmem_per_head") {
    k.per_head = true;
  } else if (name == "kvmem_mean_query") {
    k.query_heads = false;
    k.window_lse = false;
  } else if (name == "kvmem_attention_only") {
    k.identity_share = 0;
  } else if (name == "kvmem_identity_only") {
    k.identity_share = 1;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown kvmem variant \"", name,
        "\"; use kvmem_summed, kvmem_no_lse, kvmem_blocks, kvmem_groups, "
        "kvmem_group_mean, kvmem_mean_query, kvmem_per_head, "
        "kvmem_attention_only or kvmem_identity_only"));
  }
  return k;
}

namespace {

// The fractions to run (the primary one included), each in (0, 4].
absl::StatusOr<std::vector<double>> CheckEvalOptions(const EvalOptions& o) {
  const std::string bad = CheckVideoWorkloadOptions(o.workload);
  if (!bad.empty()) return absl::InvalidArgumentError(bad);
  if (o.window < 1) return absl::InvalidArgumentError("--window must be >= 1");
  if (o.frames_per_block < 1 || o.top_k < 1) {
    return absl::InvalidArgumentError("--frames_per_block and --top_k >= 1");
  }
  std::vector<double> fractions = o.recall_fractions;
  if (std::find(fractions.begin(), fractions.end(), o.primary_fraction) ==
      fractions.end()) {
    fractions.push_back(o.primary_fraction);
  }
  for (double f : fractions) {
    if (!(f > 0 && f <= 4)) {
      return absl::InvalidArgumentError(
          absl::StrCat("recall fraction ", f, " must be in (0, 4]"));
    }
  }
  return fractions;
}

// One evaluation: every policy of every config fed the same frames and
// scored on the same queries against the exact-attention oracle.
class EvalRun {
 public:
  EvalRun(const EvalOptions& o, std::shared_ptr<const WorkloadSource> source)
      : o_(o),
        source_(std::move(source)),
        wl_(*source_),
        w_(wl_.options()),
        kv_heads_(w_.layers * w_.kv_heads),
        group_(wl_.query_vectors()),
        cams_(w_.cameras) {}
  ~EvalRun() {
    backend_.reset();
    if (!temp_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(temp_dir_, ec);
    }
  }

  absl::StatusOr<EvalResult> Run(const std::vector<double>& fractions);

 private:
  absl::Status OpenBackend();
  void NamePolicies();
  absl::Status AddConfig(uint32_t window, double fraction);
  absl::Status AddCameraPolicies(Config* c, size_t ci, uint32_t window,
                                 uint32_t cam);
  absl::Status Frame(uint64_t f, uint32_t c);
  void QuantiseBlock(CameraTokens* cam, uint64_t begin, bool int4) const;
  // Tokens [begin, end) as a stream with ingest_precision int8 / int4
  // writes them: each row (a token's head_dim values of a head) on its own.
  void QuantiseRows(CameraTokens* cam, uint64_t begin, bool int4) const;
  bool rows_at_ingest() const { return o_.kvmem.ingest_precision >= 2; }
  void Truth(const WorkloadQuery& q, const CameraTokens& ct);
  void BaseWindow(const CameraTokens& ct, uint64_t ws, uint64_t sinks);
  absl::Status Query(uint64_t f, uint32_t c, const WorkloadQuery& q);
  absl::Status Select(uint64_t f, uint32_t c, size_t ci, size_t pi,
                      const WorkloadQuery& q, const QueryOracle& oracle);
  void Score(const Selection& sel, const WorkloadQuery& q,
             const CameraTokens& ct, const Config& cfg, QueryRow* row) const;
  void SampleMemory(uint64_t f);
  absl::Status Summarise();

  const EvalOptions& o_;
  const std::shared_ptr<const WorkloadSource> source_;
  const WorkloadSource& wl_;
  const VideoWorkloadOptions& w_;
  const uint32_t kv_heads_, group_, cams_;
  std::unique_ptr<KvmemBackend> backend_;
  std::string temp_dir_;
  EvalResult result_;
  std::vector<std::pair<std::string, KvmemKnobs>> kvmems_;
  size_t num_policies_ = 0, first_kvmem_ = 0;
  std::vector<Config> configs_;
  std::vector<CameraTokens> cam_;
  // Each camera's tokens as an int8 / int4 cold tier returns them: every
  // finished grid block (frames_per_block frames) quantised as the server
  // does.
  std::vector<CameraTokens> int8_, int4_;
  std::vector<uint64_t> lossy_begin_;  // Each camera's unfinished block.
  // Per config and policy: peaks.
  std::vector<std::vector<uint64_t>> resident_peak_, stored_peak_;
  double per_head_hit_ = 0, shared_hit_ = 0, cold_pool_ = 0;
  QueryTruth t_;
  std::vector<float> keys_, values_, acc_;
};

absl::Status EvalRun::OpenBackend() {
  if (!o_.server.empty()) {
    auto b = OpenGrpcBackend(o_.server);
    if (!b.ok()) return b.status();
    backend_ = std::move(*b);
    result_.kvmem_path = o_.server;
    return absl::OkStatus();
  }
  std::string dir = o_.data_dir;
  if (dir.empty()) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "kvmem-eval-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError("cannot create a temp directory");
    }
    dir = temp_dir_ = tmpl;
  }
  auto b = OpenInProcessBackend(dir);
  if (!b.ok()) return b.status();
  backend_ = std::move(*b);
  result_.kvmem_path = "in-process";
  return absl::OkStatus();
}

void EvalRun::NamePolicies() {
  kvmems_ = {{"kvmem", o_.kvmem}};
  kvmems_.insert(kvmems_.end(), o_.kvmem_variants.begin(),
                 o_.kvmem_variants.end());
  for (const char* n : kBaselines) result_.policy_names.push_back(n);
  for (const auto& [name, k] : kvmems_) result_.policy_names.push_back(name);
  if (o_.references) {
    result_.policy_names.push_back("oracle_tokens");
    result_.policy_names.push_back("exact_keys_per_head");
  }
  num_policies_ = result_.policy_names.size();
  first_kvmem_ = std::size(kBaselines);
}

absl::Status EvalRun::AddConfig(uint32_t window, double fraction) {
  Config c;
  c.fraction = fraction;
  c.budget.window = window;
  c.budget.recall = static_cast<uint32_t>(std::lround(fraction * window));
  c.budget.block_tokens = o_.frames_per_block * w_.tokens_per_frame;
  c.budget.top_k = o_.top_k;
  c.budget.bytes_per_token = wl_.bytes_per_token();
  c.kvmem_ids.resize(kvmems_.size());
  for (uint32_t cam = 0; cam < cams_; ++cam) {
    absl::Status s = AddCameraPolicies(&c, configs_.size(), window, cam);
    if (!s.ok()) return s;
  }
  configs_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::Status EvalRun::AddCameraPolicies(Config* c, size_t ci, uint32_t window,
                                        uint32_t cam) {
  std::vector<std::unique_ptr<EvalPolicy>> ps;
  ps.push_back(MakeFullPolicy(c->budget));
  ps.push_back(MakeStreamingLlmPolicy(c->budget));
  ps.push_back(MakeWindowLruPolicy(c->budget));
  ps.push_back(MakeH2oPolicy(c->budget));
  ps.push_back(MakeMeanKeyTopkPolicy(c->budget));
  for (size_t ki = 0; ki < kvmems_.size(); ++ki) {
    const auto& [name, knobs] = kvmems_[ki];
    const std::string id =
        absl::StrFormat("eval-w%u-r%u-cam%u-%u-%s", window, c->budget.recall,
                        cam, static_cast<unsigned>(ci), name);
    KvmemRequestOptions req;
    req.top_k = knobs.top_k;
    req.send_budget = ki != 0;  // kvmem: the stream's default budget.
    req.window_lse = knobs.window_lse;
    req.query_heads = knobs.query_heads;
    req.per_head = knobs.per_head;
    req.head_dim = w_.head_dim;
    req.kv_heads = w_.kv_heads;
    auto k =
        MakeKvmemPolicy(name, c->budget, backend_.get(), id,
                        KvmemConfig(knobs, w_, window, c->budget.recall), req);
    if (!k.ok()) return k.status();
    ps.push_back(std::move(*k));
    c->kvmem_ids[ki].push_back(id);
  }
  if (o_.references) {
    ps.push_back(MakeOracleTokensPolicy(c->budget));
    ps.push_back(MakeExactKeysPerHeadPolicy(c->budget, w_.head_dim));
  }
  c->policies.push_back(std::move(ps));
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> EvalRun::Run(const std::vector<double>& fractions) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = OpenBackend();
  if (!s.ok()) return s;
  NamePolicies();
  for (double f : fractions) {
    s = AddConfig(o_.window, f);
    if (!s.ok()) return s;
    if (f == o_.primary_fraction) result_.primary = configs_.size() - 1;
  }
  for (uint32_t extra : o_.extra_windows) {
    if (extra == o_.window) continue;
    s = AddConfig(extra, o_.primary_fraction);
    if (!s.ok()) return s;
  }
  cam_.resize(cams_);
  for (auto& c : cam_) {
    c.sink_tokens = w_.sink_tokens;
    c.per_token = kv_heads_ * w_.head_dim;
  }
  int8_ = cam_;
  int4_ = cam_;
  if (rows_at_ingest()) result_.lossy_form = "ingest_precision";
  lossy_begin_.assign(cams_, 0);
  resident_peak_.assign(configs_.size(),
                        std::vector<uint64_t>(num_policies_, 0));
  stored_peak_ = resident_peak_;
  t_.query_heads = kv_heads_ * group_;
  t_.group = group_;
  t_.head_dim = w_.head_dim;
  t_.base_mass.resize(t_.query_heads);
  t_.base_out.resize(t_.query_heads);
  acc_.resize(w_.head_dim);
  for (uint64_t f = 0; f < w_.frames; ++f) {
    for (uint32_t c = 0; c < cams_; ++c) {
      s = Frame(f, c);
      if (!s.ok()) return s;
    }
    SampleMemory(f);
    if (o_.on_frame) o_.on_frame(f + 1, w_.frames);
  }
  backend_->Settle();
  s = Summarise();
  if (!s.ok()) return s;
  result_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return std::move(result_);
}

absl::Status EvalRun::Frame(uint64_t f, uint32_t c) {
  const WorkloadFrame frame = wl_.Frame(c, f);
  wl_.FrameKV(frame, &keys_, &values_);
  CameraTokens& ct = cam_[c];
  ct.keys.insert(ct.keys.end(), keys_.begin(), keys_.end());
  ct.values.insert(ct.values.end(), values_.begin(), values_.end());
  ct.tokens += frame.frame.header.token_count();
  for (CameraTokens* q : {&int8_[c], &int4_[c]}) {
    q->keys.insert(q->keys.end(), keys_.begin(), keys_.end());
    q->values.insert(q->values.end(), values_.begin(), values_.end());
    q->tokens = ct.tokens;
  }
  if (rows_at_ingest()) {
    QuantiseRows(&int8_[c], lossy_begin_[c], false);
    QuantiseRows(&int4_[c], lossy_begin_[c], true);
    lossy_begin_[c] = ct.tokens;
  } else if ((f + 1) % o_.frames_per_block == 0) {
    QuantiseBlock(&int8_[c], lossy_begin_[c], false);
    QuantiseBlock(&int4_[c], lossy_begin_[c], true);
    lossy_begin_[c] = ct.tokens;
  }
  for (auto& cfg : configs_) {
    for (auto& p : cfg.policies[c]) {
      absl::Status s = p->OnFrame(frame, ct);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(p->name(), " at frame ", f,
                                                   ": ", s.message()));
      }
    }
  }
  for (const WorkloadQuery& q : wl_.Queries(c, f, frame)) {
    absl::Status s = Query(f, c, q);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void EvalRun::QuantiseBlock(CameraTokens* cam, uint64_t begin,
                            bool int4) const {
  // Per layer, the block's record as the stream stores it (K then V, each
  // [kv_head][token][head_dim], fp16) through the server's own int8 or int4
  // round trip (engine/codec/quantize.h).
  const Geometry g{w_.layers, w_.kv_heads, w_.head_dim, DType::kFp16,
                   w_.tokens_per_frame};
  const uint64_t T = cam->tokens - begin;
  const size_t H = w_.kv_heads, d = w_.head_dim, slice = H * T * d;
  std::vector<float> buf(2 * slice);
  std::string record(buf.size() * 2, '\0');
  for (uint32_t l = 0; l < w_.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const float* src = (kv == 0 ? cam->keys : cam->values).data();
      for (size_t h = 0; h < H; ++h)
        for (uint64_t t = 0; t < T; ++t)
          std::copy_n(src + (begin + t) * cam->per_token + (l * H + h) * d, d,
                      buf.data() + kv * slice + (h * T + t) * d);
    }
    EncodeFromFloat(buf.data(), buf.size(), DType::kFp16,
                    reinterpret_cast<uint8_t*>(record.data()));
    const uint32_t n = static_cast<uint32_t>(T);
    auto back = int4
                    ? DequantizeLayerInt4(g, n, QuantizeLayerInt4(g, n, record))
                    : DequantizeLayer(g, n, QuantizeLayer(g, n, record));
    if (!back.ok()) return;  // Sizes are the geometry's: cannot happen.
    DecodeToFloat(reinterpret_cast<const uint8_t*>(back->data()), buf.size(),
                  DType::kFp16, buf.data());
    for (int kv = 0; kv < 2; ++kv) {
      float* dst = (kv == 0 ? cam->keys : cam->values).data();
      for (size_t h = 0; h < H; ++h)
        for (uint64_t t = 0; t < T; ++t)
          std::copy_n(buf.data() + kv * slice + (h * T + t) * d, d,
                      dst + (begin + t) * cam->per_token + (l * H + h) * d);
    }
  }
}

void EvalRun::QuantiseRows(CameraTokens* cam, uint64_t begin, bool int4) const {
  // The stream's own codec (engine/codec/frame_codec.h) on fp16 rows.
  const Geometry g{w_.layers, w_.kv_heads, w_.head_dim, DType::kFp16,
                   w_.tokens_per_frame};
  const ColdPrecision p = int4 ? ColdPrecision::kInt4 : ColdPrecision::kInt8;
  const size_t at = begin * cam->per_token;
  const size_t n = cam->tokens * cam->per_token - at;
  std::string bytes(n * 2, '\0'), enc, dec;
  for (std::vector<float>* v : {&cam->keys, &cam->values}) {
    EncodeFromFloat(v->data() + at, n, DType::kFp16,
                    reinterpret_cast<uint8_t*>(bytes.data()));
    EncodeFrameRows(g, p, bytes, &enc);
    if (!DecodeFrameRows(g, p, enc, &dec).ok()) return;  // Whole rows.
    DecodeToFloat(reinterpret_cast<const uint8_t*>(dec.data()), n, DType::kFp16,
                  v->data() + at);
  }
}

void EvalRun::Truth(const WorkloadQuery& q, const CameraTokens& ct) {
  const uint64_t n = ct.tokens;
  t_.q_heads = &q.q_heads;
  OracleAttention(ct, n, q.q_heads, kv_heads_, w_.head_dim, &t_.probs,
                  &t_.outs);
  t_.pbar.assign(n, 0.0);
  for (const auto& p : t_.probs)
    for (uint64_t i = 0; i < n; ++i) t_.pbar[i] += p[i];
  t_.prefix.assign(n + 1, 0.0);
  for (uint64_t i = 0; i < n; ++i) {
    t_.pbar[i] /= t_.query_heads;
    t_.prefix[i + 1] = t_.prefix[i] + t_.pbar[i];
  }
}

void EvalRun::BaseWindow(const CameraTokens& ct, uint64_t ws, uint64_t sinks) {
  // The sinks and the window, which every bounded policy holds.
  const uint64_t n = ct.tokens;
  for (uint32_t qh = 0; qh < t_.query_heads; ++qh) {
    double mass = 0;
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    const float* v = ct.values.data() + (qh / group_) * w_.head_dim;
    auto add = [&](uint64_t i) {
      const float pi = t_.probs[qh][i];
      mass += pi;
      Axpy(pi, v + i * ct.per_token, acc_.data(), w_.head_dim);
    };
    for (uint64_t i = 0; i < sinks; ++i) add(i);
    for (uint64_t i = std::max(ws, sinks); i < n; ++i) add(i);
    t_.base_mass[qh] = mass;
    t_.base_out[qh].assign(acc_.begin(), acc_.end());
  }
}

absl::Status EvalRun::Query(uint64_t f, uint32_t c, const WorkloadQuery& q) {
  (q.kind == QueryKind::kProbe ? result_.probe_queries
                               : result_.frame_queries)++;
  const CameraTokens& ct = cam_[c];
  const uint64_t n = ct.tokens;
  Truth(q, ct);
  QueryOracle oracle;
  oracle.attention = &t_.pbar;
  OracleSets(t_, n, configs_[result_.primary].budget, ct.sink_tokens,
             &per_head_hit_, &shared_hit_, &cold_pool_);
  uint32_t base_window = UINT32_MAX;
  for (size_t ci = 0; ci < configs_.size(); ++ci) {
    const Config& cfg = configs_[ci];
    if (cfg.budget.window != base_window) {
      base_window = cfg.budget.window;
      BaseWindow(ct, cfg.budget.WindowStart(n),
                 std::min<uint64_t>(ct.sink_tokens, n));
    }
    for (size_t pi = 0; pi < num_policies_; ++pi) {
      absl::Status s = Select(f, c, ci, pi, q, oracle);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status EvalRun::Select(uint64_t f, uint32_t c, size_t ci, size_t pi,
                             const WorkloadQuery& q,
                             const QueryOracle& oracle) {
  const CameraTokens& ct = cam_[c];
  const Config& cfg = configs_[ci];
  EvalPolicy& pol = *cfg.policies[c][pi];
  const uint64_t n = ct.tokens;
  const uint64_t ws = cfg.budget.WindowStart(n);
  const uint64_t sinks = std::min<uint64_t>(ct.sink_tokens, n);
  Selection sel;
  const auto s0 = std::chrono::steady_clock::now();
  absl::Status s = pol.Select(q, ct, oracle, &sel);
  const float us = std::chrono::duration<float, std::micro>(
                       std::chrono::steady_clock::now() - s0)
                       .count();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(pol.name(), " recall at frame ",
                                               f, ": ", s.message()));
  }
  QueryRow row;
  row.camera = c;
  row.frame = f;
  row.kind = q.kind;
  row.config = static_cast<uint16_t>(ci);
  row.policy = static_cast<uint16_t>(pi);
  // The oracle-fed references' time is not a selection's.
  const bool timed = pi != 0 && pi < first_kvmem_ + kvmems_.size();
  row.latency_us = !timed ? 0.0f : sel.latency_us >= 0 ? sel.latency_us : us;
  row.cold_total =
      static_cast<float>(Sum(t_.prefix, sinks, std::max(ws, sinks)));
  Score(sel, q, ct, cfg, &row);
  result_.rows.push_back(row);
  pol.Observe(sel, t_.pbar, row.mass, ct);
  if (pi == first_kvmem_ && ci == result_.primary && o_.record_kvmem_sets) {
    result_.kvmem_sets.push_back(sel.recalled);
  }
  return absl::OkStatus();
}

void EvalRun::Score(const Selection& sel, const WorkloadQuery& q,
                    const CameraTokens& ct, const Config& cfg,
                    QueryRow* row) const {
  const uint64_t n = ct.tokens;
  const uint64_t ws = cfg.budget.WindowStart(n);
  const uint64_t sinks = std::min<uint64_t>(ct.sink_tokens, n);
  double hit = 0;
  if (sel.head_recalled.empty()) {
    for (const Span& sp : sel.recalled) {
      hit += Sum(t_.prefix, sp.begin, sp.end);
      row->injected += static_cast<uint32_t>(sp.size());
    }
  } else {  // Each query head reads its KV head's own set.
    uint64_t tokens = 0;
    for (uint32_t qh = 0; qh < t_.query_heads; ++qh) {
      for (const Span& sp : sel.head_recalled[qh / group_]) {
        for (uint64_t i = sp.begin; i < sp.end; ++i) hit += t_.probs[qh][i];
      }
    }
    hit /= t_.query_heads;
    for (const auto& set : sel.head_recalled) {
      for (const Span& sp : set) tokens += sp.size();
    }
    row->injected = static_cast<uint32_t>(tokens / sel.head_recalled.size());
  }
  row->cold_hit = static_cast<float>(hit);
  ScoreOutputs(t_, ct, &int8_[row->camera], &int4_[row->camera], sel, row);
  row->violations = sel.violations;
  row->query_tokens = sel.query_tokens;
  row->track_tokens = sel.track_tokens;
  if (q.kind == QueryKind::kProbe && !q.earlier.empty() &&
      q.earlier.back().second <= ws) {
    row->reid = Intersects(sel.recalled, q.earlier) ? 1 : 0;
  }
  // Useless hits: recalled blocks with under 1 % of the mass.
  std::vector<Span> units = sel.units;
  if (units.empty() && !sel.everything) units = sel.recalled;
  if (sel.everything) {  // full: every grid block outside.
    for (uint64_t b = sinks; b < ws; b += cfg.budget.block_tokens) {
      units.push_back({b, std::min<uint64_t>(ws, b + cfg.budget.block_tokens)});
    }
  }
  uint32_t useless = 0;
  for (const Span& u : units) {
    useless +=
        Sum(t_.prefix, std::max(u.begin, sinks), std::min(u.end, n)) < 0.01;
  }
  row->units = static_cast<uint32_t>(units.size());
  row->degraded = sel.degraded_blocks;
  row->useless = useless;
}

void EvalRun::SampleMemory(uint64_t f) {
  // Memory after this frame, summed over cameras.
  MemorySample ms;
  ms.frame = f;
  for (size_t ci = 0; ci < configs_.size(); ++ci) {
    for (size_t pi = 0; pi < num_policies_; ++pi) {
      uint64_t res = 0, sto = 0;
      for (uint32_t c = 0; c < cams_; ++c) {
        res += configs_[ci].policies[c][pi]->ResidentTokens(cam_[c]) *
               wl_.bytes_per_token();
        sto += configs_[ci].policies[c][pi]->StoredBytes(cam_[c]);
      }
      resident_peak_[ci][pi] = std::max(resident_peak_[ci][pi], res);
      stored_peak_[ci][pi] = std::max(stored_peak_[ci][pi], sto);
      if (ci == result_.primary) {
        ms.resident.push_back(res);
        ms.stored.push_back(sto);
      }
    }
  }
  result_.memory.push_back(std::move(ms));
}

absl::Status EvalRun::Summarise() {
  for (size_t ci = 0; ci < configs_.size(); ++ci) {
    ConfigSummary cs;
    cs.window = configs_[ci].budget.window;
    cs.recall = configs_[ci].budget.recall;
    cs.fraction = configs_[ci].fraction;
    for (const std::string& id : configs_[ci].kvmem_ids[0]) {
      v1::StreamStats st;
      absl::Status s = backend_->Stats(id, &st);
      if (!s.ok()) return s;
      cs.kvmem_rebuilds += st.policy().rebuilds();
      cs.kvmem_blocks += st.sealed_blocks();
    }
    for (size_t pi = 0; pi < num_policies_; ++pi) {
      PolicySummary ps = Summarize(result_, ci, pi, w_.fps, cs.recall);
      ps.recalled_bytes_mean =
          ps.injected_tokens_mean * static_cast<double>(wl_.bytes_per_token());
      ps.resident_bytes_peak = resident_peak_[ci][pi];
      ps.stored_bytes_peak = stored_peak_[ci][pi];
      cs.policies.push_back(ps);
    }
    result_.configs.push_back(std::move(cs));
  }
  if (cold_pool_ > 0) {
    result_.oracle_shared_cold_mass = shared_hit_ / cold_pool_;
    result_.oracle_per_head_cold_mass = per_head_hit_ / cold_pool_;
  }
  if (!wl_.has_values()) {
    result_.notes.push_back(
        "the trace has no values (has_values false): output errors and "
        "cosines compare zero vectors and mean nothing; cold mass and re-ID "
        "need keys and queries only");
  }
  result_.frames = w_.frames;
  for (const auto& c : cam_) result_.tokens += c.tokens;
  for (uint32_t c = 0; c < cams_; ++c) result_.shots += wl_.shots(c);
  result_.walks = wl_.walks();
  result_.rebuild_periods =
      static_cast<double>(result_.configs[result_.primary].kvmem_rebuilds) /
      cams_;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EvalResult> RunEval(const EvalOptions& o) {
  absl::StatusOr<std::vector<double>> fractions = CheckEvalOptions(o);
  if (!fractions.ok()) return fractions.status();
  std::shared_ptr<const WorkloadSource> source = o.source;
  if (source == nullptr) source = std::make_shared<VideoWorkload>(o.workload);
  EvalRun run(o, std::move(source));
  return run.Run(*fractions);
}

}  // namespace kvmem
