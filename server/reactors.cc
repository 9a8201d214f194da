#include "server/reactors.h"

#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/frame_ingest.h"
#include "server/kvmem_service.h"
#include "server/proto_convert.h"
#include "server/status_util.h"

namespace kvmem {
namespace {

// Adds "last durable frame is N" to an append error so the client knows
// where to resume without another call.
absl::Status WithResumePoint(const absl::Status& s, Stream& stream) {
  return absl::Status(s.code(),
                      absl::StrCat(s.message(), "; stream \"", stream.id(),
                                   "\" last durable frame is ",
                                   stream.Stats().last_durable_frame));
}

// Feeds one frame or chunk message to ingest.
absl::StatusOr<std::optional<AppendResult>> FeedIngest(
    FrameIngest& ingest, v1::FrameHeader* frame, v1::PayloadChunk* chunk) {
  if (frame != nullptr) return ingest.OnHeader(frame);
  return ingest.OnChunk(chunk);
}

class AppendFramesReactor final
    : public grpc::ServerReadReactor<v1::AppendFramesRequest> {
 public:
  AppendFramesReactor(MemoryEngine* engine, Executor* executor,
                      v1::AppendFramesResponse* resp)
      : engine_(engine), executor_(executor), resp_(resp) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    executor_->Submit([this, ok] { Step(ok); });
  }
  void OnDone() override { delete this; }

 private:
  void Step(bool ok) {
    absl::Status s =
        ok ? Handle()
           : (ingest_ ? ingest_->CheckNoPartialFrame() : absl::OkStatus());
    if (ok && s.ok()) {
      StartRead(&req_);
      return;
    }
    resp_->set_last_durable_frame(-1);
    if (ingest_) {
      resp_->set_last_durable_frame(
          ingest_->stream().Stats().last_durable_frame);
      resp_->set_frames_written(ingest_->frames_written());
      resp_->set_bytes_written(ingest_->bytes_written());
      resp_->set_sealed_blocks(ingest_->sealed_blocks());
      if (!s.ok()) s = WithResumePoint(s, ingest_->stream());
    }
    Finish(ToGrpcStatus(s));
  }

  absl::Status Handle() {
    if (!ingest_) {
      if (req_.stream_id().empty()) {
        return absl::InvalidArgumentError(
            "stream_id is empty on the first AppendFramesRequest");
      }
      absl::StatusOr<std::shared_ptr<Stream>> stream =
          engine_->Find(req_.stream_id());
      if (!stream.ok()) return stream.status();
      ingest_.emplace(*std::move(stream));
    } else if (!req_.stream_id().empty() &&
               req_.stream_id() != ingest_->stream().id()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stream_id \"", req_.stream_id(), "\" differs from \"",
          ingest_->stream().id(), "\" of this call; use one call per stream"));
    }
    if (req_.item_case() == v1::AppendFramesRequest::ITEM_NOT_SET) {
      return absl::InvalidArgumentError(
          "AppendFramesRequest has neither frame nor chunk");
    }
    return FeedIngest(*ingest_,
                      req_.has_frame() ? req_.mutable_frame() : nullptr,
                      req_.has_chunk() ? req_.mutable_chunk() : nullptr)
        .status();
  }

  MemoryEngine* const engine_;
  Executor* const executor_;
  v1::AppendFramesResponse* const resp_;
  v1::AppendFramesRequest req_;
  std::optional<FrameIngest> ingest_;
};

class SessionReactor final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  SessionReactor(MemoryEngine* engine, Executor* executor, uint32_t queue_limit)
      : engine_(engine), executor_(executor), queue_limit_(queue_limit) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::Status s =
          ingest_ ? ingest_->CheckNoPartialFrame() : absl::OkStatus();
      EndCall(ToGrpcStatus(s));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      task_in_flight_ = true;
    }
    executor_->Submit([this] {
      Step();
      bool destroy;
      {
        absl::MutexLock lock(&mu_);
        task_in_flight_ = false;
        destroy = done_;
      }
      if (destroy) delete this;
    });
  }

  void OnWriteDone(bool ok) override {
    bool resume_reads = false;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok && !finish_) {
        finish_ = grpc::Status(grpc::StatusCode::CANCELLED,
                               "the client stopped reading responses");
      }
      if (read_paused_ && queue_.size() <= queue_limit_ / 2 && !finish_) {
        read_paused_ = false;
        resume_reads = true;
      }
    }
    Pump();
    if (resume_reads) StartRead(&req_);
  }

  // gRPC calls OnDone once no operation is pending, which can be while a Step
  // task still runs (after a failed write ended the call); the last of the
  // two deletes the reactor.
  void OnDone() override {
    bool destroy;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      destroy = !task_in_flight_;
    }
    if (destroy) delete this;
  }

 private:
  void Step() {
    v1::SessionResponse resp;
    resp.set_seq(req_.seq());
    absl::Status s = Handle(&resp);
    if (!s.ok()) {
      if (ingest_) s = WithResumePoint(s, ingest_->stream());
      EndCall(ToGrpcStatus(s));
      return;
    }
    bool read_next = true;
    {
      absl::MutexLock lock(&mu_);
      if (resp.item_case() != v1::SessionResponse::ITEM_NOT_SET) {
        queue_.push_back(std::move(resp));
      }
      if (queue_.size() >= queue_limit_) {
        read_paused_ = true;
        read_next = false;
      }
      if (finish_) read_next = false;
    }
    Pump();
    if (read_next) StartRead(&req_);
  }

  // Fills resp for one request. A non-OK status ends the call (protocol or
  // append errors); a rejected query is answered with resp.error instead.
  absl::Status Handle(v1::SessionResponse* resp) {
    switch (req_.item_case()) {
      case v1::SessionRequest::kOpen: {
        if (ingest_) {
          return absl::FailedPreconditionError(absl::StrCat(
              "session is already bound to stream \"", ingest_->stream().id(),
              "\"; open a new Session for another stream"));
        }
        const v1::OpenStreamRequest& open = req_.open();
        if (open.has_config()) {
          absl::Status s = RunOpen(engine_, open, resp->mutable_opened());
          if (!s.ok()) return s;
        }
        absl::StatusOr<std::shared_ptr<Stream>> stream =
            engine_->Find(open.stream_id());
        if (!stream.ok()) return stream.status();
        if (!open.has_config()) {
          v1::OpenStreamResponse* opened = resp->mutable_opened();
          opened->set_created(false);
          ToProto((*stream)->Stats(), opened->mutable_stats());
        }
        ingest_.emplace(*std::move(stream));
        return absl::OkStatus();
      }
      case v1::SessionRequest::kFrame:
      case v1::SessionRequest::kChunk: {
        if (!ingest_) {
          return absl::FailedPreconditionError(
              "session has no stream; send SessionRequest.open first");
        }
        auto r = FeedIngest(*ingest_,
                            req_.has_frame() ? req_.mutable_frame() : nullptr,
                            req_.has_chunk() ? req_.mutable_chunk() : nullptr);
        if (!r.ok()) return r.status();
        if (r->has_value()) {
          v1::AppendAck* ack = resp->mutable_ack();
          ack->set_frame_index(static_cast<uint64_t>((*r)->last_durable_frame));
          ack->set_last_durable_frame((*r)->last_durable_frame);
          ack->set_sealed_block((*r)->sealed_block);
        }
        return absl::OkStatus();
      }
      case v1::SessionRequest::kRecall: {
        std::string id = req_.recall().stream_id();
        if (id.empty() && ingest_) id = ingest_->stream().id();
        absl::Status s =
            RunRecall(engine_, id, req_.recall(), resp->mutable_recall());
        if (!s.ok()) {
          resp->mutable_error()->set_code(static_cast<int32_t>(s.code()));
          resp->mutable_error()->set_message(std::string(s.message()));
        }
        return absl::OkStatus();
      }
      default:
        return absl::InvalidArgumentError(
            "SessionRequest has no item (open, frame, chunk or recall)");
    }
  }

  // Ends the call once every queued response is written.
  void EndCall(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_) finish_ = status;
    }
    Pump();
  }

  // Starts the next write, or Finish when the call is over and drained.
  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (write_in_flight_ || finished_) return;
      if (!queue_.empty() && !(finish_ && !finish_->ok())) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        write_in_flight_ = true;
        action = kWrite;
      } else if (finish_) {
        finished_ = true;
        status = *finish_;
        action = kFinish;
      }
    }
    if (action == kWrite) StartWrite(&current_);
    if (action == kFinish) Finish(status);
  }

  MemoryEngine* const engine_;
  Executor* const executor_;
  const uint32_t queue_limit_;
  v1::SessionRequest req_;
  std::optional<FrameIngest> ingest_;

  absl::Mutex mu_;
  std::deque<v1::SessionResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::SessionResponse current_;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool task_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
};

class FetchBlocksReactor final
    : public grpc::ServerWriteReactor<v1::FetchBlocksResponse> {
 public:
  FetchBlocksReactor(MemoryEngine* engine, Executor* executor,
                     const v1::FetchBlocksRequest& req, uint32_t max_chunk)
      : executor_(executor) {
    absl::Status s = Prepare(engine, req, max_chunk);
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    executor_->Submit([this] { Next(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client stopped reading"));
      return;
    }
    executor_->Submit([this] { Next(); });
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Prepare(MemoryEngine* engine, const v1::FetchBlocksRequest& req,
                       uint32_t max_chunk) {
    absl::StatusOr<std::shared_ptr<Stream>> stream =
        engine->Find(req.stream_id());
    if (!stream.ok()) return stream.status();
    stream_ = *std::move(stream);
    if (req.block_ids_size() == 0 || req.block_ids_size() > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block_ids has ", req.block_ids_size(), " ids; must be 1..1024"));
    }
    if (req.max_chunk_bytes() > max_chunk) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_chunk_bytes is ", req.max_chunk_bytes(),
                       "; the server allows at most ", max_chunk));
    }
    if (req.layout() != v1::PAYLOAD_LAYOUT_UNSPECIFIED &&
        req.layout() != v1::PAYLOAD_LAYOUT_FRAME_MAJOR) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout is ", static_cast<int>(req.layout()),
                       "; this server supports PAYLOAD_LAYOUT_FRAME_MAJOR"));
    }
    chunk_ = req.max_chunk_bytes() == 0 ? std::min(1u << 20, max_chunk)
                                        : req.max_chunk_bytes();
    for (uint64_t id : req.block_ids()) {
      absl::StatusOr<BlockInfo> b = stream_->GetBlock(id);
      if (!b.ok()) return b.status();
      blocks_.push_back(*b);
    }
    return absl::OkStatus();
  }

  // Sends the next chunk, reading the next frame when the current one is
  // used up; finishes after the last block.
  void Next() {
    while (frame_pos_ >= frame_.size()) {
      if (block_ < blocks_.size() && frame_loaded_ &&
          frame_index_ == blocks_[block_].last_frame) {
        ++block_;
        frame_loaded_ = false;
        block_offset_ = 0;
      }
      if (block_ >= blocks_.size()) {
        Finish(grpc::Status::OK);
        return;
      }
      frame_index_ =
          frame_loaded_ ? frame_index_ + 1 : blocks_[block_].first_frame;
      absl::StatusOr<std::string> payload = stream_->ReadFrame(frame_index_);
      if (!payload.ok()) {
        Finish(ToGrpcStatus(payload.status()));
        return;
      }
      frame_ = *std::move(payload);
      frame_pos_ = 0;
      frame_loaded_ = true;
    }
    const BlockInfo& b = blocks_[block_];
    resp_.Clear();
    resp_.set_block_id(b.id);
    resp_.set_frame_index(frame_index_);
    resp_.set_offset(block_offset_);
    if (block_offset_ == 0) ToProto(b, resp_.mutable_block());
    const size_t n = std::min<size_t>(chunk_, frame_.size() - frame_pos_);
    resp_.set_data(frame_.data() + frame_pos_, n);
    frame_pos_ += n;
    block_offset_ += n;
    resp_.set_last_chunk_of_block(frame_index_ == b.last_frame &&
                                  frame_pos_ == frame_.size());
    StartWrite(&resp_);
  }

  Executor* const executor_;
  std::shared_ptr<Stream> stream_;
  std::vector<BlockInfo> blocks_;
  uint32_t chunk_ = 0;
  size_t block_ = 0;
  bool frame_loaded_ = false;
  uint64_t frame_index_ = 0;
  std::string frame_;
  size_t frame_pos_ = 0;
  uint64_t block_offset_ = 0;
  v1::FetchBlocksResponse resp_;
};

}  // namespace

grpc::ServerReadReactor<v1::AppendFramesRequest>* NewAppendFramesReactor(
    MemoryEngine* engine, Executor* executor, v1::AppendFramesResponse* resp) {
  return new AppendFramesReactor(engine, executor, resp);
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>*
NewSessionReactor(MemoryEngine* engine, Executor* executor,
                  uint32_t queue_limit) {
  return new SessionReactor(engine, executor, queue_limit);
}

grpc::ServerWriteReactor<v1::FetchBlocksResponse>* NewFetchBlocksReactor(
    MemoryEngine* engine, Executor* executor, const v1::FetchBlocksRequest& req,
    uint32_t max_chunk_bytes) {
  return new FetchBlocksReactor(engine, executor, req, max_chunk_bytes);
}

}  // namespace kvmem
