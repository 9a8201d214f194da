// The Session reactor: appends and queries in, acks and recall sets out, in
// request order.
//
// Concurrency. Requests are handled one at a time (a "task"): appends on the
// Executor, recalls (RAM only) inline on the gRPC thread that read them;
// responses go through a queue with one write in flight. gRPC may call OnDone
// as soon as Finish completes and no operation is pending, which can be while
// a task still runs, so:
//   - tasks_ counts running tasks, and Finish is only called when it is 0;
//   - StartRead is only called by a task (tasks_ > 0), so never after Finish;
//   - whoever sees done_ with tasks_ == 0 deletes the reactor, and every
//     decision that may end the call is taken in the same critical section as
//     the bookkeeping, with no member touched after Finish or delete.
#include <deque>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "server/service/frame_ingest.h"
#include "server/service/handlers.h"
#include "server/service/proto_convert.h"
#include "server/service/reactors.h"
#include "server/service/status_util.h"
#include "server/service/wire.h"

namespace kvmem {
namespace {

class SessionReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionReactor(MemoryEngine* engine, Executor* executor, Caller caller,
                 const ServiceOptions& options)
      : engine_(engine),
        executor_(executor),
        caller_(std::move(caller)),
        options_(options),
        queue_limit_(options.session_queue_limit),
        queue_bytes_limit_(options.session_queue_bytes) {
    StartRead(&in_);
  }

  // ok: a message arrived; !ok: the client half-closed (or the call broke).
  void OnReadDone(bool ok) override {
    const bool parsed = ok && ParseMessage(in_, &req_);
    if (!parsed) {
      {
        kvmem::MutexLock lock(&mu_);
        if (!finish_) {
          absl::Status s = ok ? BadMessage(messages_ + 1, "SessionRequest")
                              : (ingest_ ? ingest_->CheckNoPartialFrame()
                                         : absl::OkStatus());
          finish_ = ToGrpcStatus(caller_.Scrub(s));
        }
      }
      Pump();
      return;
    }
    {
      kvmem::MutexLock lock(&mu_);
      ++tasks_;
      ++messages_;
    }
    // A query touches only RAM (summaries and index), like the unary
    // Recall: it runs inline on this callback thread rather than queueing
    // behind other calls' RocksDB commits on the executor. One that also
    // delivers bytes may read the store: the executor.
    if (req_.item_case() == v1::SessionRequest::kRecall &&
        !Delivers(req_.recall())) {
      RunTask();
    } else {
      executor_->Submit([this] { RunTask(); });
    }
  }

  void OnWriteDone(bool ok) override {
    bool resume_reads = false;
    // Released outside mu_ (its deleter takes the admission's lock).
    Admission::Reservation written = std::move(current_hold_);
    written.reset();
    {
      kvmem::MutexLock lock(&mu_);
      write_in_flight_ = false;
      queued_bytes_ -= current_bytes_;
      current_bytes_ = 0;
      if (!ok) {
        write_failed_ = true;
        if (!finish_) {
          finish_ = grpc::Status(grpc::StatusCode::CANCELLED,
                                 "the client stopped reading responses");
        }
      }
      if (read_paused_ && !finish_ && CanResumeLocked()) {
        read_paused_ = false;
        resume_reads = true;
        ++tasks_;  // The resumed read is issued under a task, like any other.
      }
    }
    if (resume_reads) {
      StartRead(&in_);
      EndTask();
    } else {
      Pump();
    }
  }

  void OnDone() override {
    bool destroy;
    {
      kvmem::MutexLock lock(&mu_);
      done_ = true;
      destroy = tasks_ == 0;
    }
    if (destroy) delete this;
  }

 private:
  enum class Action { kNothing, kWrite, kFinish, kDestroy };

  // Handles the request just read, queues its response, then reads the next
  // request unless the call is ending or the queue is full.
  void RunTask() {
    bool ending;
    {
      kvmem::MutexLock lock(&mu_);
      ending = finish_.has_value();
    }
    bool read_next = false;
    if (!ending) {
      v1::SessionResponse resp;
      resp.set_seq(req_.seq());
      absl::Status s = Handle(&resp);
      // Serialised here, outside the lock; queued as bytes.
      grpc::ByteBuffer bytes;
      const bool answer = resp.item_case() != v1::SessionResponse::ITEM_NOT_SET;
      Admission::Reservation hold;  // The response's bytes, for the tenant.
      if (s.ok() && answer) {
        const grpc::Status serialized = SerializeMessage(resp, &bytes);
        if (!serialized.ok()) {
          s = absl::InternalError(serialized.error_message());
        } else {
          hold = caller_.HoldResponseBytes(bytes.Length());
        }
      }
      kvmem::MutexLock lock(&mu_);
      if (!s.ok()) {
        if (ingest_) s = ingest_->WithResumePoint(s);
        if (!finish_) finish_ = ToGrpcStatus(caller_.Scrub(s));
      } else {
        if (answer) {
          const size_t size = bytes.Length();
          queue_.push_back({std::move(bytes), size, std::move(hold)});
          queued_bytes_ += size;
        }
        if (queue_.size() >= queue_limit_ ||
            queued_bytes_ >= queue_bytes_limit_ ||
            (queued_bytes_ > 0 && caller_.ResponsesOverShare())) {
          read_paused_ = true;
        }
        read_next = !read_paused_ && !finish_;
      }
    }
    if (read_next) StartRead(&in_);  // Safe: tasks_ > 0 keeps Finish away.
    EndTask();
  }

  // Fills resp for one request. A non-OK status ends the call (protocol or
  // append errors); a rejected query is answered with resp.error instead.
  absl::Status Handle(v1::SessionResponse* resp);

  // Reads resume once the queue has drained to half its bounds and the
  // tenant's queued responses are within its share, or once this Session
  // holds nothing at all (so a tenant over its share because of other
  // Sessions cannot stall it for good).
  bool CanResumeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queued_bytes_ == 0) return true;
    return queue_.size() <= queue_limit_ / 2 &&
           queued_bytes_ <= queue_bytes_limit_ / 2 &&
           !caller_.ResponsesOverShare();
  }

  // Decides, under mu_, what the call should do next. REQUIRES: mu_ held.
  Action NextActionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (done_) return tasks_ == 0 ? Action::kDestroy : Action::kNothing;
    if (finished_ || write_in_flight_) return Action::kNothing;
    // Queued responses (acks of stored frames among them) are sent even when
    // the call ends with an error, unless the client stopped reading.
    if (!queue_.empty() && !write_failed_) {
      Queued& next = queue_.front();
      current_ = std::move(next.bytes);
      current_bytes_ = next.size;
      current_hold_ = std::move(next.hold);
      queue_.pop_front();
      write_in_flight_ = true;
      return Action::kWrite;
    }
    if (finish_ && tasks_ == 0) {
      finished_ = true;
      return Action::kFinish;
    }
    return Action::kNothing;
  }

  // Performs an action decided by NextActionLocked, with mu_ released.
  void Perform(Action action, const grpc::Status& status) {
    switch (action) {
      case Action::kWrite:
        StartWrite(&current_);
        return;
      case Action::kFinish:
        // A frame half received is dropped and its bytes released before
        // the client hears the end, so its next call finds them free. (No
        // task runs now, and with finish_ set no reaction touches ingest_.)
        if (ingest_) ingest_->Release();
        Finish(status);  // May lead to OnDone: touch nothing after it.
        return;
      case Action::kDestroy:
        delete this;
        return;
      case Action::kNothing:
        return;
    }
  }

  // Called from reactions (no task running on this thread).
  void Pump() {
    Action action;
    grpc::Status status;
    {
      kvmem::MutexLock lock(&mu_);
      action = NextActionLocked();
      if (action == Action::kFinish) status = *finish_;
    }
    Perform(action, status);
  }

  // Ends a task: the bookkeeping and the next decision in one critical
  // section, so no other thread can finish or delete the call in between.
  void EndTask() {
    Action action;
    grpc::Status status;
    {
      kvmem::MutexLock lock(&mu_);
      --tasks_;
      action = NextActionLocked();
      if (action == Action::kFinish) status = *finish_;
    }
    Perform(action, status);
  }

  MemoryEngine* const engine_;
  Executor* const executor_;
  const Caller caller_;
  const ServiceOptions& options_;
  const uint32_t queue_limit_;
  const uint64_t queue_bytes_limit_;
  std::string client_id_;  // The caller's name for the bound stream.
  // Touched only by OnReadDone and the running task (one at a time): gRPC
  // delivers no read while one is being handled.
  grpc::ByteBuffer in_;     // The request being read.
  v1::SessionRequest req_;  // ... parsed.
  std::optional<FrameIngest> ingest_;

  // A response waiting to be written, its size, and its bytes held in the
  // tenant's count (Admission::HoldResponseBytes).
  struct Queued {
    grpc::ByteBuffer bytes;
    size_t size = 0;
    Admission::Reservation hold;
  };
  kvmem::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);  // Responses.
  grpc::ByteBuffer current_;                       // The write in flight.
  size_t current_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Admission::Reservation current_hold_;  // Touched by the writer only.
  // Bytes of queue_ and current_: bounded by queue_bytes_limit_ (plus one
  // response).
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int tasks_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called.
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // OnDone was called.
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  uint64_t messages_ ABSL_GUARDED_BY(mu_) = 0;  // Parsed so far.
};

absl::Status SessionReactor::Handle(v1::SessionResponse* resp) {
  switch (req_.item_case()) {
    case v1::SessionRequest::kOpen: {
      if (ingest_) {
        return absl::FailedPreconditionError(
            absl::StrCat("session is already bound to stream \"", client_id_,
                         "\"; open a new Session for another stream"));
      }
      const v1::OpenStreamRequest& open = req_.open();
      if (open.has_config()) {
        absl::Status s =
            RunOpen(engine_, caller_, open, resp->mutable_opened());
        if (!s.ok()) return s;
      }
      KVMEM_ASSIGN_OR_RETURN(const std::string id,
                             caller_.EngineId(open.stream_id()));
      absl::StatusOr<StreamHandle> stream = engine_->Find(id);
      if (!stream.ok()) return stream.status();
      if (!open.has_config()) {
        v1::OpenStreamResponse* opened = resp->mutable_opened();
        opened->set_created(false);
        ToProto(stream->Stats(), opened->mutable_stats());
        opened->mutable_stats()->set_stream_id(open.stream_id());
      }
      client_id_ = open.stream_id();
      ingest_.emplace(*std::move(stream),
                      [c = caller_](const StreamHandle& st, uint64_t bytes) {
                        return c.AdmitBytes(st, bytes);
                      });
      return absl::OkStatus();
    }
    case v1::SessionRequest::kFrame:
    case v1::SessionRequest::kChunk: {
      if (!ingest_) {
        return absl::FailedPreconditionError(
            "session has no stream; send SessionRequest.open first");
      }
      auto r = ingest_->Feed(req_.has_frame() ? req_.mutable_frame() : nullptr,
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
      RecallDeliveryCall call{
          engine_,
          executor_,
          &caller_,
          &options_,
          req_.recall().stream_id().empty() && ingest_
              ? absl::StatusOr<std::string>(ingest_->stream().id())
              : caller_.EngineId(req_.recall().stream_id()),
          /*session=*/true};
      absl::Status s = caller_.Scrub(
          RunRecallDelivering(call, req_.recall(), resp->mutable_recall()));
      if (!s.ok()) {
        resp->mutable_error()->set_code(static_cast<int32_t>(s.code()));
        resp->mutable_error()->set_message(std::string(s.message()));
        if (std::optional<std::string> owner = OwnerOf(s)) {
          resp->mutable_error()->set_owner(*owner);
        }
      }
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          "SessionRequest has no item (open, frame, chunk or recall)");
  }
}

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewSessionReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    const ServiceOptions& options) {
  return new SessionReactor(engine, executor, std::move(caller), options);
}

}  // namespace kvmem
