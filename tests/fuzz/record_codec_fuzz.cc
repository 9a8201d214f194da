// Fuzz target: the record decoders recovery runs over what RocksDB holds
// (stream config, stream state, frame signals, block records). Arbitrary
// bytes must give a status, never a crash or an allocation the bytes cannot
// justify; whatever decodes must re-encode to bytes that decode to the same
// record (encode(decode(x)) is a fixed point).
#include <cstdint>
#include <string>
#include <vector>

#include "engine/codec/record_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvmem {
namespace {

template <typename Decode, typename Encode>
void RoundTrip(absl::string_view bytes, Decode decode, Encode encode) {
  auto first = decode(bytes);
  if (!first.ok()) return;
  const std::string once = encode(*first);
  auto second = decode(once);
  FUZZ_CHECK(second.ok());
  FUZZ_CHECK(encode(*second) == once);
}

}  // namespace
}  // namespace kvmem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvmem;
  if (size == 0) return 0;
  // The first byte picks the decoder; the rest is the record.
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                                size - 1);
  switch (data[0] % 4) {
    case 0:
      RoundTrip(bytes, DecodeConfig, EncodeConfig);
      break;
    case 1:
      RoundTrip(bytes, DecodeState, EncodeState);
      break;
    case 2:
      RoundTrip(bytes, DecodeSignals, EncodeSignals);
      break;
    case 3:
      RoundTrip(bytes, DecodeBlock, EncodeBlock);
      break;
  }
  return 0;
}

// Seeds: one valid record of each kind, behind its selector byte.
std::vector<std::string> KvmemFuzzSeeds() {
  using namespace kvmem;
  StreamConfig c;
  c.geometry = {2, 2, 8, DType::kFp16, 16};
  c.hot_window_tokens = 64;
  c.frames_per_block = 4;
  c.indexed_layers = {1};
  c.index_factory = "Progressive";
  c.groups_per_block = 2;
  StreamState st;
  st.last_frame = 41;
  st.frames = 42;
  st.next_block_id = 10;
  FrameSignals sig;
  sig.detections.push_back({7, 1, 0.1f, 0.2f, 0.5f, 0.6f, 0.9f});
  sig.scene_embedding = {0.5f, -1.0f, 2.0f};
  BlockRecord b;
  b.info.id = 3;
  b.info.first_frame = 12;
  b.info.last_frame = 15;
  b.info.token_count = 64;
  b.frame_tokens = {16, 16, 16, 16};
  b.summary.assign(16, 0.25f);
  b.group_summaries.assign(32, -0.5f);
  b.token_group.assign(64, 1);
  b.tracks.push_back({7, 4, 12, 15, {0.1f, 0.2f, 0.5f, 0.6f}});
  b.scene = {1.0f, 2.0f};
  return {std::string(1, '\0') + EncodeConfig(c),
          std::string(1, '\1') + EncodeState(st),
          std::string(1, '\2') + EncodeSignals(sig),
          std::string(1, '\3') + EncodeBlock(b)};
}
