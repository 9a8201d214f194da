// BlockReader's token reads of blocks kept as frames: the frames holding
// the tokens, or (frames stored in parts, engine/codec/frame_parts.h) only
// the parts holding them, gathered as they are.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/stream_copy.h"
#include "engine/codec/dtype.h"
#include "engine/codec/frame_codec.h"
#include "engine/codec/frame_parts.h"
#include "engine/stream_config.h"
#include "engine/tiers/block_reader.h"

namespace kvmem {
namespace {

// DATA_LOSS unless rec names a token count for each of its frames.
absl::Status CheckFrameTokens(const BlockRecord& rec) {
  const BlockInfo& info = rec.info;
  if (rec.frame_tokens.empty() ||
      rec.frame_tokens.size() != info.last_frame - info.first_frame + 1) {
    return absl::DataLossError(
        absl::StrCat("block ", info.id, " records ", rec.frame_tokens.size(),
                     " frames' token counts for frames ", info.first_frame,
                     "..", info.last_frame));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BlockReader::CheckFrameSizes(
    const BlockRecord& rec, const std::vector<std::string>& frames,
    const Geometry& g) {
  KVMEM_RETURN_IF_ERROR(CheckFrameTokens(rec));
  if (frames.size() != rec.frame_tokens.size()) {
    return absl::DataLossError(absl::StrCat("block ", rec.info.id, " read as ",
                                            frames.size(), " frames"));
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    const uint64_t want = FramePayloadBytes(g, rec.frame_tokens[i]);
    if (frames[i].size() != want) {
      return absl::DataLossError(
          absl::StrCat("frame ", rec.info.first_frame + i, " of block ",
                       rec.info.id, " has ", frames[i].size(), " bytes; its ",
                       rec.frame_tokens[i], " tokens need ", want));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockReader::LoadTokenFrames(const std::vector<uint32_t>& tokens,
                                          Snapshot* snap) const {
  KVMEM_RETURN_IF_ERROR(CheckFrameTokens(snap->rec));
  const std::vector<uint32_t>& per_frame = snap->rec.frame_tokens;
  const uint64_t base = snap->rec.info.first_frame;
  const uint32_t part = view_.frame_part_tokens();
  // The pieces to read: (frame in the block, part; part 0 of a whole
  // frame), ascending, each once. Offsets ascend (a bad list is refused
  // after the read, by the gather's check).
  std::vector<ColdStore::FramePart> refs;
  std::vector<uint32_t> firsts, counts;
  auto add = [&](uint32_t f, uint32_t frame_start, uint32_t p) {
    const uint32_t in_piece = part > 0 ? part : per_frame[f];
    if (!refs.empty() && refs.back().frame == base + f &&
        refs.back().part == p) {
      return;
    }
    refs.push_back({base + f, p});
    firsts.push_back(frame_start + p * in_piece);
    counts.push_back(std::min(in_piece, per_frame[f] - p * in_piece));
  };
  uint32_t f = 0, frame_start = 0;
  if (tokens.empty()) {
    for (; f < per_frame.size(); frame_start += per_frame[f++]) {
      const uint32_t n = part > 0 ? (per_frame[f] + part - 1) / part : 1;
      for (uint32_t p = 0; p < n; ++p) add(f, frame_start, p);
    }
  }
  for (uint32_t tok : tokens) {
    while (f < per_frame.size() && tok >= frame_start + per_frame[f]) {
      frame_start += per_frame[f++];
    }
    if (f == per_frame.size()) break;  // Past the block: refused later.
    add(f, frame_start, part > 0 ? (tok - frame_start) / part : 0);
  }
  const Geometry& g = view_.config().geometry;
  const ColdPrecision form = view_.config().tiers.ingest_precision;
  if (part > 0) {
    // A part as stored: FramePartBytes at full precision, else encoded.
    KVMEM_ASSIGN_OR_RETURN(
        snap->pieces,
        store_->GetFrameParts(view_.stream_id(),
                              EncodedFrameBytes(g, form, part), refs));
  } else if (!refs.empty()) {
    // Whole frames: one call for the range (one round trip where remote).
    KVMEM_ASSIGN_OR_RETURN(
        std::vector<std::string> frames,
        store_->GetFrames(view_.stream_id(), refs.front().frame,
                          refs.back().frame));
    // Only those holding tokens are kept.
    for (const ColdStore::FramePart& r : refs) {
      const uint64_t i = r.frame - refs.front().frame;
      if (i >= frames.size()) break;
      snap->pieces.push_back(std::move(frames[i]));
    }
  }
  if (snap->pieces.size() != refs.size()) {
    return absl::DataLossError(
        absl::StrCat(refs.size(), " pieces of the frames of block ",
                     snap->rec.info.id, " read as ", snap->pieces.size()));
  }
  for (std::string& piece : snap->pieces) {
    KVMEM_RETURN_IF_ERROR(DecodeStoredFrame(g, form, &piece));
  }
  snap->piece_first = std::move(firsts);
  snap->piece_tokens = std::move(counts);
  return absl::OkStatus();
}

absl::Status BlockReader::CheckPieceSizes(const Snapshot& snap) const {
  const Geometry& g = view_.config().geometry;
  for (size_t i = 0; i < snap.pieces.size(); ++i) {
    const uint32_t t = snap.piece_tokens[i];
    if (snap.pieces[i].size() != FramePayloadBytes(g, t)) {
      return absl::DataLossError(absl::StrCat(
          "the frame piece of tokens ", snap.piece_first[i], "..",
          snap.piece_first[i] + t - 1, " of block ", snap.rec.info.id, " has ",
          snap.pieces[i].size(), " bytes; its ", t, " tokens need ",
          FramePayloadBytes(g, t)));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockReader::GatherFromFrames(const Snapshot& snap,
                                           const std::vector<uint32_t>& tokens,
                                           const std::vector<uint32_t>& wanted,
                                           uint8_t* dst) const {
  const Geometry& g = view_.config().geometry;
  const size_t row = static_cast<size_t>(g.head_dim) * DTypeBytes(g.dtype);
  KVMEM_RETURN_IF_ERROR(CheckPieceSizes(snap));
  // Runs of consecutive tokens within one piece: (piece, first token in
  // it, count).
  struct Run {
    size_t piece;
    uint32_t first, count;
  };
  std::vector<Run> runs;
  size_t p = 0;
  for (uint32_t tok : tokens) {
    while (p < snap.pieces.size() &&
           tok >= snap.piece_first[p] + snap.piece_tokens[p]) {
      ++p;
    }
    if (p == snap.pieces.size() || tok < snap.piece_first[p]) {
      return absl::DataLossError(
          absl::StrCat("token ", tok, " of block ", snap.rec.info.id,
                       " is outside the frames read for it"));
    }
    const uint32_t local = tok - snap.piece_first[p];
    if (!runs.empty() && runs.back().piece == p &&
        runs.back().first + runs.back().count == local) {
      ++runs.back().count;
    } else {
      runs.push_back({p, local, 1});
    }
  }
  // A piece is [layer][K, V][kv_head][token][dim]; the destination per
  // wanted layer K then V, each [kv_head][token][dim].
  for (uint32_t l : wanted) {
    for (int kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (const Run& r : runs) {
          const uint32_t t = snap.piece_tokens[r.piece];
          const size_t head_rows =
              ((static_cast<size_t>(l) * 2 + kv) * g.kv_heads + h) * t;
          const char* src =
              snap.pieces[r.piece].data() + (head_rows + r.first) * row;
          StreamCopy(dst, src, r.count * row);
          dst += r.count * row;
        }
      }
    }
  }
  StreamFence();
  return absl::OkStatus();
}

}  // namespace kvmem
