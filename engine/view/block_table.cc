#include "engine/view/block_table.h"

#include "engine/codec/frame_codec.h"
#include "engine/codec/quantize.h"

namespace kvmem {

Tier TierOf(const BlockEntry& e) {
  // A staged copy sits in the stage buffer; the block's tier is still where
  // its durable copy is until a query confirms it.
  if (e.warm && !e.staged) return Tier::kWarm;
  switch (e.rec.disk) {
    case DiskForm::kFrames:
    case DiskForm::kFull:
      return Tier::kCold;
    case DiskForm::kInt8:
    case DiskForm::kInt4:
      return Tier::kDegraded;
    case DiskForm::kNone:
      return Tier::kEvicted;
  }
  return Tier::kUnspecified;
}

uint64_t DiskBytes(const StreamConfig& c, const BlockRecord& rec) {
  const Geometry& g = c.geometry;
  switch (rec.disk) {
    case DiskForm::kFrames:
      if (FramesEncoded(c.tiers.ingest_precision)) {
        return EncodedFrameBytes(g, c.tiers.ingest_precision,
                                 rec.info.token_count);
      }
      return rec.info.payload_bytes;
    case DiskForm::kFull:
      return rec.info.payload_bytes;
    case DiskForm::kInt8:
      return g.layers * QuantizedLayerBytes(g, rec.info.token_count);
    case DiskForm::kInt4:
      return g.layers * Int4LayerBytes(g, rec.info.token_count);
    case DiskForm::kNone:
      return 0;
  }
  return 0;
}

}  // namespace kvmem
