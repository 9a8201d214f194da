#include "engine/tiers/block_reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/stream_copy.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/quantize.h"
#include "engine/stream_config.h"

namespace kvmem {

absl::StatusOr<BlockInfo> BlockReader::GetBlock(uint64_t block_id) const {
  kvmem::ReaderMutexLock lock(&view_.mu());
  if (view_.deleted()) return view_.DeletedError();
  if (!view_.blocks().Has(block_id)) return view_.MissingBlockError(block_id);
  const BlockEntry& e = view_.blocks()[block_id];
  if (e.rec.disk == DiskForm::kNone && !e.warm) {
    return absl::NotFoundError(absl::StrCat("block ", block_id, " of stream \"",
                                            view_.stream_id(),
                                            "\" was evicted"));
  }
  BlockInfo info = e.rec.info;
  info.tier = TierOf(e);
  return info;
}

absl::Status BlockReader::NotFoundIfDeleted() const {
  kvmem::ReaderMutexLock lock(&view_.mu());
  return view_.deleted() ? view_.DeletedError() : absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> BlockReader::WantedLayers(
    const std::vector<uint32_t>& layers) const {
  const Geometry& g = view_.config().geometry;
  KVMEM_RETURN_IF_ERROR(ValidateLayerList(g, layers));
  std::vector<uint32_t> wanted = layers;
  if (wanted.empty()) {
    for (uint32_t l = 0; l < g.layers; ++l) wanted.push_back(l);
  }
  return wanted;
}

absl::StatusOr<BlockReader::Snapshot> BlockReader::SnapshotBlock(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& wanted,
    const std::vector<uint32_t>* tokens) const {
  Snapshot snap;
  // A tier move may replace the block's durable form while we read it: the
  // block's generation is odd during a move and changes with it, so a read
  // that overlapped one is done again.
  for (int attempt = 0;; ++attempt) {
    uint64_t generation;
    {
      kvmem::ReaderMutexLock lock(&view_.mu());
      if (view_.deleted()) return view_.DeletedError();
      if (!view_.blocks().Has(block_id)) {
        return view_.MissingBlockError(block_id);
      }
      const BlockEntry& e = view_.blocks()[block_id];
      generation = e.generation;
      // The card only: a read needs the block's ids, form and frames, not
      // its summaries and token codes (13 MB a block at 7B: copied per
      // block read, 5-6 % of the server's samples in a 7B camera step).
      snap.rec.info = e.rec.info;
      snap.rec.disk = e.rec.disk;
      snap.rec.frame_tokens = e.rec.frame_tokens;
      snap.warm = e.warm;
      snap.info = e.rec.info;
      snap.info.tier = TierOf(e);
    }
    absl::Status loaded =
        absl::UnavailableError("a move of the block is being committed");
    std::unique_ptr<WarmBlock> block;
    if (generation % 2 == 0) {
      if (snap.warm) break;
      // Layer-major reads of a block stored as layers take the store's
      // records as they are (no detour through a WarmBlock).
      if (layout == PayloadLayout::kBlockLayerMajor &&
          (snap.rec.disk == DiskForm::kFull ||
           snap.rec.disk == DiskForm::kInt8 ||
           snap.rec.disk == DiskForm::kInt4)) {
        absl::StatusOr<std::vector<std::string>> r =
            LoadLayerRecords(snap.rec, wanted);
        loaded = r.status();
        if (r.ok()) snap.records = *std::move(r);
      } else if (tokens != nullptr && snap.rec.disk == DiskForm::kFrames) {
        // Only the frames holding the tokens, gathered from as they are
        // (no detour through a WarmBlock of the whole block).
        loaded = LoadTokenFrames(*tokens, &snap);
      } else {
        absl::StatusOr<std::unique_ptr<WarmBlock>> b = Load(snap.rec);
        loaded = b.status();
        if (b.ok()) block = *std::move(b);
      }
    }
    bool unchanged;
    {
      kvmem::ReaderMutexLock lock(&view_.mu());
      const BlockTable& blocks = view_.blocks();
      unchanged =
          blocks.Has(block_id) && blocks[block_id].generation == generation;
    }
    if (loaded.ok() && unchanged) {
      snap.warm = std::move(block);
      break;
    }
    if ((unchanged && generation % 2 == 0) || attempt == 10000) return loaded;
    snap.records.clear();
    snap.pieces.clear();
    snap.piece_first.clear();
    snap.piece_tokens.clear();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Had the stream been deleted (and its id reused) during the read, the
  // bytes could belong to the new stream.
  KVMEM_RETURN_IF_ERROR(NotFoundIfDeleted());
  return snap;
}

absl::StatusOr<std::vector<PayloadPiece>> BlockReader::ReadBlockPayload(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& layers, BlockInfo* info) const {
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint32_t> wanted,
                         WantedLayers(layers));
  KVMEM_ASSIGN_OR_RETURN(Snapshot snap,
                         SnapshotBlock(block_id, layout, wanted));
  if (info != nullptr) *info = snap.info;
  std::vector<PayloadPiece> pieces;
  const uint64_t first = snap.rec.info.first_frame;
  if (layout == PayloadLayout::kFrameMajor) {
    uint64_t f = first;
    for (std::string& bytes : snap.warm->ToFrames(snap.rec.frame_tokens)) {
      pieces.push_back(PayloadPiece::Owning(f++, 0, std::move(bytes)));
    }
    return pieces;
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (!snap.warm) {
      pieces.push_back(
          PayloadPiece::Owning(first, wanted[i], std::move(snap.records[i])));
      continue;
    }
    // Straight from the warm block's memory, K then V.
    PayloadPiece& p = pieces.emplace_back();
    p.frame_index = first;
    p.layer = wanted[i];
    p.parts = {snap.warm->K(wanted[i]), snap.warm->V(wanted[i])};
    p.keep = snap.warm;
  }
  return pieces;
}

std::pair<absl::string_view, absl::string_view> BlockReader::LayerSlices(
    const Snapshot& snap, const std::vector<uint32_t>& wanted, size_t i,
    size_t slice) {
  if (snap.warm) return {snap.warm->K(wanted[i]), snap.warm->V(wanted[i])};
  const absl::string_view record(snap.records[i]);
  return {record.substr(0, slice), record.substr(slice, slice)};
}

absl::StatusOr<uint64_t> BlockReader::ReadBlockPayloadInto(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
    BlockInfo* info) const {
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint32_t> wanted,
                         WantedLayers(layers));
  KVMEM_ASSIGN_OR_RETURN(Snapshot snap,
                         SnapshotBlock(block_id, layout, wanted));
  if (info != nullptr) *info = snap.info;
  const uint64_t bytes =
      BlockPayloadBytes(view_.config().geometry, snap.rec.info.token_count,
                        layout, wanted.size());
  if (bytes != capacity) {
    return absl::OutOfRangeError(
        absl::StrCat("block ", block_id, " has ", bytes, " payload bytes in ",
                     "this layout; the destination holds ", capacity));
  }
  if (layout == PayloadLayout::kFrameMajor) {
    snap.warm->CopyFrames(snap.rec.frame_tokens, dst);
    return bytes;
  }
  // Layer by layer, K then V, with streaming stores: the reader is the
  // client (a delivery), not this core.
  const uint64_t slice = bytes / wanted.size() / 2;
  for (size_t i = 0; i < wanted.size(); ++i, dst += 2 * slice) {
    const auto [k, v] = LayerSlices(snap, wanted, i, slice);
    StreamCopy(dst, k.data(), slice);
    StreamCopy(dst + slice, v.data(), slice);
  }
  StreamFence();
  return bytes;
}

namespace {

// Runs of consecutive offsets in `tokens`: (first token, count).
using TokenRuns = std::vector<std::pair<uint32_t, uint32_t>>;
TokenRuns RunsOf(const std::vector<uint32_t>& tokens) {
  TokenRuns runs;
  for (size_t i = 0; i < tokens.size();) {
    size_t j = i + 1;
    while (j < tokens.size() && tokens[j] == tokens[j - 1] + 1) ++j;
    runs.emplace_back(tokens[i], static_cast<uint32_t>(j - i));
    i = j;
  }
  return runs;
}

// How far ahead of the copy the source is prefetched, in bytes.
constexpr size_t kPrefetchAhead = 2048;
constexpr size_t kCopyPiece = 1024;

// The rows of `runs` (of t in a [kv_heads][t][row] slice) written to dst
// as [kv_heads][tokens][row], a copy per run. The slice is prefetched
// line by line kPrefetchAhead bytes ahead of the copy, gaps included.
uint8_t* GatherRows(absl::string_view slice, uint32_t t, const TokenRuns& runs,
                    uint32_t heads, size_t row, uint8_t* dst) {
  const char* const base = slice.data();
  const size_t head_bytes = static_cast<size_t>(t) * row;
  size_t pf = 0;  // Offsets in the slice: the prefetch cursor, the copy's.
  for (uint32_t h = 0; h < heads; ++h) {
    for (const auto& [first, count] : runs) {
      size_t at = h * head_bytes + first * row;
      const size_t stop = at + count * row;
      pf = std::max(pf, at);
      // Long runs in pieces, so the prefetches keep their distance.
      while (at < stop) {
        const size_t n = std::min(stop - at, kCopyPiece);
        const size_t want = std::min(slice.size(), at + n + kPrefetchAhead);
        for (; pf < want; pf += 64) __builtin_prefetch(base + pf, 0, 0);
        StreamCopy(dst, base + at, n);
        dst += n;
        at += n;
      }
    }
  }
  return dst;
}

}  // namespace

absl::StatusOr<uint64_t> BlockReader::ReadBlockTokensInto(
    uint64_t block_id, const std::vector<uint32_t>& tokens,
    const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
    BlockInfo* info) const {
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint32_t> wanted,
                         WantedLayers(layers));
  KVMEM_ASSIGN_OR_RETURN(
      Snapshot snap, SnapshotBlock(block_id, PayloadLayout::kBlockLayerMajor,
                                   wanted, &tokens));
  if (info != nullptr) *info = snap.info;
  const uint32_t t = snap.rec.info.token_count;
  KVMEM_RETURN_IF_ERROR(ValidateTokenList(tokens, t, block_id, "tokens"));
  // No tokens named: all of them, gathered the same way (one run per head).
  std::vector<uint32_t> every;
  if (tokens.empty()) {
    every.resize(t);
    for (uint32_t j = 0; j < t; ++j) every[j] = j;
  }
  return GatherTokens(snap, tokens.empty() ? every : tokens, wanted, dst,
                      capacity);
}

absl::StatusOr<uint64_t> BlockReader::GatherTokens(
    const Snapshot& snap, const std::vector<uint32_t>& tokens,
    const std::vector<uint32_t>& wanted, uint8_t* dst,
    uint64_t capacity) const {
  const uint64_t block_id = snap.rec.info.id;
  const uint32_t t = snap.rec.info.token_count;
  const Geometry& g = view_.config().geometry;
  const uint64_t bytes = BlockPayloadBytes(
      g, tokens.size(), PayloadLayout::kBlockLayerMajor, wanted.size());
  if (bytes != capacity) {
    return absl::OutOfRangeError(absl::StrCat(
        tokens.size(), " tokens of block ", block_id, " have ", bytes,
        " payload bytes; the destination holds ", capacity));
  }
  if (!snap.pieces.empty()) {
    KVMEM_RETURN_IF_ERROR(GatherFromFrames(snap, tokens, wanted, dst));
    return bytes;
  }
  const size_t row = static_cast<size_t>(g.head_dim) * DTypeBytes(g.dtype);
  const size_t slice = LayerSliceElements(g, t) * DTypeBytes(g.dtype);
  const TokenRuns runs = RunsOf(tokens);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const auto [k, v] = LayerSlices(snap, wanted, i, slice);
    dst = GatherRows(k, t, runs, g.kv_heads, row, dst);
    dst = GatherRows(v, t, runs, g.kv_heads, row, dst);
  }
  StreamFence();
  return bytes;
}

absl::StatusOr<std::vector<PayloadPiece>> BlockReader::ReadBlockTokens(
    uint64_t block_id, const std::vector<uint32_t>& tokens,
    const std::vector<uint32_t>& layers, BlockInfo* info) const {
  if (tokens.empty()) {
    return ReadBlockPayload(block_id, PayloadLayout::kBlockLayerMajor, layers,
                            info);
  }
  KVMEM_ASSIGN_OR_RETURN(const std::vector<uint32_t> wanted,
                         WantedLayers(layers));
  // Checked before the buffer is sized by them (again at the read).
  KVMEM_ASSIGN_OR_RETURN(const BlockInfo block, GetBlock(block_id));
  KVMEM_RETURN_IF_ERROR(
      ValidateTokenList(tokens, block.token_count, block_id, "tokens"));
  const Geometry& g = view_.config().geometry;
  const uint64_t layer_bytes =
      BlockPayloadBytes(g, tokens.size(), PayloadLayout::kBlockLayerMajor, 1);
  std::string bytes(layer_bytes * wanted.size(), '\0');
  BlockInfo read;
  KVMEM_RETURN_IF_ERROR(
      ReadBlockTokensInto(block_id, tokens, wanted,
                          reinterpret_cast<uint8_t*>(bytes.data()),
                          bytes.size(), &read)
          .status());
  if (info != nullptr) *info = read;
  // One buffer, a piece per layer pointing into it.
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  std::vector<PayloadPiece> pieces(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    pieces[i].frame_index = read.first_frame;
    pieces[i].layer = wanted[i];
    pieces[i].parts = {
        absl::string_view(*owned).substr(i * layer_bytes, layer_bytes)};
    pieces[i].keep = owned;
  }
  return pieces;
}

absl::StatusOr<std::unique_ptr<WarmBlock>> BlockReader::Load(
    const BlockRecord& rec) const {
  const Geometry& g = view_.config().geometry;
  switch (rec.disk) {
    case DiskForm::kFrames: {
      // Parts are built from as frames (no joined frames in between).
      std::vector<std::string> pieces;
      std::vector<uint32_t> tokens;
      KVMEM_RETURN_IF_ERROR(ReadFrames(rec, &pieces, &tokens));
      std::vector<absl::string_view> views(pieces.begin(), pieces.end());
      return WarmBlock::FromFrames(g, views, tokens);
    }
    case DiskForm::kFull:
    case DiskForm::kInt8:
    case DiskForm::kInt4: {
      std::vector<uint32_t> all(g.layers);
      for (uint32_t l = 0; l < g.layers; ++l) all[l] = l;
      KVMEM_ASSIGN_OR_RETURN(std::vector<std::string> layers,
                             LoadLayerRecords(rec, all));
      return WarmBlock::FromLayers(g, rec.info.token_count, layers);
    }
    case DiskForm::kNone:
      break;
  }
  return absl::NotFoundError(absl::StrCat("block ", rec.info.id,
                                          " of stream \"", view_.stream_id(),
                                          "\" was evicted"));
}

absl::Status BlockReader::ReadFrames(const BlockRecord& rec,
                                     std::vector<std::string>* pieces,
                                     std::vector<uint32_t>* tokens) const {
  if (view_.frame_part_tokens() > 0) {
    // Every part, each a frame of its tokens.
    Snapshot snap;
    snap.rec.info = rec.info;
    snap.rec.frame_tokens = rec.frame_tokens;
    KVMEM_RETURN_IF_ERROR(LoadTokenFrames({}, &snap));
    KVMEM_RETURN_IF_ERROR(CheckPieceSizes(snap));
    *pieces = std::move(snap.pieces);
    *tokens = std::move(snap.piece_tokens);
    return absl::OkStatus();
  }
  // One call for the block's frames (one round trip where remote).
  KVMEM_ASSIGN_OR_RETURN(
      *pieces, store_->GetFrames(view_.stream_id(), rec.info.first_frame,
                                 rec.info.last_frame));
  const StreamConfig& c = view_.config();
  for (std::string& frame : *pieces) {
    KVMEM_RETURN_IF_ERROR(
        DecodeStoredFrame(c.geometry, c.tiers.ingest_precision, &frame));
  }
  KVMEM_RETURN_IF_ERROR(CheckFrameSizes(rec, *pieces, c.geometry));
  *tokens = rec.frame_tokens;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> BlockReader::LoadLayerRecords(
    const BlockRecord& rec, const std::vector<uint32_t>& layers) const {
  const Geometry& g = view_.config().geometry;
  const uint64_t want =
      2 * LayerSliceElements(g, rec.info.token_count) * DTypeBytes(g.dtype);
  // One batched read (one round trip where the store is remote).
  KVMEM_ASSIGN_OR_RETURN(
      std::vector<std::string> records,
      store_->GetBlockLayers(view_.stream_id(), rec.info.id, layers));
  std::vector<std::string> out;
  out.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const uint32_t l = layers[i];
    std::string bytes = std::move(records[i]);
    if (rec.disk == DiskForm::kInt8) {
      KVMEM_ASSIGN_OR_RETURN(bytes,
                             DequantizeLayer(g, rec.info.token_count, bytes));
    } else if (rec.disk == DiskForm::kInt4) {
      KVMEM_ASSIGN_OR_RETURN(
          bytes, DequantizeLayerInt4(g, rec.info.token_count, bytes));
    }
    if (bytes.size() != want) {
      return absl::DataLossError(absl::StrCat("layer ", l, " of block ",
                                              rec.info.id, " has ",
                                              bytes.size(), " bytes"));
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

}  // namespace kvmem
