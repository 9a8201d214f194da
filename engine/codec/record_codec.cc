#include "engine/codec/record_codec.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvmem {
namespace {

constexpr uint8_t kConfigVersion = 8;  // 1: without tier/recall/shot fields;
                                       // 2: without groups_per_block;
                                       // 3: without the score mode;
                                       // 4: without the scorer's name;
                                       // 5: without the identity share;
                                       // 6: without the cold precision;
                                       // 7: without the ingest precision.
constexpr uint8_t kStateVersion = 1;
// 1: info and summary only; 2: no groups; 3: no token codes; 4: no
// groups_pending.
constexpr uint8_t kBlockVersion = 5;

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void U64(uint64_t v) { Raw(&v, sizeof(v)); }
  void F32(float v) { Raw(&v, sizeof(v)); }

  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void Floats(const std::vector<float>& v) {
    U32(static_cast<uint32_t>(v.size()));
    Raw(v.data(), v.size() * sizeof(float));
  }
  std::string Take() { return std::move(out_); }

 private:
  // Records are read back on the same (little-endian x86/ARM) hosts.
  void Raw(const void* p, size_t n) {
    if (n > 0) out_.append(static_cast<const char*>(p), n);
  }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, sizeof(*v)); }
  bool U64(uint64_t* v) { return Raw(v, sizeof(*v)); }
  bool F32(float* v) { return Raw(v, sizeof(*v)); }

  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size()) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool Floats(std::vector<float>* v) {
    uint32_t n;
    if (!U32(&n) || static_cast<uint64_t>(n) * sizeof(float) > in_.size()) {
      return false;
    }
    v->resize(n);
    return Raw(v->data(), n * sizeof(float));
  }
  bool Done() const { return in_.empty(); }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() < n) return false;
    if (n == 0) return true;  // An empty vector's data() may be null.
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  absl::string_view in_;
};

absl::Status Corrupt(absl::string_view what, size_t size) {
  return absl::DataLossError(
      absl::StrCat(what, " record of ", size, " bytes is malformed"));
}

}  // namespace

std::string EncodeConfig(const StreamConfig& c) {
  Writer w;
  w.U8(kConfigVersion);
  w.U32(c.geometry.layers);
  w.U32(c.geometry.kv_heads);
  w.U32(c.geometry.head_dim);
  w.U32(static_cast<uint32_t>(c.geometry.dtype));
  w.U32(c.geometry.max_tokens_per_frame);
  w.U32(c.hot_window_tokens);
  w.U32(c.frames_per_block);
  w.U32(static_cast<uint32_t>(c.indexed_layers.size()));
  for (uint32_t l : c.indexed_layers) w.U32(l);
  w.Str(c.index_factory);
  w.U32(c.default_top_k);
  w.U32(c.default_max_tokens);
  w.F32(c.gate_temperature);
  w.U32(static_cast<uint32_t>(c.labels.size()));
  for (const auto& [k, v] : c.labels) {
    w.Str(k);
    w.Str(v);
  }
  w.U32(static_cast<uint32_t>(c.segment_mode));
  w.F32(c.shot_similarity_threshold);
  w.U32(c.max_tokens_per_block);
  const TierConfig& t = c.tiers;
  for (uint64_t v : {t.warm_budget_bytes, t.cold_budget_bytes,
                     t.storage_cap_bytes, t.stage_budget_bytes}) {
    w.U64(v);
  }
  for (uint32_t v :
       {static_cast<uint32_t>(t.replacement), t.heat_half_life_frames,
        t.prefetch_blocks, t.rebuild_every_blocks, t.rebuild_every_seconds}) {
    w.U32(v);
  }
  for (float v :
       {c.weights.model, c.weights.track, c.weights.iou, c.weights.scene}) {
    w.F32(v);
  }
  w.U32(c.groups_per_block);
  w.U32(static_cast<uint32_t>(c.weights.score));
  w.Str(c.weights.scorer);
  w.U8(c.weights.identity_share.has_value() ? 1 : 0);
  w.F32(c.weights.identity_share.value_or(0.0f));
  w.U32(static_cast<uint32_t>(c.tiers.cold_precision));
  w.U32(static_cast<uint32_t>(c.tiers.ingest_precision));
  return w.Take();
}

absl::StatusOr<StreamConfig> DecodeConfig(absl::string_view bytes) {
  Reader r(bytes);
  StreamConfig c;
  uint8_t version = 0;
  uint32_t dtype = 0, n_layers = 0, n_labels = 0;
  bool ok = r.U8(&version) && version >= 1 && version <= kConfigVersion &&
            r.U32(&c.geometry.layers) && r.U32(&c.geometry.kv_heads) &&
            r.U32(&c.geometry.head_dim) && r.U32(&dtype) &&
            r.U32(&c.geometry.max_tokens_per_frame) &&
            r.U32(&c.hot_window_tokens) && r.U32(&c.frames_per_block) &&
            r.U32(&n_layers) && n_layers <= 1024;
  for (uint32_t i = 0; ok && i < n_layers; ++i) {
    uint32_t l;
    ok = r.U32(&l);
    c.indexed_layers.push_back(l);
  }
  ok = ok && r.Str(&c.index_factory) && r.U32(&c.default_top_k) &&
       r.U32(&c.default_max_tokens) && r.F32(&c.gate_temperature) &&
       r.U32(&n_labels) && n_labels <= 1024;
  for (uint32_t i = 0; ok && i < n_labels; ++i) {
    std::string k, v;
    ok = r.Str(&k) && r.Str(&v);
    c.labels[k] = v;
  }
  uint32_t mode = 0;
  if (ok && version >= 2) {
    TierConfig& t = c.tiers;
    uint32_t replacement = 0;
    ok = r.U32(&mode) && r.F32(&c.shot_similarity_threshold) &&
         r.U32(&c.max_tokens_per_block) && r.U64(&t.warm_budget_bytes) &&
         r.U64(&t.cold_budget_bytes) && r.U64(&t.storage_cap_bytes) &&
         r.U64(&t.stage_budget_bytes) && r.U32(&replacement) &&
         r.U32(&t.heat_half_life_frames) && r.U32(&t.prefetch_blocks) &&
         r.U32(&t.rebuild_every_blocks) && r.U32(&t.rebuild_every_seconds) &&
         r.F32(&c.weights.model) && r.F32(&c.weights.track) &&
         r.F32(&c.weights.iou) && r.F32(&c.weights.scene);
    t.replacement = static_cast<Replacement>(replacement);
  }
  if (ok && version >= 3) {
    ok = r.U32(&c.groups_per_block);
  } else {
    c.groups_per_block = 1;  // Its blocks have no token groups.
  }
  // Streams from before version 4 keep the score they were created with:
  // SUMMED, the only one there was (their ranking and gates do not change
  // under them on an upgrade).
  uint32_t score = static_cast<uint32_t>(ScoreMode::kSummed);
  if (ok && version >= 4) ok = r.U32(&score);
  c.weights.score = static_cast<ScoreMode>(score);
  // Before version 5 the score named the scorer (defaults fill it in).
  if (ok && version >= 5) ok = r.Str(&c.weights.scorer);
  // Before version 6 no stream set the identity share (the default).
  uint8_t has_share = 0;
  float share = 0;
  if (ok && version >= 6) ok = r.U8(&has_share) && r.F32(&share);
  if (has_share) c.weights.identity_share = share;
  // Before version 7 every stream kept full precision on disk.
  uint32_t precision = static_cast<uint32_t>(ColdPrecision::kFull);
  if (ok && version >= 7) ok = r.U32(&precision);
  c.tiers.cold_precision = static_cast<ColdPrecision>(precision);
  // Before version 8 every stream wrote its frames as appended.
  uint32_t ingest = static_cast<uint32_t>(ColdPrecision::kFull);
  if (ok && version >= 8) ok = r.U32(&ingest);
  c.tiers.ingest_precision = static_cast<ColdPrecision>(ingest);
  if (!ok || !r.Done()) return Corrupt("config", bytes.size());
  c.segment_mode = static_cast<SegmentMode>(mode);
  c.geometry.dtype = static_cast<DType>(dtype);
  return c;
}

std::string EncodeState(const StreamState& s) {
  Writer w;
  w.U8(kStateVersion);
  w.U8(s.closed ? 1 : 0);
  w.U64(static_cast<uint64_t>(s.last_frame));
  w.U64(s.next_token_position);
  w.U64(s.frames);
  w.U64(s.tokens);
  w.U64(s.payload_bytes);
  w.U64(s.next_block_id);
  w.U64(s.open_block_first_frame);
  w.U32(s.open_block_frames);
  w.U64(s.open_block_first_position);
  w.U32(s.open_block_tokens);
  w.U64(s.open_block_payload_bytes);
  w.U32(s.scene_dim);
  w.U32(s.frame_part_tokens);
  return w.Take();
}

absl::StatusOr<StreamState> DecodeState(absl::string_view bytes) {
  Reader r(bytes);
  StreamState s;
  uint8_t version = 0, closed = 0;
  uint64_t last = 0;
  const bool ok =
      r.U8(&version) && version == kStateVersion && r.U8(&closed) &&
      r.U64(&last) && r.U64(&s.next_token_position) && r.U64(&s.frames) &&
      r.U64(&s.tokens) && r.U64(&s.payload_bytes) && r.U64(&s.next_block_id) &&
      r.U64(&s.open_block_first_frame) && r.U32(&s.open_block_frames) &&
      r.U64(&s.open_block_first_position) && r.U32(&s.open_block_tokens) &&
      r.U64(&s.open_block_payload_bytes) &&
      (r.Done() || (r.U32(&s.scene_dim) &&
                    (r.Done() || (r.U32(&s.frame_part_tokens) && r.Done()))));
  if (!ok) return Corrupt("state", bytes.size());
  s.closed = closed != 0;
  s.last_frame = static_cast<int64_t>(last);
  return s;
}

std::string EncodeSignals(const FrameSignals& signals) {
  Writer w;
  w.U8(1);
  w.U32(static_cast<uint32_t>(signals.detections.size()));
  for (const Detection& d : signals.detections) {
    w.U64(d.track_id);
    w.U32(d.class_id);
    for (float v : {d.x_min, d.y_min, d.x_max, d.y_max, d.score}) w.F32(v);
  }
  w.Floats(signals.scene_embedding);
  return w.Take();
}

absl::StatusOr<FrameSignals> DecodeSignals(absl::string_view bytes) {
  Reader r(bytes);
  FrameSignals s;
  uint8_t version = 0;
  uint32_t n = 0;
  bool ok = r.U8(&version) && version == 1 && r.U32(&n) && n <= (1u << 20);
  for (uint32_t i = 0; ok && i < n; ++i) {
    Detection d;
    ok = r.U64(&d.track_id) && r.U32(&d.class_id) && r.F32(&d.x_min) &&
         r.F32(&d.y_min) && r.F32(&d.x_max) && r.F32(&d.y_max) &&
         r.F32(&d.score);
    s.detections.push_back(d);
  }
  ok = ok && r.Floats(&s.scene_embedding) && r.Done();
  if (!ok) return Corrupt("signals", bytes.size());
  return s;
}

namespace {

// Version 5 adds groups_pending after the codes; a stand-in leaves the
// groups out (empty) and sets it.
std::string EncodeBlockRecord(const BlockRecord& b, bool stand_in) {
  Writer w;
  w.U8(kBlockVersion);
  w.U64(b.info.id);
  w.U64(b.info.first_frame);
  w.U64(b.info.last_frame);
  w.U64(b.info.first_token_position);
  w.U64(b.info.end_token_position);
  w.U32(b.info.token_count);
  w.U64(b.info.payload_bytes);
  w.U32(static_cast<uint32_t>(b.info.tier));
  w.Floats(b.summary);
  w.U8(b.info.degraded ? 1 : 0);
  w.U8(static_cast<uint8_t>(b.disk));
  w.U32(static_cast<uint32_t>(b.frame_tokens.size()));
  for (uint32_t t : b.frame_tokens) w.U32(t);
  w.U32(static_cast<uint32_t>(b.tracks.size()));
  for (const TrackPresence& t : b.tracks) {
    w.U64(t.track_id);
    w.U32(t.frames);
    w.U64(t.first_frame);
    w.U64(t.last_frame);
    for (float v : t.box) w.F32(v);
  }
  w.Floats(b.scene);
  w.U64(b.last_access_frame);
  w.F32(b.hits);
  w.U64(b.last_hit_frame);
  if (stand_in) {
    w.Floats({});
    w.Str("");
    w.Str("");
  } else {
    w.Floats(b.group_summaries);
    w.Str(absl::string_view(reinterpret_cast<const char*>(b.token_group.data()),
                            b.token_group.size()));
    w.Str(b.token_codes);
  }
  w.U8(stand_in || b.groups_pending ? 1 : 0);
  return w.Take();
}

}  // namespace

std::string EncodeBlock(const BlockRecord& b) {
  return EncodeBlockRecord(b, /*stand_in=*/false);
}

std::string EncodeBlockStandIn(const BlockRecord& b) {
  return EncodeBlockRecord(b, /*stand_in=*/true);
}

absl::StatusOr<BlockRecord> DecodeBlock(absl::string_view bytes) {
  Reader r(bytes);
  BlockRecord b;
  uint8_t version = 0, degraded = 0, disk = 0;
  uint32_t tier = 0, n = 0;
  bool ok = r.U8(&version) && version >= 1 && version <= kBlockVersion &&
            r.U64(&b.info.id) && r.U64(&b.info.first_frame) &&
            r.U64(&b.info.last_frame) && r.U64(&b.info.first_token_position) &&
            r.U64(&b.info.end_token_position) && r.U32(&b.info.token_count) &&
            r.U64(&b.info.payload_bytes) && r.U32(&tier) &&
            r.Floats(&b.summary);
  if (ok && version >= 2) {
    ok = r.U8(&degraded) && r.U8(&disk) && disk <= 4 && r.U32(&n) &&
         n <= (1u << 20);
    for (uint32_t i = 0; ok && i < n; ++i) {
      uint32_t t;
      ok = r.U32(&t);
      b.frame_tokens.push_back(t);
    }
    ok = ok && r.U32(&n) && n <= (1u << 20);
    for (uint32_t i = 0; ok && i < n; ++i) {
      TrackPresence t;
      ok = r.U64(&t.track_id) && r.U32(&t.frames) && r.U64(&t.first_frame) &&
           r.U64(&t.last_frame) && r.F32(&t.box[0]) && r.F32(&t.box[1]) &&
           r.F32(&t.box[2]) && r.F32(&t.box[3]);
      b.tracks.push_back(t);
    }
    ok = ok && r.Floats(&b.scene) && r.U64(&b.last_access_frame) &&
         r.F32(&b.hits) && r.U64(&b.last_hit_frame);
  }
  if (ok && version >= 3) {
    std::string groups;
    ok = r.Floats(&b.group_summaries) && r.Str(&groups);
    b.token_group.assign(groups.begin(), groups.end());
  }
  if (ok && version >= 4) ok = r.Str(&b.token_codes);
  uint8_t pending = 0;
  if (ok && version >= 5) ok = r.U8(&pending) && pending <= 1;
  if (!ok || !r.Done()) return Corrupt("block", bytes.size());
  b.groups_pending = pending != 0;
  b.info.tier = static_cast<Tier>(tier);
  b.info.degraded = degraded != 0;
  b.disk = static_cast<DiskForm>(disk);
  return b;
}

}  // namespace kvmem
