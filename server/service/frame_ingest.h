// FrameIngest: turns the FrameHeader / PayloadChunk messages of one call
// (AppendFrames or Session) into whole frames and appends them to a stream.
// Checks each message as it arrives, so a bad chunk is rejected before the
// rest of its frame is buffered.
//
// Copies of KV bytes on the way from the socket to disk, counted:
//   1. gRPC -> protobuf: parsing copies the payload out of gRPC's receive
//      slices into the message's std::string (one copy; a chunked frame's
//      chunks are appended instead into one buffer reserved at its header).
//   2. message -> engine: the header's payload string is moved into the
//      Frame and on into the open block (no copy; FrameIngestTest checks the
//      buffer's address). The store is handed a view of it.
//   3. RocksDB: WriteBatch::Put copies the value into the frame's one write
//      batch (with its state and signals records), which the WAL write and
//      the memtable insert copy again inside RocksDB.
//   4. At block seal the frames are transposed into the layer-major warm
//      copy (a layout change recall needs, not a plain copy).
// Appends run on the service's executor threads, never on gRPC's reactor
// threads, and each stream has its own locks.
//
// Thread safety: none; one instance per call, used by one task at a time.
#ifndef KVMEM_SERVER_SERVICE_FRAME_INGEST_H_
#define KVMEM_SERVER_SERVICE_FRAME_INGEST_H_

#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/memory_engine.h"
#include "kvmem/v1/types.pb.h"

namespace kvmem {

class FrameIngest {
 public:
  // Checks a frame's payload size before its bytes are buffered (quotas);
  // a non-OK status rejects the frame. The ticket it returns is held until
  // the frame is stored or dropped (a reservation of its bytes).
  using Admit = std::function<absl::StatusOr<std::shared_ptr<void>>(
      const StreamHandle&, uint64_t bytes)>;

  explicit FrameIngest(StreamHandle stream, Admit admit = nullptr);

  // Starts a frame; appends it when the header carries the whole payload.
  // Returns the append result when a frame was stored, nullopt when more
  // chunks are expected.
  absl::StatusOr<std::optional<AppendResult>> OnHeader(v1::FrameHeader* header);
  absl::StatusOr<std::optional<AppendResult>> OnChunk(v1::PayloadChunk* chunk);

  // Feeds whichever of header and chunk is not null (one must be).
  absl::StatusOr<std::optional<AppendResult>> Feed(v1::FrameHeader* header,
                                                   v1::PayloadChunk* chunk);

  // Adds "last durable frame is N" to an error so the client knows where to
  // resume without another call.
  absl::Status WithResumePoint(const absl::Status& s) const;

  // OK when no frame is half received; otherwise INVALID_ARGUMENT saying how
  // many bytes of which frame arrived. Call when the client stops sending.
  absl::Status CheckNoPartialFrame() const;

  // Drops a frame half received and releases its admission (its bytes in
  // flight). Call when the call ends, before the client is told: the
  // reactor itself may live on a little after.
  void Release() {
    frame_.reset();
    ticket_.reset();
  }

  uint64_t frames_written() const { return frames_written_; }
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t sealed_blocks() const { return sealed_blocks_; }
  const StreamHandle& stream() const { return stream_; }

 private:
  absl::StatusOr<std::optional<AppendResult>> MaybeAppend();

  StreamHandle stream_;
  Admit admit_;
  std::optional<Frame> frame_;    // The frame being received.
  std::shared_ptr<void> ticket_;  // Its admission, until it is stored.
  uint64_t expected_bytes_ = 0;
  uint64_t frames_written_ = 0;
  uint64_t bytes_written_ = 0;
  uint64_t sealed_blocks_ = 0;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_FRAME_INGEST_H_
