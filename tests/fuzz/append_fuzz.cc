// Fuzz target: the append path a server call drives (FrameIngest over
// FrameHeader / PayloadChunk messages, as AppendFrames and Session feed it)
// interleaved with recalls, block reads, maintenance and close, on an
// engine over the in-memory store. Any sequence must leave only statuses:
// no crash, no sanitizer report, and the invariants below.
//
// The engine persists across inputs (as a server's does); each input opens
// its own stream and deletes it at the end, so inputs stay independent and
// the fuzzer is not paying for an engine (threads, store) per input.
//
// Input: one byte picking the stream's index kind, token groups, demotion
// and eviction, then
// operations, each an opcode byte and its fields (see the switch).
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/memory_engine.h"
#include "server/service/frame_ingest.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvmem {
namespace {

StreamConfig Config(uint8_t pick) {
  StreamConfig c;
  c.geometry = {2, 1, 4, DType::kFp16, 4};  // 2 layers x 1 head x dim 4.
  c.hot_window_tokens = 8;
  c.frames_per_block = 2;
  c.indexed_layers = {1};
  const char* kinds[] = {"Flat", "Progressive", "HNSW8", "SQ8"};
  c.index_factory = kinds[pick % 4];
  c.groups_per_block = (pick / 4) % 2 ? 2 : 0;
  c.tiers.warm_budget_bytes = (pick / 8) % 2 ? 1 : 0;  // Demote every block.
  // Keep ~2 blocks on disk: evictions, and runs of evicted blocks leaving
  // RAM (Stream::BlockTable).
  c.tiers.storage_cap_bytes = (pick / 16) % 2 ? 200 : 0;
  c.tiers.rebuild_every_blocks = 3;
  return c;
}

MemoryEngine* PersistentEngine() {
  static MemoryEngine* engine = [] {
    EngineOptions eo;
    eo.acknowledge_interval_ms = 0;
    auto e = MemoryEngine::Open(NewMemColdStore(), eo);
    FUZZ_CHECK(e.ok());
    return e->release();  // Lives as long as the process.
  }();
  return engine;
}

void RunOn(MemoryEngine* engine, fuzz::Reader& in);

void Run(fuzz::Reader& in) {
  MemoryEngine* engine = PersistentEngine();
  RunOn(engine, in);
  // The next input starts from an engine without this stream.
  engine->WaitForBackground();
  const absl::Status deleted = engine->DeleteStream("f");
  FUZZ_CHECK(deleted.ok() || absl::IsNotFound(deleted));
  FUZZ_CHECK(engine->stream_count() == 0);
}

void RunOn(MemoryEngine* engine, fuzz::Reader& in) {
  const StreamConfig config = Config(in.Take<uint8_t>());
  if (!engine->OpenStream("f", config).ok()) return;
  StreamHandle stream = *engine->Find("f");
  std::optional<FrameIngest> call(stream);
  int64_t durable = -1;
  for (int ops = 0; ops < 64 && !in.empty(); ++ops) {
    const uint8_t op = in.Take<uint8_t>();
    absl::StatusOr<std::optional<AppendResult>> fed =
        std::optional<AppendResult>();
    switch (op % 6) {
      case 0: {  // A frame header: index and position relative to the next.
        v1::FrameHeader h;
        h.set_frame_index(durable + 1 +
                          static_cast<int8_t>(in.Take<uint8_t>()) / 64);
        // At the next position or a little after; 0 means one before it
        // (an overlap, or a wrap past 2^62 on an empty stream).
        h.set_first_token_position(stream.Stats().next_token_position +
                                   in.Take<uint8_t>() % 5 - 1);
        h.set_token_count(in.Take<uint8_t>() % 6);
        const uint16_t declared = in.Take<uint16_t>() % 160;
        h.set_payload_bytes(declared);
        h.set_payload(in.Bytes(in.Take<uint8_t>() % 160));
        if (in.Take<uint8_t>() % 4 == 0) {
          auto* d = h.mutable_signals()->add_detections();
          d->set_track_id(in.Take<uint8_t>());
          d->set_x_min(in.Take<float>());
          d->set_x_max(in.Take<float>());
        }
        fed = call->Feed(&h, nullptr);
        break;
      }
      case 1: {  // A chunk.
        v1::PayloadChunk c;
        c.set_frame_index(durable + 1 + in.Take<uint8_t>() % 2);
        c.set_offset(in.Take<uint8_t>());
        c.set_data(in.Bytes(in.Take<uint8_t>() % 160));
        fed = call->Feed(nullptr, &c);
        break;
      }
      case 2: {  // A recall.
        RecallQuery q;
        const size_t dim = in.Take<uint8_t>() % 2 ? 4 : in.Take<uint8_t>() % 9;
        for (size_t i = 0; i < dim; ++i) q.query.push_back(in.Take<float>());
        q.top_k = in.Take<uint8_t>();
        q.max_tokens = in.Take<uint16_t>();
        q.window_fraction = in.Take<uint8_t>() / 200.0f;
        q.per_layer = in.Take<uint8_t>() % 2;
        q.current_token_position = in.Take<uint8_t>();
        auto r = engine->Recall("f", q);
        if (r.ok()) {
          FUZZ_CHECK(r->total_tokens <= r->budget_tokens);
          for (const auto& b : r->blocks) FUZZ_CHECK(std::isfinite(b.score));
        }
        break;
      }
      case 3: {  // Read a block's payload.
        const uint64_t block = in.Take<uint8_t>() % 8;
        std::vector<uint32_t> layers;
        if (in.Take<uint8_t>() % 2) layers.push_back(in.Take<uint8_t>() % 3);
        auto r = stream.ReadBlockPayload(block,
                                         in.Take<uint8_t>() % 2
                                             ? PayloadLayout::kBlockLayerMajor
                                             : PayloadLayout::kFrameMajor,
                                         layers);
        (void)r;
        break;
      }
      case 4:
        (void)engine->RunMaintenance("f");
        break;
      case 5:  // The call ends: a partial frame is dropped, a new call starts.
        if (in.Take<uint8_t>() % 4 == 0) (void)engine->CloseStream("f");
        (void)call->CheckNoPartialFrame();
        call.emplace(stream);
        break;
    }
    if (!fed.ok()) {
      call.emplace(stream);  // An append error ends the call.
    } else if (fed->has_value()) {
      FUZZ_CHECK((*fed)->last_durable_frame == durable + 1);
      durable = (*fed)->last_durable_frame;
    }
    FUZZ_CHECK(stream.Stats().last_durable_frame == durable);
  }
  engine->WaitForBackground();
}

}  // namespace
}  // namespace kvmem

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvmem::fuzz::Reader in(data, size);
  kvmem::Run(in);
  return 0;
}

// Seeds: each index kind with and without demotion, eviction and groups:
// four whole frames, then a recall, a read, maintenance; then a frame split
// into chunks.
std::vector<std::string> KvmemFuzzSeeds() {
  std::vector<std::string> seeds;
  auto frame = [](std::string* s, uint8_t tokens, uint8_t inline_bytes) {
    const uint16_t bytes = 32 * tokens;  // 2 layers x K,V x 4 dims x fp16.
    s->push_back(0);                     // Op: header.
    s->push_back(0);                     // The next frame_index.
    s->push_back(1);                     // At the next position.
    s->push_back(static_cast<char>(tokens));
    s->append(reinterpret_cast<const char*>(&bytes), 2);
    s->push_back(static_cast<char>(inline_bytes));
    for (int i = 0; i < inline_bytes / 2; ++i) s->append("\x00\x3c", 2);
    s->push_back(1);  // No detections.
  };
  for (uint8_t pick = 0; pick < 32; ++pick) {
    std::string s(1, static_cast<char>(pick));
    for (int f = 0; f < 4; ++f) frame(&s, 2, 64);
    s.append("\x02\x01", 2);  // Recall, dim 4.
    for (float v : {1.0f, -0.5f, 0.25f, 2.0f}) {
      s.append(reinterpret_cast<const char*>(&v), 4);
    }
    s.append("\x04\x00\x01\x00\x00\x00", 6);  // top_k 4, 256 tokens...
    s.append("\x03\x00\x01\x01\x01", 5);      // Read block 0, layer 1.
    s.append("\x04", 1);                      // Maintenance.
    // A frame of 3 tokens (96 bytes): 40 inline, then a 56-byte chunk.
    frame(&s, 3, 40);
    s.append("\x01\x00\x28\x38", 4);
    for (int i = 0; i < 28; ++i) s.append("\x00\xbc", 2);
    seeds.push_back(s);
  }
  return seeds;
}
