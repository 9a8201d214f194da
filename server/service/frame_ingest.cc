#include "server/service/frame_ingest.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/stream_config.h"
#include "server/service/proto_convert.h"

namespace kvmem {

FrameIngest::FrameIngest(StreamHandle stream, Admit admit)
    : stream_(std::move(stream)), admit_(std::move(admit)) {}

absl::StatusOr<std::optional<AppendResult>> FrameIngest::OnHeader(
    v1::FrameHeader* header) {
  if (frame_) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame ", header->frame_index(), " started before frame ",
                     frame_->index, " was complete (", frame_->payload.size(),
                     " of ", expected_bytes_, " bytes received)"));
  }
  const Geometry& g = stream_.config().geometry;
  if (header->token_count() == 0 ||
      header->token_count() > g.max_tokens_per_frame) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.token_count is ", header->token_count(),
                     "; must be in [1, ", g.max_tokens_per_frame, "]"));
  }
  const uint64_t want = FramePayloadBytes(g, header->token_count());
  if (header->payload_bytes() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame.payload_bytes is ", header->payload_bytes(), " for frame ",
        header->frame_index(), "; the stream's geometry needs ", want,
        " bytes for ", header->token_count(), " tokens"));
  }
  if (header->payload().size() > want) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame.payload has ", header->payload().size(),
                     " bytes; payload_bytes is ", want));
  }
  Frame frame = FrameFromHeader(*header);
  // Closed stream, an index out of order, a position overlapping: said
  // now, not after the whole payload has arrived.
  KVMEM_RETURN_IF_ERROR(stream_.CheckFrameHeader(frame));
  if (admit_) {
    absl::StatusOr<std::shared_ptr<void>> ticket = admit_(stream_, want);
    if (!ticket.ok()) return ticket.status();
    ticket_ = *std::move(ticket);
  }
  frame_ = std::move(frame);
  expected_bytes_ = want;
  frame_->payload = std::move(*header->mutable_payload());
  frame_->payload.reserve(want);
  return MaybeAppend();
}

absl::StatusOr<std::optional<AppendResult>> FrameIngest::OnChunk(
    v1::PayloadChunk* chunk) {
  if (!frame_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for frame ", chunk->frame_index(),
                     " arrived with no frame header before it"));
  }
  if (chunk->frame_index() != frame_->index) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.frame_index is ", chunk->frame_index(),
                     "; the open frame is ", frame_->index));
  }
  if (chunk->offset() != frame_->payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.offset is ", chunk->offset(), " for frame ", frame_->index,
        "; expected ", frame_->payload.size(), " (chunks must be contiguous)"));
  }
  if (frame_->payload.size() + chunk->data().size() > expected_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.data of ", chunk->data().size(),
                     " bytes at offset ", chunk->offset(), " overruns frame ",
                     frame_->index, "'s ", expected_bytes_, " payload bytes"));
  }
  frame_->payload.append(chunk->data());
  return MaybeAppend();
}

absl::StatusOr<std::optional<AppendResult>> FrameIngest::MaybeAppend() {
  if (frame_->payload.size() < expected_bytes_) return std::nullopt;
  Frame frame = std::move(*frame_);
  frame_.reset();
  const size_t bytes = frame.payload.size();
  absl::StatusOr<AppendResult> r = stream_.Append(std::move(frame));
  ticket_.reset();  // Stored (now retained bytes) or dropped.
  if (!r.ok()) return r.status();
  frames_written_ += 1;
  bytes_written_ += bytes;
  if (r->sealed_block) sealed_blocks_ += 1;
  return std::optional<AppendResult>(*r);
}

absl::StatusOr<std::optional<AppendResult>> FrameIngest::Feed(
    v1::FrameHeader* header, v1::PayloadChunk* chunk) {
  if (header != nullptr) return OnHeader(header);
  return OnChunk(chunk);
}

absl::Status FrameIngest::WithResumePoint(const absl::Status& s) const {
  // The engine's ALREADY_EXISTS names the resume point already.
  if (absl::StrContains(s.message(), "last durable frame is")) return s;
  return absl::Status(s.code(),
                      absl::StrCat(s.message(), "; stream \"", stream_.id(),
                                   "\" last durable frame is ",
                                   stream_.Stats().last_durable_frame));
}

absl::Status FrameIngest::CheckNoPartialFrame() const {
  if (!frame_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the call ended inside frame ", frame_->index, ": ",
                   frame_->payload.size(), " of ", expected_bytes_,
                   " payload bytes received; the frame was not stored"));
}

}  // namespace kvmem
