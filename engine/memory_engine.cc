#include "engine/memory_engine.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/executor.h"
#include "base/fork_join.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "engine/accel/accelerator.h"
#include "engine/accel/device_profile.h"
#include "engine/codec/record_codec.h"
#include "engine/owned_store.h"
#include "engine/stream/stream.h"
#include "engine/stream_config.h"

namespace kvmem {

int RecallThreads(int option) {
  if (option > 0) return std::min(option, kMaxRecallThreads);
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp<unsigned>(hw, 1, 4));
}

MemoryEngine::MemoryEngine(std::unique_ptr<ColdStore> store,
                           const EngineOptions& options)
    : store_(std::move(store)),
      options_(options),
      accel_(options.sim.has_value() ? NewSimAccelerator(*options.sim)
                                     : NewCpuAccelerator()),
      background_(std::make_unique<Executor>(options.background_threads)),
      ownership_(options.ownership.get()) {
  const int recall_threads = RecallThreads(options.recall_threads);
  if (recall_threads > 1) {
    recall_helpers_ =
        std::make_unique<ForkJoinPool>(recall_threads - 1, options.recall_spin);
  }
  if (ownership_ != nullptr) {
    // A write the store refuses because another server took the stream
    // over drops the stream, off the writer's locks.
    store_ = std::make_unique<OwnedStore>(
        std::shared_ptr<ColdStore>(std::move(store_)), ownership_,
        [this](const std::string& id, const absl::Status& why) {
          if (stopping_moves_.load()) return;
          background_->Submit([this, id, why] { Disown(id, why); });
        });
  }
}

MemoryEngine::~MemoryEngine() {
  if (ownership_ != nullptr) ownership_->OnLost(nullptr);
  if (ack_thread_.joinable()) {
    {
      kvmem::MutexLock lock(&ack_mu_);
      stopping_ = true;
    }
    ack_thread_.join();
  }
  stopping_moves_ = true;
  background_.reset();  // Finish queued tier moves before streams go.
  // Shutdown: the final record; never from an Open that failed, whose
  // refusal must stay reproducible.
  if (opened_) RecordAcknowledged().IgnoreError();
  kvmem::MutexLock lock(&mu_);
  streams_.clear();
}

StreamEnv MemoryEngine::Env() {
  StreamEnv env;
  env.store = store_.get();
  env.background = background_.get();
  env.global_warm_bytes = &global_warm_bytes_;
  env.global_stage_bytes = &global_stage_bytes_;
  env.global_warm_budget = options_.global_warm_budget_bytes;
  env.demote_keeps_frames = options_.demote_keeps_frames;
  env.frame_parts = options_.frame_parts;
  env.seal_after_ack = options_.seal_after_ack;
  env.rebuild_kept_per_sealed = options_.rebuild_kept_per_sealed;
  env.frame_part_tokens = options_.frame_part_tokens;
  env.accel = accel_.get();
  env.warn = options_.warn;
  if (recall_helpers_ != nullptr) {
    env.recall_helpers.pool = recall_helpers_.get();
  }
  return env;
}

void MemoryEngine::WaitForBackground() {
  kvmem::Notification done;
  background_->Submit([&done] { done.Notify(); });
  done.WaitForNotification();
}

absl::StatusOr<std::unique_ptr<Stream>> MemoryEngine::RecoverOne(
    const StreamRecord& r) {
  try {
    KVMEM_ASSIGN_OR_RETURN(StreamConfig stored, DecodeConfig(r.config));
    // Records written by older versions lack newer fields: the decoder
    // gives the fields whose meaning would change the stream's behaviour
    // what the stream had (groups_per_block 1, score SUMMED); the engine's
    // defaults fill the rest, as for a new stream that leaves them unset.
    StreamConfig config = WithDefaults(stored);
    // Before 2026-12-07 OpenStream took any recall_defaults.max_tokens; a
    // stream stored with one beyond a recall's limit keeps working (its
    // recalls without a budget were refused anyway) at the limit.
    config.default_max_tokens =
        std::min(config.default_max_tokens, kMaxRecallTokens);
    KVMEM_ASSIGN_OR_RETURN(StreamState state, DecodeState(r.state));
    if (absl::Status v = ValidateStreamConfig(config); !v.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "its stored config is refused by this build: ", v.message()));
    }
    return Stream::Recover(r.stream_id, config, state, Env());
  } catch (const std::exception& e) {  // FAISS, allocation.
    return absl::FailedPreconditionError(
        absl::StrCat("its indexes failed to build: ", e.what()));
  }
}

void MemoryEngine::Quarantine(const std::string& id, absl::Status reason) {
  const absl::StatusCode code = reason.code() == absl::StatusCode::kDataLoss
                                    ? absl::StatusCode::kDataLoss
                                    : absl::StatusCode::kFailedPrecondition;
  absl::Status st(
      code, absl::StrCat("stream \"", id, "\" is quarantined since recovery: ",
                         reason.message(), "; DeleteStream removes it"));
  if (options_.error) options_.error(std::string(st.message()));
  quarantined_[id] = std::move(st);
}

namespace {

// The options with the sim profile read, and the backend in a line.
absl::StatusOr<EngineOptions> ResolveAccelerator(const EngineOptions& options,
                                                 std::string* description) {
  EngineOptions o = options;
  *description = "cpu";
  std::string profile = "";
  if (!o.sim_profile_path.empty()) {
    absl::StatusOr<DeviceProfile> p = LoadDeviceProfile(o.sim_profile_path);
    absl::StatusOr<SimHardware> hw =
        p.ok() ? SimHardwareFromProfile(*p) : p.status();
    if (!hw.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kSimProfileError, o.sim_profile_path, ": ", hw.status().ToString()));
    }
    o.sim = *hw;
    profile = absl::StrCat(p->name, " ");
  }
  if (o.sim.has_value()) {
    const SimHardware& hw = *o.sim;
    *description = absl::StrCat("sim: ", profile, "(", hw.lanes, " lanes at ",
                                hw.clock_hz / 1e6, " MHz, ",
                                hw.dram_bandwidth_bytes_per_s / 1e9, " GB/s)");
  }
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryEngine>> MemoryEngine::Open(
    std::unique_ptr<ColdStore> store, const EngineOptions& requested) {
  std::string description;
  KVMEM_ASSIGN_OR_RETURN(const EngineOptions options,
                         ResolveAccelerator(requested, &description));
  std::unique_ptr<MemoryEngine> engine(
      new MemoryEngine(std::move(store), options));
  engine->accel_description_ = description;
  if (engine->ownership_ != nullptr) {
    // Streams are taken up as calls name them (Adopt); this server owns
    // none yet.
    // Told on the coordinator's thread, which must go on renewing: streams
    // taken up from now on are refused at once (the generation), and the
    // dropping, which waits for appends in flight, runs in the background.
    engine->ownership_->OnLost([e = engine.get()](const absl::Status& why) {
      ++e->ownership_generation_;
      if (e->stopping_moves_.load()) return;
      e->background_->Submit([e, why] { e->DisownAll(why); });
    });
  } else {
    KVMEM_RETURN_IF_ERROR(engine->RecoverAll());
  }
  engine->opened_ = true;
  if (options.acknowledge_interval_ms > 0) {
    engine->ack_thread_ =
        std::thread([e = engine.get()] { e->AcknowledgeLoop(); });
  }
  return engine;
}

absl::Status MemoryEngine::RecoverAll() {
  KVMEM_ASSIGN_OR_RETURN(auto records, store_->ListStreams());
  absl::StatusOr<std::map<std::string, uint64_t>> acked =
      store_->Acknowledged();
  if (!acked.ok()) {
    // The record itself is damaged: nothing to compare with, loudly.
    if (options_.strict_recovery) return acked.status();
    if (options_.error) options_.error(std::string(acked.status().message()));
    acked = std::map<std::string, uint64_t>();
  }
  {
    kvmem::MutexLock lock(&mu_);
    for (const StreamRecord& r : records) {
      auto ack = acked->find(r.stream_id);
      Install(r.stream_id, ack == acked->end() ? 0 : ack->second,
              RecoverOne(r));
    }
    for (const auto& [id, want] : *acked) {
      if (want == 0 || streams_.count(id) || quarantined_.count(id)) {
        continue;
      }
      Quarantine(id, absl::DataLossError(absl::StrCat(
                         want,
                         " frames were acknowledged and the stream is missing "
                         "from storage: its records were lost from the "
                         "write-ahead log")));
      quarantined_acks_[id] = want;
    }
    if (options_.strict_recovery && !quarantined_.empty()) {
      const absl::Status& first = quarantined_.begin()->second;
      return absl::Status(
          first.code(),
          absl::StrCat("strict recovery: ", quarantined_.size(),
                       " stream(s) cannot be served as acknowledged; first: ",
                       first.message()));
    }
  }
  kvmem::MutexLock control(&control_mu_);
  last_record_ = *std::move(acked);
  return absl::OkStatus();
}

std::map<std::string, uint64_t> MemoryEngine::AcknowledgedNow(
    const std::string* except) const {
  std::vector<std::shared_ptr<Stream>> streams;
  std::map<std::string, uint64_t> out;
  {
    kvmem::MutexLock lock(&mu_);
    out = quarantined_acks_;
    for (const auto& [id, s] : streams_) streams.push_back(s);
  }
  for (const auto& s : streams) {
    const uint64_t n = s->AcknowledgedFrames();
    if (n > 0) out[s->id()] = n;
  }
  if (except != nullptr) out.erase(*except);
  return out;
}

absl::Status MemoryEngine::WriteAcknowledged(const std::string* except) {
  std::map<std::string, uint64_t> now = AcknowledgedNow(except);
  if (now == last_record_) return absl::OkStatus();
  KVMEM_RETURN_IF_ERROR(store_->RecordAcknowledged(now));
  last_record_ = std::move(now);
  return absl::OkStatus();
}

absl::Status MemoryEngine::RecordAcknowledged() {
  kvmem::MutexLock control(&control_mu_);
  return WriteAcknowledged(nullptr);
}

void MemoryEngine::AcknowledgeLoop() {
  bool failing = false;
  kvmem::MutexLock lock(&ack_mu_);
  while (!stopping_) {
    ack_mu_.AwaitWithTimeout(
        kvmem::Condition(&stopping_),
        absl::Milliseconds(options_.acknowledge_interval_ms));
    if (stopping_) break;
    ack_mu_.Unlock();
    absl::Status st = RecordAcknowledged();
    // Told once per failing spell (a full disk fails it every second).
    if (!st.ok() && !failing && options_.warn) {
      options_.warn(
          absl::StrCat("acknowledgement record not written: ", st.message()));
    } else if (st.ok() && failing && options_.warn) {
      options_.warn("acknowledgement record written again");
    }
    failing = !st.ok();
    ack_mu_.Lock();
  }
}

absl::StatusOr<OpenStreamResult> MemoryEngine::OpenStream(
    const std::string& id, const StreamConfig& requested) {
  KVMEM_RETURN_IF_ERROR(ValidateEngineStreamId(id));
  // control_mu_ orders creations and deletions; mu_ is held only for map
  // lookups, never across a commit, so other streams' calls do not wait.
  kvmem::MutexLock control(&control_mu_);
  // Before the claim Lookup makes for a new stream (see Stream::
  // owner_generation).
  const uint64_t generation = ownership_generation_.load();
  KVMEM_ASSIGN_OR_RETURN(std::shared_ptr<Stream> existing,
                         Lookup(id, /*keep_absent=*/true));
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
  stream->set_owner_generation(generation);
  std::shared_ptr<Stream> shared = std::move(stream);
  {
    kvmem::MutexLock lock(&mu_);
    streams_[id] = shared;
  }
  return OpenStreamResult{true, shared->Stats()};
}

absl::StatusOr<std::shared_ptr<Stream>> MemoryEngine::FindStream(
    const std::string& id) {
  KVMEM_RETURN_IF_ERROR(ValidateEngineStreamId(id));
  KVMEM_ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                         Lookup(id, /*keep_absent=*/false));
  if (stream != nullptr) return stream;
  return absl::NotFoundError(absl::StrCat("stream \"", id, "\" not found"));
}

absl::StatusOr<StreamStats> MemoryEngine::CloseStream(const std::string& id) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  KVMEM_RETURN_IF_ERROR(stream->Close());
  return stream->Stats();
}

absl::Status MemoryEngine::DeleteStream(const std::string& id) {
  kvmem::MutexLock control(&control_mu_);
  KVMEM_RETURN_IF_ERROR(ValidateEngineStreamId(id));
  if (ownership_ != nullptr) {
    // Taken up first (a quarantined stream too: it is deleted below).
    absl::StatusOr<std::shared_ptr<Stream>> adopted = FindStream(id);
    kvmem::MutexLock lock(&mu_);
    if (!adopted.ok() && quarantined_.count(id) == 0) return adopted.status();
  }
  bool quarantined;
  {
    kvmem::MutexLock lock(&mu_);
    quarantined = quarantined_.count(id) > 0;
  }
  std::shared_ptr<Stream> stream;
  if (!quarantined) {
    KVMEM_ASSIGN_OR_RETURN(stream, FindStream(id));
    // Marked first, so calls already holding the stream answer NOT_FOUND
    // instead of reading records while they are removed.
    stream->MarkDeleted(true);
  }
  // The record forgets the stream before the store does: a crash in
  // between leaves a stream nobody vouches for, never a false loss.
  absl::Status s = WriteAcknowledged(&id);
  if (s.ok()) s = store_->DeleteStream(id);
  if (!s.ok()) {
    if (stream) stream->MarkDeleted(false);  // Nothing removed; keep serving.
    return s;
  }
  {
    kvmem::MutexLock lock(&mu_);
    streams_.erase(id);
    quarantined_.erase(id);
    quarantined_acks_.erase(id);
  }
  if (ownership_ != nullptr) {
    store_->ReleaseStream(id);
    ownership_->Release(id);
  }
  return absl::OkStatus();
}

std::vector<StreamStats> MemoryEngine::ListStreams() const {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    kvmem::MutexLock lock(&mu_);
    for (const auto& [id, s] : streams_) streams.push_back(s);
  }
  std::vector<StreamStats> out;
  out.reserve(streams.size());
  for (const auto& s : streams) out.push_back(s->Stats());
  return out;
}

absl::StatusOr<StreamStats> MemoryEngine::GetStats(const std::string& id) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  // The blocks an ack reported are sealed in the stats (seal_after_ack). A
  // seal that fails (the store) leaves the block open in them, as it is.
  stream->SealIfPending().IgnoreError();
  return stream->Stats();
}

absl::StatusOr<AppendResult> MemoryEngine::Append(const std::string& id,
                                                  Frame frame) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  return stream->Append(std::move(frame));
}

absl::StatusOr<RecallResult> MemoryEngine::Recall(const std::string& id,
                                                  const RecallQuery& query) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  return stream->Recall(query);
}

std::vector<StreamHandle> MemoryEngine::StreamsWithPrefix(
    const std::string& prefix) const {
  std::vector<StreamHandle> out;
  kvmem::MutexLock lock(&mu_);
  for (auto it = streams_.lower_bound(prefix);
       it != streams_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    out.push_back(StreamHandle(it->second));
  }
  return out;
}

absl::StatusOr<StreamHandle> MemoryEngine::Find(const std::string& id) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  return StreamHandle(std::move(stream));
}

absl::Status MemoryEngine::RunMaintenance(const std::string& id) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  return stream->RunMaintenance();
}

absl::StatusOr<size_t> MemoryEngine::RebuildIndex(const std::string& id) {
  KVMEM_ASSIGN_OR_RETURN(auto stream, FindStream(id));
  return stream->RebuildIndex();
}

const std::string& StreamHandle::id() const { return stream_->id(); }
const StreamConfig& StreamHandle::config() const { return stream_->config(); }
absl::StatusOr<AppendResult> StreamHandle::Append(Frame frame) const {
  return stream_->Append(std::move(frame));
}
absl::Status StreamHandle::CheckFrameHeader(const Frame& header) const {
  return stream_->CheckFrameHeader(header);
}
StreamStats StreamHandle::Stats() const { return stream_->Stats(); }
absl::StatusOr<BlockInfo> StreamHandle::GetBlock(uint64_t block_id) const {
  return stream_->GetBlock(block_id);
}
absl::StatusOr<std::vector<PayloadPiece>> StreamHandle::ReadBlockPayload(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& layers, BlockInfo* info) const {
  return stream_->ReadBlockPayload(block_id, layout, layers, info);
}
absl::StatusOr<uint64_t> StreamHandle::ReadBlockPayloadInto(
    uint64_t block_id, PayloadLayout layout,
    const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
    BlockInfo* info) const {
  return stream_->ReadBlockPayloadInto(block_id, layout, layers, dst, capacity,
                                       info);
}
absl::StatusOr<std::vector<PayloadPiece>> StreamHandle::ReadBlockTokens(
    uint64_t block_id, const std::vector<uint32_t>& tokens,
    const std::vector<uint32_t>& layers, BlockInfo* info) const {
  return stream_->ReadBlockTokens(block_id, tokens, layers, info);
}
absl::StatusOr<uint64_t> StreamHandle::ReadBlockTokensInto(
    uint64_t block_id, const std::vector<uint32_t>& tokens,
    const std::vector<uint32_t>& layers, uint8_t* dst, uint64_t capacity,
    BlockInfo* info) const {
  return stream_->ReadBlockTokensInto(block_id, tokens, layers, dst, capacity,
                                      info);
}
uint64_t StreamHandle::RetainedBytes() const {
  return stream_->RetainedBytes();
}

std::vector<QuarantinedStream> MemoryEngine::Quarantined() const {
  kvmem::MutexLock lock(&mu_);
  std::vector<QuarantinedStream> out;
  for (const auto& [id, st] : quarantined_) out.push_back({id, st});
  return out;
}

size_t MemoryEngine::stream_count() const {
  kvmem::MutexLock lock(&mu_);
  return streams_.size();
}

}  // namespace kvmem
