#include "engine/stream_config.h"

#include <cmath>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvmem {

bool StreamConfig::operator==(const StreamConfig& o) const {
  const Geometry& a = geometry;
  const Geometry& b = o.geometry;
  return a.layers == b.layers && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim && a.dtype == b.dtype &&
         a.max_tokens_per_frame == b.max_tokens_per_frame &&
         hot_window_tokens == o.hot_window_tokens &&
         frames_per_block == o.frames_per_block &&
         indexed_layers == o.indexed_layers &&
         index_factory == o.index_factory && default_top_k == o.default_top_k &&
         default_max_tokens == o.default_max_tokens &&
         gate_temperature == o.gate_temperature && labels == o.labels;
}

absl::Status ValidateStreamId(absl::string_view id, absl::string_view field) {
  if (id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  if (id.size() > kMaxStreamIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", id.size(), " bytes; at most ",
                     kMaxStreamIdBytes, " allowed"));
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", absl::CHexEscape(id),
                       "\" has a character outside [A-Za-z0-9._:-]"));
    }
  }
  return absl::OkStatus();
}

StreamConfig WithDefaults(const StreamConfig& config) {
  StreamConfig c = config;
  if (c.frames_per_block == 0) c.frames_per_block = kDefaultFramesPerBlock;
  if (c.indexed_layers.empty()) {
    for (uint32_t l = 0; l < c.geometry.layers && l < 1024; ++l) {
      c.indexed_layers.push_back(l);
    }
  }
  if (c.index_factory.empty()) c.index_factory = "Flat";
  if (c.default_top_k == 0) c.default_top_k = kDefaultTopK;
  if (c.default_max_tokens == 0) {
    c.default_max_tokens = c.hot_window_tokens / 5;
    if (c.default_max_tokens == 0) c.default_max_tokens = 1;
  }
  if (c.gate_temperature == 0.0f) c.gate_temperature = 1.0f;
  return c;
}

namespace {
absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t lo,
                        uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", value, "; must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status ValidateStreamConfig(const StreamConfig& config) {
  const Geometry& g = config.geometry;
  for (auto st : {CheckRange("config.geometry.layers", g.layers, 1, 1024),
                  CheckRange("config.geometry.kv_heads", g.kv_heads, 1, 1024),
                  CheckRange("config.geometry.head_dim", g.head_dim, 1, 4096),
                  CheckRange("config.geometry.max_tokens_per_frame",
                             g.max_tokens_per_frame, 1, 65536),
                  CheckRange("config.hot_window_tokens",
                             config.hot_window_tokens, 1, 1u << 24),
                  CheckRange("config.block_policy.frames_per_block",
                             config.frames_per_block, 1, 4096),
                  CheckRange("config.recall_defaults.top_k",
                             config.default_top_k, 1, kMaxTopK)}) {
    if (!st.ok()) return st;
  }
  if (DTypeBytes(g.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.geometry.dtype is ", static_cast<uint32_t>(g.dtype), " (",
        DTypeName(g.dtype), "); use FP16, BF16 or FP32"));
  }
  // One frame must fit comfortably in memory: 1 GiB cap.
  const uint64_t frame_bytes = FramePayloadBytes(g, g.max_tokens_per_frame);
  if (frame_bytes > (1ull << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.geometry describes ", frame_bytes,
        " payload bytes per frame at max_tokens_per_frame; at most 1 GiB"));
  }
  std::set<uint32_t> seen;
  for (uint32_t layer : config.indexed_layers) {
    if (layer >= g.layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.index_policy.indexed_layers has layer ", layer,
                       "; the geometry has ", g.layers, " layers"));
    }
    if (!seen.insert(layer).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.index_policy.indexed_layers lists layer ", layer, " twice"));
    }
  }
  if (static_cast<uint64_t>(config.indexed_layers.size()) * g.kv_heads *
          g.head_dim >
      (1u << 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("summary dimension ",
                     static_cast<uint64_t>(config.indexed_layers.size()) *
                         g.kv_heads * g.head_dim,
                     " (indexed_layers x kv_heads x head_dim) exceeds 65536"));
  }
  if (config.index_factory != "Flat") {
    return absl::InvalidArgumentError(
        absl::StrCat("config.index_policy.index_factory \"",
                     absl::CHexEscape(config.index_factory),
                     "\" is not supported; v1 supports \"Flat\""));
  }
  if (!std::isfinite(config.gate_temperature) ||
      config.gate_temperature <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.recall_defaults.gate_temperature is ",
                     config.gate_temperature, "; must be finite and > 0"));
  }
  if (config.labels.size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.labels has ", config.labels.size(), " entries; at most 16"));
  }
  for (const auto& [k, v] : config.labels) {
    if (k.empty() || k.size() > 128 || v.size() > 128) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.labels entry \"", absl::CHexEscape(k.substr(0, 64)),
          "\" must have a 1..128-byte key and a value of at most "
          "128 bytes"));
    }
  }
  return absl::OkStatus();
}

uint64_t LayerSliceElements(const Geometry& g, uint32_t token_count) {
  return static_cast<uint64_t>(g.kv_heads) * token_count * g.head_dim;
}

uint64_t FramePayloadBytes(const Geometry& g, uint32_t token_count) {
  return static_cast<uint64_t>(g.layers) * 2 *
         LayerSliceElements(g, token_count) * DTypeBytes(g.dtype);
}

uint32_t SummaryDim(const StreamConfig& config) {
  return static_cast<uint32_t>(EffectiveIndexedLayers(config).size()) *
         config.geometry.kv_heads * config.geometry.head_dim;
}

std::vector<uint32_t> EffectiveIndexedLayers(const StreamConfig& config) {
  return WithDefaults(config).indexed_layers;
}

}  // namespace kvmem
