#include "engine/owned_store.h"

#include "base/status_macros.h"

namespace kvmem {

absl::Status OwnedStore::Checked(absl::string_view id, absl::Status s) {
  if (s.code() != absl::StatusCode::kAborted) return s;
  const std::string stream(id);
  absl::Status moved = ownership_->Moved(stream, s);
  if (moved_) moved_(stream, moved);
  return moved;
}

absl::Status OwnedStore::Commit(const StreamWrite& w) {
  KVMEM_RETURN_IF_ERROR(ownership_->CheckServing());
  return Checked(w.stream_id, inner().Commit(w));
}

absl::Status OwnedStore::DeleteStream(absl::string_view id) {
  KVMEM_RETURN_IF_ERROR(ownership_->CheckServing());
  return Checked(id, inner().DeleteStream(id));
}

absl::Status OwnedStore::RecordAcknowledged(
    const std::map<std::string, uint64_t>& frames) {
  // Marks of streams held with a lapsing lease are not written; the next
  // record after renewal writes them.
  KVMEM_RETURN_IF_ERROR(ownership_->CheckServing());
  return inner().RecordAcknowledged(frames);
}

}  // namespace kvmem
