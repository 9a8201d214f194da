// MemoryEngine's side of stream ownership (engine/ownership.h): serving a
// recovered stream, taking one up on demand, dropping streams this server
// no longer owns.
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "engine/memory_engine.h"
#include "engine/stream/stream.h"

namespace kvmem {

void MemoryEngine::Install(const std::string& id, uint64_t want,
                           absl::StatusOr<std::unique_ptr<Stream>> stream) {
  if (!stream.ok()) {
    Quarantine(id, stream.status());
    if (want > 0) quarantined_acks_[id] = want;
    return;
  }
  const uint64_t have = (*stream)->AcknowledgedFrames();
  if (have < want) {
    Quarantine(id, absl::DataLossError(absl::StrCat(
                       want, " frames were acknowledged and ", have,
                       " recovered: frames ", have, "..", want - 1,
                       " were lost from the write-ahead log")));
    quarantined_acks_[id] = want;
    return;
  }
  std::shared_ptr<Stream>& s = streams_[id] = *std::move(stream);
  // A block its last server filled but had not sealed yet (seal_after_ack).
  s->ScheduleSeal();
}

absl::StatusOr<std::shared_ptr<Stream>> MemoryEngine::Held(
    const std::string& id) const {
  auto it = streams_.find(id);
  if (it != streams_.end()) return it->second;
  if (auto q = quarantined_.find(id); q != quarantined_.end()) {
    return q->second;
  }
  return std::shared_ptr<Stream>();
}

bool MemoryEngine::Holds(const std::string& id) const {
  kvmem::MutexLock lock(&mu_);
  return streams_.count(id) > 0;
}

absl::StatusOr<std::shared_ptr<Stream>> MemoryEngine::Lookup(
    const std::string& id, bool keep_absent) {
  if (ownership_ != nullptr) KVMEM_RETURN_IF_ERROR(ownership_->CheckServing());
  bool stale = false;
  {
    kvmem::MutexLock lock(&mu_);
    KVMEM_ASSIGN_OR_RETURN(std::shared_ptr<Stream> held, Held(id));
    if (ownership_ == nullptr) return held;
    // Held from before the ownership lapsed, and not dropped yet (DisownAll
    // runs on the background worker, maybe behind a seal): a fresh lease
    // must not serve its stale state (it answered "frame 60 skips frames;
    // last durable frame is 39" for a stream another server had taken on).
    stale = held != nullptr &&
            held->owner_generation() != ownership_generation_.load();
    if (held != nullptr && !stale) return held;
  }
  if (stale) {
    Disown(id, absl::UnavailableError(
                   "this server's ownership lapsed since it took the stream "
                   "up; it is taken up again"));
  }
  absl::StatusOr<std::shared_ptr<Stream>> adopted = Adopt(id, keep_absent);
  if (adopted.status().code() == absl::StatusCode::kNotFound) {
    return std::shared_ptr<Stream>();
  }
  return adopted;
}

absl::StatusOr<std::shared_ptr<Stream>> MemoryEngine::Adopt(
    const std::string& id, bool keep_absent) {
  kvmem::MutexLock adopt(&adopt_mu_);
  {
    kvmem::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Stream>> held = Held(id);
    if (!held.ok() || *held != nullptr) return held;
  }
  const uint64_t generation = ownership_generation_.load();
  KVMEM_ASSIGN_OR_RETURN(const uint64_t token, ownership_->Acquire(id));
  // The claim with the holding's token comes first: what is read after it
  // is every commit of earlier owners, and their later writes are refused.
  absl::Status claimed = store_->ClaimStream(id, token);
  uint64_t want = 0;
  absl::StatusOr<StreamRecord> record =
      claimed.ok() ? store_->ReadStream(id, &want) : claimed;
  if (!record.ok()) {
    const bool absent = record.status().code() == absl::StatusCode::kNotFound;
    // A stream about to be created keeps its claim: its first commit
    // creates the head with this holding's token.
    if (!(absent && keep_absent)) store_->ReleaseStream(id);
    if (record.status().code() == absl::StatusCode::kAborted) {
      return ownership_->Moved(id, record.status());
    }
    if (!absent) return record.status();
    if (!keep_absent) ownership_->Release(id);
    return absl::NotFoundError(absl::StrCat("stream \"", id, "\" not found"));
  }
  absl::StatusOr<std::unique_ptr<Stream>> stream = RecoverOne(*record);
  // The ownership lapsed meanwhile: not served on a holding that may be
  // gone. (A lapse after this check queues a DisownAll that drops it.)
  if (ownership_generation_.load() != generation) {
    store_->ReleaseStream(id);
    return absl::UnavailableError(absl::StrCat(
        "stream \"", id,
        "\": this server's ownership lapsed while it took the stream up"));
  }
  if (stream.ok()) (*stream)->set_owner_generation(generation);
  kvmem::MutexLock lock(&mu_);
  Install(id, want, std::move(stream));
  absl::StatusOr<std::shared_ptr<Stream>> held = Held(id);
  if (held.ok() && *held == nullptr) {
    return absl::InternalError(absl::StrCat("stream \"", id, "\" vanished"));
  }
  return held;
}

void MemoryEngine::Disown(const std::string& id, const absl::Status& why) {
  std::shared_ptr<Stream> stream;
  {
    kvmem::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    stream = std::move(it->second);
    streams_.erase(it);
  }
  stream->MarkGone(why);
  store_->ReleaseStream(id);
  if (options_.warn) {
    options_.warn(
        absl::StrCat("stream \"", id, "\" left this server: ", why.message()));
  }
}

void MemoryEngine::DisownAll(const absl::Status& why) {
  std::map<std::string, std::shared_ptr<Stream>> streams;
  std::map<std::string, absl::Status> quarantined;
  {
    kvmem::MutexLock lock(&mu_);
    // Streams taken up under the fresh lease, after the lapse that queued
    // this, stay.
    const uint64_t now = ownership_generation_.load();
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (it->second->owner_generation() != now) {
        streams.insert(streams.end(), std::move(*it));
        it = streams_.erase(it);
      } else {
        ++it;
      }
    }
    quarantined.swap(quarantined_);
    quarantined_acks_.clear();
  }
  for (auto& [id, stream] : streams) {
    stream->MarkGone(why);
    store_->ReleaseStream(id);
  }
  for (const auto& [id, reason] : quarantined) store_->ReleaseStream(id);
  if (options_.warn && !(streams.empty() && quarantined.empty())) {
    options_.warn(absl::StrCat(streams.size() + quarantined.size(),
                               " stream(s) dropped: ", why.message()));
  }
}

}  // namespace kvmem
