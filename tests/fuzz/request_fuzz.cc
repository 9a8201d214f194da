// Fuzz target: the unary requests' validation and the engine behind it.
// The input is protobuf text format: an OpenStreamRequest (its config goes
// through the server's conversion and ValidateStreamConfig), then, after a
// line "----", a RecallRequest run against the stream once a few frames
// are in. Any input must give statuses only: no crash, no sanitizer report,
// no allocation the config's limits do not allow.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/memory_engine.h"
#include "engine/stream_config.h"
#include "google/protobuf/text_format.h"
#include "kvmem/v1/service.pb.h"
#include "server/service/proto_convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvmem;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t cut = text.find("\n----\n");
  v1::OpenStreamRequest open;
  v1::RecallRequest recall;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowPartialMessage(true);
  if (!parser.ParseFromString(text.substr(0, cut), &open)) return 0;
  if (cut != std::string::npos &&
      !parser.ParseFromString(text.substr(cut + 6), &recall)) {
    return 0;
  }
  auto engine = MemoryEngine::Open(NewMemColdStore());
  FUZZ_CHECK(engine.ok());
  const StreamConfig config = FromProto(open.config());
  auto opened = (*engine)->OpenStream(open.stream_id(), config);
  if (!opened.ok()) return 0;
  // Frames of up to 64 KiB (larger geometries are valid but slow to fill).
  const Geometry& g = opened->stats.config.geometry;
  const uint32_t tokens = 1;
  const uint64_t bytes = FramePayloadBytes(g, tokens);
  if (bytes <= (64u << 10)) {
    for (uint64_t i = 0; i < 6; ++i) {
      Frame f;
      f.index = i;
      f.first_token_position = i;
      f.token_count = tokens;
      f.payload.assign(bytes, static_cast<char>(0x21 + i));  // Finite halves.
      auto r = (*engine)->Append(open.stream_id(), std::move(f));
      if (!r.ok()) break;
    }
  }
  RecallQuery q = FromProto(recall);
  auto r = (*engine)->Recall(open.stream_id(), q);
  if (r.ok()) FUZZ_CHECK(r->total_tokens <= r->budget_tokens);
  (*engine)->WaitForBackground();
  return 0;
}

// Seeds: a stream per index kind, then a recall of each budget shape.
std::vector<std::string> KvmemFuzzSeeds() {
  std::vector<std::string> seeds;
  const std::string query =
      "query: [0.5, -1, 0.25, 2, 0.5, -1, 0.25, 2, 0.5, -1, 0.25, 2, 0.5, -1, "
      "0.25, 2, 0.5, -1, 0.25, 2, 0.5, -1, 0.25, 2, 0.5, -1, 0.25, 2, 0.5, -1, "
      "0.25, 2]\n";
  for (const char* index : {"Flat", "Progressive", "HNSW8", "SQ8"}) {
    const std::string open =
        std::string(
            "stream_id: \"cam\"\nconfig {\n  geometry { layers: 4 "
            "kv_heads: 2 head_dim: 16 dtype: DTYPE_FP16 "
            "max_tokens_per_frame: 4 }\n  hot_window_tokens: 2\n  "
            "block_policy { frames_per_block: 2 }\n  index_policy { "
            "indexed_layers: 1 index_factory: \"") +
        index + "\" }\n}\n";
    seeds.push_back(open + "\n----\n" + query +
                    "budget { top_k: 4 max_tokens: 8 }\n");
    seeds.push_back(open + "\n----\n" + query +
                    "budget { window_fraction: 0.5 }\nper_layer: true\n");
  }
  return seeds;
}
