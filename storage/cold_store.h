// ColdStore: the durable tier under the memory engine. It stores, per stream,
// an opaque config record, an opaque state record, frame payloads keyed by
// frame index, and opaque block records keyed by block id. The engine owns the
// encoding of every record; the store owns durability and atomicity.
//
// The contract every implementation keeps (tests/storage/
// cold_store_conformance_test.cc checks it on each store that runs here):
//
// - Commit is atomic per StreamWrite: after it returns OK every part is
//   stored, and a reader never sees part of a write. Deletions apply before
//   the puts of the same write. OK means as durable as the store promises
//   (its sync policy: RocksColdStoreOptions::wal_sync) before it returns.
// - A Commit that returns an error changed nothing that a later read can
//   see, with one exception: UNAVAILABLE or DEADLINE_EXCEEDED from a store
//   that could not learn the outcome (a remote tier that timed out): the
//   write may have been applied whole, never in part. The engine never
//   acknowledges a frame whose Commit returned an error, whatever the code.
// - Status codes: NOT_FOUND for a record that is not stored (reads);
//   RESOURCE_EXHAUSTED when the store refuses writes for want of space or
//   after a failed write (retriable once space is freed; reads keep
//   working); UNAVAILABLE when a read finds the store closed or
//   unreachable (retriable); DATA_LOSS when a stored record is damaged
//   (never wrong bytes); INVALID_ARGUMENT or FAILED_PRECONDITION for an
//   unusable option or path at open; ABORTED, from a store several servers
//   share (RADOS), when another store instance has taken the stream over:
//   the write changed nothing, and this instance neither reads nor writes
//   the stream again (not retriable here; the new owner serves it).
// - Reads see every Commit that returned OK before them (read your writes,
//   across threads).
// - ScanBlocks and ListStreams order by block id / stream id; ListStreams
//   lists a stream only once it has a non-empty config record. Stream ids
//   are the engine's (ValidateEngineStreamId: [A-Za-z0-9._:-], an optional
//   "tenant/" prefix; never a NUL byte); a stream's records never mix with
//   those of another whose id it prefixes.
// - The acknowledgement record (RecordAcknowledged / Acknowledged) is a
//   separate, whole-map record: once RecordAcknowledged returns OK, every
//   Commit that returned before it is durable under any failure the store
//   guards against, and Acknowledged returns this map (or a later one)
//   after any crash and restart. Recovery compares each stream's stored
//   frames with it to tell a store that lost acknowledged frames from one
//   that did not.
// - Stores several servers share (shared(): RADOS) keep an owner per
//   stream. ClaimStream makes this instance the stream's owner with a
//   coordinator's fencing token before anything else touches the stream;
//   the claim is refused (ABORTED) when another instance claimed it with a
//   larger token, and once a larger claim is made, this instance's next
//   write of the stream is refused (ABORTED) inside the store, changing
//   nothing. What a claim's owner reads afterwards includes every commit
//   an earlier owner saw return OK. ReleaseStream forgets what the instance
//   holds of a stream (nothing stored changes); its next touch needs a new
//   claim. The acknowledgement record of such a store is per stream: a
//   RecordAcknowledged map speaks for the streams this instance owns, and
//   streams it lost are left alone.
//
#ifndef KVMEM_STORAGE_COLD_STORE_H_
#define KVMEM_STORAGE_COLD_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvmem {

// One layer of a block's KV in its block (layer-major) form.
struct BlockLayerWrite {
  uint64_t block_id = 0;
  uint32_t layer = 0;
  std::string bytes;
};

// One atomic change to one stream: either all of it is durable or none is.
// Deletions apply before puts.
struct StreamWrite {
  std::string stream_id;
  std::optional<std::string> config;  // Replaces the config record.
  std::optional<std::string> state;   // Replaces the state record.
  // A frame payload to store. The view must stay valid during Commit.
  std::optional<std::pair<uint64_t, absl::string_view>> frame;
  // Small per-frame record stored beside that frame (its signals).
  std::optional<std::string> frame_meta;
  // Above 0: the frame's payload is read in parts of this many bytes (the
  // last may be shorter; GetFrameParts). A store may keep the parts as
  // separate records so a part is read alone; GetFrame returns the whole
  // payload either way. 0: read whole.
  uint64_t frame_part_bytes = 0;
  std::vector<std::pair<uint64_t, std::string>> blocks;  // Block records.
  // Smaller stand-ins for some of `blocks` (same id): a store may log the
  // stand-in and write the full record after it outside its write-ahead
  // log, so that a crash before the full record reached its files leaves
  // the stand-in (the engine rebuilds the rest from the block's frames).
  // A store that logs everything ignores them.
  std::vector<std::pair<uint64_t, std::string>> block_stand_ins;
  std::vector<BlockLayerWrite> block_layers;
  // Removes every layer record of these blocks.
  std::vector<uint64_t> delete_block_layers;
  // Removes frame payloads and metas of [first, last] (inclusive).
  std::vector<std::pair<uint64_t, uint64_t>> delete_frames;
  // Removes only the metas of [first, last] (a sealed block's frames kept
  // as its durable copy: their signals live in its record).
  std::vector<std::pair<uint64_t, uint64_t>> delete_frame_metas;
};

struct StreamRecord {
  std::string stream_id;
  std::string config;
  std::string state;
};

class ColdStore {
 public:
  virtual ~ColdStore() = default;

  // Applies `write` atomically. On success every part is as durable as the
  // store's sync policy promises (see WalSync in rocks_cold_store.h).
  virtual absl::Status Commit(const StreamWrite& write) = 0;

  // Returns the payload of a frame, or NOT_FOUND.
  virtual absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                               uint64_t frame_index) = 0;

  // The payloads of frames [first, last] in one call (one round trip where
  // the store is remote: a block kept as its frames is read with it), in
  // order; a frame that cannot be read fails the whole call with its
  // status. The default reads them one by one.
  virtual absl::StatusOr<std::vector<std::string>> GetFrames(
      absl::string_view stream_id, uint64_t first, uint64_t last);

  // Parts of frames in one call, in the order asked: for each (frame,
  // part) the payload's bytes [part * part_bytes, (part + 1) * part_bytes)
  // (to its end for the last part). part_bytes is the frame_part_bytes the
  // frames were written with, or any size for a frame written whole. A part
  // past the payload's end is DATA_LOSS (its frame has fewer bytes than the
  // caller knows it has); a missing frame NOT_FOUND. The default reads each
  // distinct frame whole and slices it; a store keeping parts reads only
  // those asked for.
  struct FramePart {
    uint64_t frame = 0;
    uint32_t part = 0;
  };
  virtual absl::StatusOr<std::vector<std::string>> GetFrameParts(
      absl::string_view stream_id, uint64_t part_bytes,
      const std::vector<FramePart>& parts);

  // The meta record stored with a frame, or NOT_FOUND.
  virtual absl::StatusOr<std::string> GetFrameMeta(absl::string_view stream_id,
                                                   uint64_t frame_index) = 0;

  // One layer record of a block, or NOT_FOUND.
  virtual absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                                    uint64_t block_id,
                                                    uint32_t layer) = 0;

  // Several layer records of one block in one call (one round trip where
  // the store is remote), in the order asked; a layer that cannot be read
  // fails the whole call with its status (NOT_FOUND naming it, DATA_LOSS,
  // ...; with several such layers, any one of theirs). The default reads
  // them one by one.
  virtual absl::StatusOr<std::vector<std::string>> GetBlockLayers(
      absl::string_view stream_id, uint64_t block_id,
      const std::vector<uint32_t>& layers);

  // Calls fn for every block record of the stream in increasing block id
  // order. Stops at and returns the first non-OK status fn returns.
  virtual absl::Status ScanBlocks(
      absl::string_view stream_id,
      const std::function<absl::Status(uint64_t block_id,
                                       absl::string_view record)>& fn) = 0;

  // Every stream that has a config record, in stream id order.
  virtual absl::StatusOr<std::vector<StreamRecord>> ListStreams() = 0;

  // Removes every record of the stream. OK when it had none. Deleting is
  // how a full store gets space back: a store that refuses commits for
  // space still takes a deletion (and the acknowledgement record before
  // it), and gives back the stream's space as far as it can before it
  // returns.
  virtual absl::Status DeleteStream(absl::string_view stream_id) = 0;

  // Bytes of payloads on disk or in memory, as the store estimates them.
  virtual uint64_t ApproximatePayloadBytes() = 0;

  // The acknowledgement record: per stream, how many frames were
  // acknowledged (last frame + 1). RecordAcknowledged first makes every
  // commit that returned so far durable, then replaces the record where no
  // failure the store guards against can take it back (RocksDB: a file
  // beside the database, written and renamed after a synced write, out of
  // reach of a damaged log tail), so recovery can tell a store that lost
  // acknowledged commits from one that did not.
  virtual absl::Status RecordAcknowledged(
      const std::map<std::string, uint64_t>& frames) = 0;
  // The last record (empty when none was made). DATA_LOSS when it exists but
  // cannot be read.
  virtual absl::StatusOr<std::map<std::string, uint64_t>> Acknowledged() = 0;

  // --- Ownership, for stores several servers share (see the contract). ---
  // True for a store other instances may open at the same time (RADOS).
  virtual bool shared() const { return false; }
  // Claims the stream with `fencing_token` (above 0; a coordinator's, which
  // only grows): ABORTED when a claim with a larger token was made; an equal
  // token is the same holding claimed again (after ReleaseStream). Local
  // stores: OK, nothing to do.
  virtual absl::Status ClaimStream(absl::string_view stream_id,
                                   uint64_t fencing_token);
  // Forgets what this instance holds of the stream (cached manifest, claim,
  // acknowledged mark); nothing stored changes. Local stores: nothing.
  virtual void ReleaseStream(absl::string_view stream_id);
  // One stream's config and state records and its acknowledged mark (0:
  // none) in *acknowledged; NOT_FOUND when it has no config record. The
  // default looks it up in ListStreams and Acknowledged.
  virtual absl::StatusOr<StreamRecord> ReadStream(absl::string_view stream_id,
                                                  uint64_t* acknowledged);
};

// INVALID_ARGUMENT for frame parts of 0 bytes (GetFrameParts).
absl::Status CheckFramePartBytes(uint64_t part_bytes);

// Parts sliced out of whole frames, each frame read once (parts of one
// frame come together) through the `read` a store gives; the default
// GetFrameParts and a store's reads of frames written whole use it.
class WholeFrameSlicer {
 public:
  using Read = std::function<absl::StatusOr<std::string>(uint64_t frame)>;
  WholeFrameSlicer(absl::string_view stream_id, uint64_t part_bytes, Read read)
      : stream_id_(stream_id),
        part_bytes_(part_bytes),
        read_(std::move(read)) {}
  // Part p of its frame's payload; DATA_LOSS when it starts past the end.
  absl::StatusOr<std::string> Part(const ColdStore::FramePart& p);

 private:
  absl::string_view stream_id_;
  uint64_t part_bytes_;
  Read read_;
  std::string whole_;  // The frame held, whole.
  std::optional<uint64_t> held_;
};

// An in-memory ColdStore for engine tests. Not durable.
std::unique_ptr<ColdStore> NewMemColdStore();

}  // namespace kvmem

#endif  // KVMEM_STORAGE_COLD_STORE_H_
