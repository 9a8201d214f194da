// Stream: block reads (GetBlock, payloads in either layout) and loading a
// block's layers from wherever they are.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/codec/quantize.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {

absl::StatusOr<BlockInfo> Stream::GetBlock(uint64_t block_id) const {
  kvmem::ReaderMutexLock lock(&mu_);
  if (deleted_) return DeletedError();
  if (!blocks_.Has(block_id)) return MissingBlockError(block_id);
  const BlockEntry& e = blocks_[block_id];
  if (e.rec.disk == DiskForm::kNone && !e.warm) {
    return absl::NotFoundError(absl::StrCat("block ", block_id, " of stream \"",
                                            id_, "\" was evicted"));
  }
  BlockInfo info = e.rec.info;
  info.tier = TierOf(e);
  return info;
}

absl::StatusOr<std::vector<PayloadPiece>> Stream::ReadBlockPayload(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& layers, BlockInfo* info) const {
  const Geometry& g = config_.geometry;
  for (uint32_t l : layers) {
    if (l >= g.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers has ", l, "; the stream has ", g.layers, " layers"));
    }
  }
  BlockRecord rec;
  std::shared_ptr<const WarmBlock> warm;
  // A tier move may replace the block's durable form while we read it: the
  // block's generation is odd during a move and changes with it, so a read
  // that overlapped one is done again.
  BlockInfo read_info;
  for (int attempt = 0;; ++attempt) {
    uint64_t generation;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      if (deleted_) return DeletedError();
      if (!blocks_.Has(block_id)) return MissingBlockError(block_id);
      const BlockEntry& e = blocks_[block_id];
      generation = e.generation;
      rec = e.rec;
      warm = e.warm;
      read_info = e.rec.info;
      read_info.tier = TierOf(e);
    }
    absl::StatusOr<std::unique_ptr<WarmBlock>> loaded =
        absl::UnavailableError("a move of the block is being committed");
    if (generation % 2 == 0) {
      if (warm) break;
      loaded = LoadBlock(rec);
    }
    bool unchanged;
    {
      kvmem::ReaderMutexLock lock(&mu_);
      unchanged =
          blocks_.Has(block_id) && blocks_[block_id].generation == generation;
    }
    if (loaded.ok() && unchanged) {
      warm = *std::move(loaded);
      break;
    }
    if ((unchanged && generation % 2 == 0) || attempt == 10000) {
      return loaded.status();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (info != nullptr) *info = read_info;
  // Had the stream been deleted (and its id reused) during the read, the
  // bytes could belong to the new stream.
  KVMEM_RETURN_IF_ERROR(NotFoundIfDeleted());
  std::vector<PayloadPiece> pieces;
  if (layout == PayloadLayout::kFrameMajor) {
    uint64_t f = rec.info.first_frame;
    for (std::string& bytes : warm->ToFrames(rec.frame_tokens)) {
      pieces.push_back({f++, 0, std::move(bytes)});
    }
    return pieces;
  }
  std::vector<uint32_t> wanted = layers;
  if (wanted.empty()) {
    for (uint32_t l = 0; l < g.layers; ++l) wanted.push_back(l);
  }
  for (uint32_t l : wanted) {
    pieces.push_back({rec.info.first_frame, l, warm->LayerRecord(l)});
  }
  return pieces;
}

absl::StatusOr<std::unique_ptr<WarmBlock>> Stream::LoadBlock(
    const BlockRecord& rec) const {
  const Geometry& g = config_.geometry;
  switch (rec.disk) {
    case DiskForm::kFrames: {
      std::vector<std::string> frames;
      for (uint64_t f = rec.info.first_frame; f <= rec.info.last_frame; ++f) {
        KVMEM_ASSIGN_OR_RETURN(std::string p, env_.store->GetFrame(id_, f));
        frames.push_back(std::move(p));
      }
      std::vector<absl::string_view> views(frames.begin(), frames.end());
      return WarmBlock::FromFrames(g, views, rec.frame_tokens);
    }
    case DiskForm::kFull:
    case DiskForm::kInt8: {
      std::vector<std::string> layers;
      for (uint32_t l = 0; l < g.layers; ++l) {
        KVMEM_ASSIGN_OR_RETURN(std::string bytes,
                               env_.store->GetBlockLayer(id_, rec.info.id, l));
        if (rec.disk == DiskForm::kInt8) {
          KVMEM_ASSIGN_OR_RETURN(
              bytes, DequantizeLayer(g, rec.info.token_count, bytes));
        }
        if (bytes.size() != 2 * LayerSliceElements(g, rec.info.token_count) *
                                DTypeBytes(g.dtype)) {
          return absl::DataLossError(absl::StrCat("layer ", l, " of block ",
                                                  rec.info.id, " has ",
                                                  bytes.size(), " bytes"));
        }
        layers.push_back(std::move(bytes));
      }
      return WarmBlock::FromLayers(g, rec.info.token_count, layers);
    }
    case DiskForm::kNone:
      break;
  }
  return absl::NotFoundError(absl::StrCat(
      "block ", rec.info.id, " of stream \"", id_, "\" was evicted"));
}

}  // namespace kvmem
