#include "engine/record_codec.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvmem {
namespace {

constexpr uint8_t kConfigVersion = 1;
constexpr uint8_t kStateVersion = 1;
constexpr uint8_t kBlockVersion = 1;

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
    out_.append(static_cast<const char*>(p), n);
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
  return w.Take();
}

absl::StatusOr<StreamConfig> DecodeConfig(absl::string_view bytes) {
  Reader r(bytes);
  StreamConfig c;
  uint8_t version = 0;
  uint32_t dtype = 0, n_layers = 0, n_labels = 0;
  bool ok = r.U8(&version) && version == kConfigVersion &&
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
  if (!ok || !r.Done()) return Corrupt("config", bytes.size());
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
      r.U64(&s.open_block_payload_bytes) && r.Done();
  if (!ok) return Corrupt("state", bytes.size());
  s.closed = closed != 0;
  s.last_frame = static_cast<int64_t>(last);
  return s;
}

std::string EncodeBlock(const BlockRecord& b) {
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
  return w.Take();
}

absl::StatusOr<BlockRecord> DecodeBlock(absl::string_view bytes) {
  Reader r(bytes);
  BlockRecord b;
  uint8_t version = 0;
  uint32_t tier = 0;
  const bool ok = r.U8(&version) && version == kBlockVersion &&
                  r.U64(&b.info.id) && r.U64(&b.info.first_frame) &&
                  r.U64(&b.info.last_frame) &&
                  r.U64(&b.info.first_token_position) &&
                  r.U64(&b.info.end_token_position) &&
                  r.U32(&b.info.token_count) && r.U64(&b.info.payload_bytes) &&
                  r.U32(&tier) && r.Floats(&b.summary) && r.Done();
  if (!ok) return Corrupt("block", bytes.size());
  b.info.tier = static_cast<Tier>(tier);
  return b;
}

}  // namespace kvmem
