// RadosColdStore's reads, listing, acknowledged marks, per-stream claims
// (ClaimStream, ReleaseStream, ReadStream) and payload size; the writes are
// in rados_cold_store.cc.
#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/layer_trailer.h"
#include "storage/rados_io.h"
#include "storage/rados_store_impl.h"
#include "storage/rocks_keys.h"

namespace kvmem::rados_store {
namespace {

using rados_io::FromRc;

// A ref's object vanished between the manifest lookup and the read: either
// a commit replaced or deleted the record meanwhile (look again) or the
// object is gone while the record still names it (DATA_LOSS).
bool Moved(const absl::Status& read) {
  return read.code() == absl::StatusCode::kNotFound;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RadosColdStore::ReadRecords(
    absl::string_view stream_id,
    const std::function<absl::Status(const Manifest&, std::vector<Ref>*)>&
        pick) {
  for (int attempt = 0;; ++attempt) {
    std::vector<Ref> refs;
    std::shared_ptr<StreamEntry> e = Entry(stream_id);
    KVMEM_RETURN_IF_ERROR(ReadLocked(
        stream_id, [&](StreamEntry& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return pick(s.m, &refs);
        }));
    absl::StatusOr<std::vector<std::string>> bytes =
        rados_io::ReadRefs(e->io, refs);
    if (bytes.ok() || !Moved(bytes.status())) return bytes;
    if (attempt >= 2) {
      return absl::DataLossError(
          absl::StrCat("stream \"", stream_id, "\": ", bytes.status().message(),
                       ", though its manifest names it"));
    }
  }
}

absl::StatusOr<std::string> RadosColdStore::GetFrame(
    absl::string_view stream_id, uint64_t frame_index) {
  KVMEM_ASSIGN_OR_RETURN(std::vector<std::string> bytes,
                         GetFrames(stream_id, frame_index, frame_index));
  return std::move(bytes[0]);
}

absl::StatusOr<std::vector<std::string>> RadosColdStore::GetFrames(
    absl::string_view stream_id, uint64_t first, uint64_t last) {
  // Every stripe of every frame in flight at once.
  return ReadRecords(stream_id, [&](const Manifest& m, std::vector<Ref>* refs) {
    for (uint64_t f = first; f <= last; ++f) {
      auto it = m.frames.find(f);
      if (it == m.frames.end()) {
        return absl::NotFoundError(absl::StrCat("frame ", f, " not stored"));
      }
      refs->push_back(it->second);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> RadosColdStore::GetFrameParts(
    absl::string_view stream_id, uint64_t part_bytes,
    const std::vector<FramePart>& parts) {
  KVMEM_RETURN_IF_ERROR(CheckFramePartBytes(part_bytes));
  return ReadRecords(stream_id, [&](const Manifest& m, std::vector<Ref>* refs) {
    for (const FramePart& p : parts) {
      auto it = m.frames.find(p.frame);
      if (it == m.frames.end()) {
        return absl::NotFoundError(
            absl::StrCat("frame ", p.frame, " not stored"));
      }
      const Ref& whole = it->second;
      const uint64_t at = uint64_t{p.part} * part_bytes;
      if (whole.trailer || at >= whole.length) {
        return absl::DataLossError(absl::StrCat(
            "part ", p.part, " of frame ", p.frame, " of stream ", stream_id,
            " (parts of ", part_bytes, " bytes) is not within its ",
            whole.length, " stored bytes"));
      }
      Ref part = whole;
      part.offset += at;
      part.length = std::min(part_bytes, whole.length - at);
      refs->push_back(std::move(part));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::string> RadosColdStore::GetFrameMeta(
    absl::string_view stream_id, uint64_t frame_index) {
  std::shared_ptr<StreamEntry> e = Entry(stream_id);
  KVMEM_RETURN_IF_ERROR(
      ReadLocked(stream_id, [&](StreamEntry& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return s.m.metas.count(frame_index) > 0
                   ? absl::OkStatus()
                   : absl::NotFoundError(absl::StrCat(
                         "meta of frame ", frame_index, " not stored"));
      }));
  const std::string key = rados_io::MetaKey(frame_index);
  std::map<std::string, librados::bufferlist> vals;
  const int rc = e->io.omap_get_vals_by_keys(rados_io::kHead, {key}, &vals);
  KVMEM_RETURN_IF_ERROR(FromRc(rc, "reading a frame meta"));
  auto it = vals.find(key);
  if (it == vals.end()) {
    return absl::NotFoundError(
        absl::StrCat("meta of frame ", frame_index, " not stored"));
  }
  return it->second.to_str();
}

absl::StatusOr<std::string> RadosColdStore::GetBlockLayer(
    absl::string_view stream_id, uint64_t block_id, uint32_t layer) {
  KVMEM_ASSIGN_OR_RETURN(std::vector<std::string> bytes,
                         GetBlockLayers(stream_id, block_id, {layer}));
  return std::move(bytes[0]);
}

absl::StatusOr<std::vector<std::string>> RadosColdStore::GetBlockLayers(
    absl::string_view stream_id, uint64_t block_id,
    const std::vector<uint32_t>& layers) {
  std::vector<bool> trailer;  // The refs of the last attempt.
  absl::StatusOr<std::vector<std::string>> bytes =
      ReadRecords(stream_id, [&](const Manifest& m, std::vector<Ref>* refs) {
        trailer.clear();
        for (uint32_t l : layers) {
          auto it = m.layers.find({block_id, l});
          if (it == m.layers.end()) {
            return absl::NotFoundError(absl::StrCat("layer ", l, " of block ",
                                                    block_id, " not stored"));
          }
          refs->push_back(it->second);
          trailer.push_back(it->second.trailer);
        }
        return absl::OkStatus();
      });
  if (!bytes.ok()) return bytes;
  // Records written with a trailer are checked end to end (BlueStore's own
  // checksum covers each object on the OSDs, not which bytes a ref names);
  // older ones are handed over as stored.
  for (size_t i = 0; i < layers.size(); ++i) {
    if (trailer[i] &&
        !StripLayerTrailer(LayerKey(stream_id, block_id, layers[i]),
                           &(*bytes)[i])) {
      return absl::DataLossError(
          absl::StrCat("layer ", layers[i], " of block ", block_id,
                       " of stream \"", stream_id, "\" fails its checksum"));
    }
  }
  return bytes;
}

absl::Status RadosColdStore::ScanBlocks(
    absl::string_view stream_id,
    const std::function<absl::Status(uint64_t, absl::string_view)>& fn) {
  // The records named now, read in parallel batches, handed over in id
  // order.
  std::vector<uint64_t> ids;
  KVMEM_RETURN_IF_ERROR(
      ReadLocked(stream_id, [&](StreamEntry& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        for (const auto& [id, ref] : s.m.blocks) ids.push_back(id);
        return absl::OkStatus();
      }));
  constexpr size_t kBatch = 64;
  for (size_t first = 0; first < ids.size(); first += kBatch) {
    const size_t n = std::min(kBatch, ids.size() - first);
    KVMEM_ASSIGN_OR_RETURN(
        std::vector<std::string> records,
        ReadRecords(stream_id, [&](const Manifest& m, std::vector<Ref>* refs) {
          for (size_t i = first; i < first + n; ++i) {
            auto it = m.blocks.find(ids[i]);
            if (it == m.blocks.end()) {
              return absl::NotFoundError(absl::StrCat(
                  "block ", ids[i], " was removed during the scan"));
            }
            refs->push_back(it->second);
          }
          return absl::OkStatus();
        }));
    for (size_t i = 0; i < n; ++i) {
      KVMEM_RETURN_IF_ERROR(fn(ids[first + i], records[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RadosColdStore::IndexedStreams() {
  std::vector<std::string> ids;
  KVMEM_RETURN_IF_ERROR(rados_io::ScanOmap(
      pool_, index_, "", [&](const std::string& key, librados::bufferlist&) {
        ids.push_back(key);
        return true;
      }));
  return ids;
}

absl::StatusOr<std::vector<StreamRecord>> RadosColdStore::ListStreams() {
  KVMEM_ASSIGN_OR_RETURN(std::vector<std::string> ids, IndexedStreams());
  std::vector<StreamRecord> out;
  for (const std::string& id : ids) {
    // Listing a stream claims it (rados_cold_store.h, "Ownership"), so the
    // records read here are the last any earlier owner committed.
    std::shared_ptr<StreamEntry> e = Entry(id);
    {
      kvmem::MutexLock lock(&e->mu);
      const absl::Status ready = Ready(*e, /*write=*/true);
      if (e->fenced) continue;  // Another instance owns it now.
      KVMEM_RETURN_IF_ERROR(ready);
      e->indexed = true;
    }
    std::map<std::string, librados::bufferlist> vals;
    const int rc = e->io.omap_get_vals_by_keys(
        rados_io::kHead, {rados_io::kConfigKey, rados_io::kStateKey}, &vals);
    if (rc == -ENOENT) continue;
    KVMEM_RETURN_IF_ERROR(FromRc(rc, absl::StrCat("listing stream ", id)));
    StreamRecord r;
    r.stream_id = id;
    r.config = vals[rados_io::kConfigKey].to_str();
    r.state = vals[rados_io::kStateKey].to_str();
    if (!r.config.empty()) out.push_back(std::move(r));
  }
  return out;
}

absl::Status RadosColdStore::ClaimStream(absl::string_view stream_id,
                                         uint64_t fencing_token) {
  if (fencing_token == 0) {
    return absl::InvalidArgumentError("a stream's fencing token must be > 0");
  }
  coordinated_ = true;
  std::shared_ptr<StreamEntry> e = Entry(stream_id);
  kvmem::MutexLock lock(&e->mu);
  // A new holding: whatever this instance knew of the stream is stale.
  e->token = fencing_token;
  e->fenced = false;
  e->claimed = false;
  e->loaded = false;
  const absl::Status st = Claim(*e, /*create=*/false);
  if (e->fenced) return Fenced(*e, stream_id);
  return st;
}

void RadosColdStore::ReleaseStream(absl::string_view stream_id) {
  std::shared_ptr<StreamEntry> e;
  {
    kvmem::MutexLock lock(&mu_);
    auto it = entries_.find(stream_id);
    if (it != entries_.end()) {
      e = std::move(it->second);
      entries_.erase(it);
    }
    acked_.erase(std::string(stream_id));
  }
  if (e == nullptr) return;
  // Calls still holding the entry are refused from now on; the next touch
  // gets a new entry, which must be claimed again.
  kvmem::MutexLock lock(&e->mu);
  e->released = true;
  bytes_ -= static_cast<int64_t>(e->m.bytes);
  e->m = Manifest();
  e->loaded = false;
}

absl::StatusOr<StreamRecord> RadosColdStore::ReadStream(
    absl::string_view stream_id, uint64_t* acknowledged) {
  std::shared_ptr<StreamEntry> e = Entry(stream_id);
  {
    // A read claims the stream first when ClaimStream has not (the
    // options' token), so what follows is the last any owner committed.
    kvmem::MutexLock lock(&e->mu);
    const absl::Status ready = Ready(*e, /*write=*/false);
    if (e->fenced) return Fenced(*e, stream_id);
    KVMEM_RETURN_IF_ERROR(ready);
  }
  std::map<std::string, librados::bufferlist> vals;
  const int rc = e->io.omap_get_vals_by_keys(
      rados_io::kHead,
      {rados_io::kConfigKey, rados_io::kStateKey, rados_io::kAckKey}, &vals);
  const absl::Status missing = absl::NotFoundError(
      absl::StrCat("stream \"", stream_id, "\" has no records"));
  if (rc == -ENOENT) return missing;
  KVMEM_RETURN_IF_ERROR(FromRc(rc, absl::StrCat("reading stream ", stream_id)));
  StreamRecord r;
  r.stream_id = std::string(stream_id);
  r.config = vals[rados_io::kConfigKey].to_str();
  r.state = vals[rados_io::kStateKey].to_str();
  if (r.config.empty()) return missing;
  *acknowledged = 0;
  if (auto it = vals.find(rados_io::kAckKey); it != vals.end()) {
    if (!rados_io::ParseU64(it->second.to_str(), acknowledged)) {
      return absl::DataLossError(
          absl::StrCat("the acknowledged mark of ", stream_id, " is damaged"));
    }
    kvmem::MutexLock lock(&mu_);
    acked_[r.stream_id] = *acknowledged;
  }
  return r;
}

absl::Status RadosColdStore::RecordAcknowledged(
    const std::map<std::string, uint64_t>& frames) {
  std::map<std::string, std::optional<uint64_t>> changes;
  {
    kvmem::MutexLock lock(&mu_);
    for (const auto& [id, n] : frames) {
      auto it = acked_.find(id);
      if (it == acked_.end() || it->second != n) changes[id] = n;
    }
    for (const auto& [id, n] : acked_) {
      if (frames.count(id) == 0) changes[id] = std::nullopt;
    }
  }
  // Every commit that returned is already on disk on every replica: only
  // the marks are written, one compound operation per stream, in parallel.
  // The operations outlive the batch, whose destructor waits for them.
  std::vector<librados::ObjectWriteOperation> ops(changes.size());
  rados_io::AioBatch batch;
  size_t i = 0;
  std::vector<const std::string*> skipped;  // Not ours: not recorded.
  for (const auto& [id, n] : changes) {
    std::shared_ptr<StreamEntry> e = Entry(id);
    kvmem::MutexLock lock(&e->mu);
    const absl::Status ready = Ready(*e, /*write=*/true);
    // A stream another instance took over (or this one released) is not
    // ours to mark: its mark stays as its owner writes it, and the others'
    // marks go on.
    if (e->fenced || ready.code() == absl::StatusCode::kAborted) {
      skipped.push_back(&id);
      continue;
    }
    KVMEM_RETURN_IF_ERROR(ready);
    if (n) KVMEM_RETURN_IF_ERROR(Index(*e, id));  // Acknowledged lists it.
    librados::ObjectWriteOperation& op = ops[i++];
    op.cmpxattr(rados_io::kEpochAttr, LIBRADOS_CMPXATTR_OP_EQ, e->epoch);
    if (n) {
      op.omap_set({{rados_io::kAckKey, rados_io::Text(rados_io::U64(*n))}});
    } else {
      op.omap_rm_keys({rados_io::kAckKey});
    }
    librados::AioCompletion* c =
        batch.Add(absl::StrCat("recording the acknowledged mark of ", id));
    const int rc = e->io.aio_operate(rados_io::kHead, c, &op);
    if (rc < 0) batch.NotStarted(rc);
  }
  KVMEM_RETURN_IF_ERROR(batch.Wait());
  kvmem::MutexLock lock(&mu_);
  acked_ = frames;
  for (const std::string* id : skipped) acked_.erase(*id);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, uint64_t>> RadosColdStore::Acknowledged() {
  KVMEM_ASSIGN_OR_RETURN(std::vector<std::string> ids, IndexedStreams());
  std::map<std::string, uint64_t> out;
  for (const std::string& id : ids) {
    std::shared_ptr<StreamEntry> e = Entry(id);
    std::map<std::string, librados::bufferlist> vals;
    const int rc = e->io.omap_get_vals_by_keys(rados_io::kHead,
                                               {rados_io::kAckKey}, &vals);
    if (rc == -ENOENT) continue;
    KVMEM_RETURN_IF_ERROR(FromRc(rc, absl::StrCat("reading the mark of ", id)));
    auto it = vals.find(rados_io::kAckKey);
    if (it == vals.end()) continue;
    uint64_t n = 0;
    if (!rados_io::ParseU64(it->second.to_str(), &n)) {
      return absl::DataLossError(
          absl::StrCat("the acknowledged mark of ", id, " is damaged"));
    }
    out[id] = n;
  }
  kvmem::MutexLock lock(&mu_);
  acked_ = out;
  return out;
}

uint64_t RadosColdStore::ApproximatePayloadBytes() {
  return static_cast<uint64_t>(std::max<int64_t>(0, bytes_.load()));
}

}  // namespace kvmem::rados_store
