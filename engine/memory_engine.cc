#include "engine/memory_engine.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/record_codec.h"
#include "engine/status_macros.h"
#include "engine/stream_config.h"

namespace kvmem {

MemoryEngine::MemoryEngine(std::unique_ptr<ColdStore> store,
                           const EngineOptions& options)
    : store_(std::move(store)),
      options_(options),
      accel_(options.sim.has_value() ? NewSimAccelerator(*options.sim)
                                     : NewCpuAccelerator()),
      background_(std::make_unique<Executor>(options.background_threads)) {}

MemoryEngine::~MemoryEngine() {
  background_.reset();  // Finish queued tier moves before streams go.
  absl::MutexLock lock(&mu_);
  streams_.clear();
}

StreamEnv MemoryEngine::Env() {
  StreamEnv env;
  env.store = store_.get();
  env.background = background_.get();
  env.global_warm_bytes = &global_warm_bytes_;
  env.global_warm_budget = options_.global_warm_budget_bytes;
  env.accel = accel_.get();
  env.warn = options_.warn;
  return env;
}

void MemoryEngine::WaitForBackground() {
  absl::Notification done;
  background_->Submit([&done] { done.Notify(); });
  done.WaitForNotification();
}

absl::StatusOr<std::unique_ptr<MemoryEngine>> MemoryEngine::Open(
    std::unique_ptr<ColdStore> store, const EngineOptions& options) {
  std::unique_ptr<MemoryEngine> engine(
      new MemoryEngine(std::move(store), options));
  KVMEM_ASSIGN_OR_RETURN(auto records, engine->store_->ListStreams());
  absl::MutexLock lock(&engine->mu_);
  for (const StreamRecord& r : records) {
    KVMEM_ASSIGN_OR_RETURN(StreamConfig stored, DecodeConfig(r.config));
    // Records written by older versions lack newer fields: the decoder
    // gives the fields whose meaning would change the stream's behaviour
    // what the stream had (groups_per_block 1, score SUMMED); the engine's
    // defaults fill the rest, as for a new stream that leaves them unset.
    const StreamConfig config = WithDefaults(stored);
    KVMEM_ASSIGN_OR_RETURN(StreamState state, DecodeState(r.state));
    KVMEM_RETURN_IF_ERROR(ValidateStreamConfig(config));
    KVMEM_ASSIGN_OR_RETURN(
        std::unique_ptr<Stream> stream,
        Stream::Recover(r.stream_id, config, state, engine->Env()));
    engine->streams_[r.stream_id] = std::move(stream);
  }
  return engine;
}

absl::StatusOr<OpenStreamResult> MemoryEngine::OpenStream(
    const std::string& id, const StreamConfig& requested) {
  KVMEM_RETURN_IF_ERROR(ValidateEngineStreamId(id));
  // control_mu_ orders creations and deletions; mu_ is held only for map
  // lookups, never across a commit, so other streams' calls do not wait.
  absl::MutexLock control(&control_mu_);
  std::shared_ptr<Stream> existing;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it != streams_.end()) existing = it->second;
  }
  // Fields left zero take the server's stream defaults when the stream is
  // created, and the stream's own settings when it is reopened: a server
  // restarted with other defaults still reopens its streams.
  const StreamConfig config = WithDefaults(WithServerDefaults(
      requested, existing ? existing->config() : options_.stream_defaults));
  KVMEM_RETURN_IF_ERROR(ValidateStreamConfig(config));
  if (existing) {
    if (!(existing->config() == config)) {
      return absl::AlreadyExistsError(
          absl::StrCat("stream \"", id,
                       "\" exists with a different config; delete it or "
                       "open it with the same config"));
    }
    KVMEM_RETURN_IF_ERROR(existing->Reopen());
    return OpenStreamResult{false, existing->Stats()};
  }
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream,
                         Stream::Create(id, config, Env()));
  std::shared_ptr<Stream> shared = std::move(stream);
  {
    absl::MutexLock lock(&mu_);
    streams_[id] = shared;
  }
  return OpenStreamResult{true, shared->Stats()};
}

absl::StatusOr<std::shared_ptr<Stream>> MemoryEngine::Find(
    const std::string& id) const {
  KVMEM_RETURN_IF_ERROR(ValidateEngineStreamId(id));
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    return absl::NotFoundError(absl::StrCat("stream \"", id, "\" not found"));
  }
  return it->second;
}

absl::StatusOr<StreamStats> MemoryEngine::CloseStream(const std::string& id) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, Find(id));
  KVMEM_RETURN_IF_ERROR(stream->Close());
  return stream->Stats();
}

absl::Status MemoryEngine::DeleteStream(const std::string& id) {
  absl::MutexLock control(&control_mu_);
  KVMEM_ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream, Find(id));
  // Marked first, so calls already holding the stream answer NOT_FOUND
  // instead of reading records while they are removed.
  stream->MarkDeleted(true);
  absl::Status s = store_->DeleteStream(id);
  if (!s.ok()) {
    stream->MarkDeleted(false);  // Nothing was removed; keep serving it.
    return s;
  }
  absl::MutexLock lock(&mu_);
  streams_.erase(id);
  return absl::OkStatus();
}

std::vector<StreamStats> MemoryEngine::ListStreams() const {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : streams_) streams.push_back(s);
  }
  std::vector<StreamStats> out;
  out.reserve(streams.size());
  for (const auto& s : streams) out.push_back(s->Stats());
  return out;
}

absl::StatusOr<StreamStats> MemoryEngine::GetStats(
    const std::string& id) const {
  KVMEM_ASSIGN_OR_RETURN(auto stream, Find(id));
  return stream->Stats();
}

absl::StatusOr<AppendResult> MemoryEngine::Append(const std::string& id,
                                                  Frame frame) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, Find(id));
  return stream->Append(std::move(frame));
}

absl::StatusOr<RecallResult> MemoryEngine::Recall(const std::string& id,
                                                  const RecallQuery& query) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, Find(id));
  return stream->Recall(query);
}

std::vector<std::shared_ptr<Stream>> MemoryEngine::StreamsWithPrefix(
    const std::string& prefix) const {
  std::vector<std::shared_ptr<Stream>> out;
  absl::MutexLock lock(&mu_);
  for (auto it = streams_.lower_bound(prefix);
       it != streams_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

size_t MemoryEngine::stream_count() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

}  // namespace kvmem
