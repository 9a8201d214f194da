#include "server/service/reactors.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/service/frame_ingest.h"
#include "server/service/handlers.h"
#include "server/service/proto_convert.h"
#include "server/service/status_util.h"
#include "server/service/wire.h"

namespace kvmem {

namespace {

class AppendFramesReactor final
    : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  AppendFramesReactor(MemoryEngine* engine, Executor* executor, Caller caller,
                      grpc::ByteBuffer* out)
      : engine_(engine),
        executor_(executor),
        caller_(std::move(caller)),
        out_(out) {
    StartRead(&in_);
  }

  // ok: a message arrived (parsed by the task); !ok: the client half-closed
  // (or the call broke).
  void OnReadDone(bool ok) override {
    executor_->Submit([this, ok] { Step(ok); });
  }
  void OnDone() override { delete this; }

 private:
  void Step(bool ok) {
    absl::Status s;
    if (!ok) {
      s = ingest_ ? ingest_->CheckNoPartialFrame() : absl::OkStatus();
    } else if (!ParseMessage(in_, &req_)) {
      s = BadMessage(messages_ + 1, "AppendFramesRequest");
    } else {
      ++messages_;
      s = Handle();
    }
    if (ok && s.ok()) {
      StartRead(&in_);
      return;
    }
    v1::AppendFramesResponse resp;
    resp.set_last_durable_frame(-1);
    if (ingest_) {
      resp.set_last_durable_frame(ingest_->stream().Stats().last_durable_frame);
      resp.set_frames_written(ingest_->frames_written());
      resp.set_bytes_written(ingest_->bytes_written());
      resp.set_sealed_blocks(ingest_->sealed_blocks());
      if (!s.ok()) s = ingest_->WithResumePoint(s);
      // Released before the client hears the end (see FrameIngest).
      ingest_->Release();
    }
    Finish(s.ok() ? SerializeMessage(resp, out_)
                  : ToGrpcStatus(caller_.Scrub(s)));
  }

  absl::Status Handle() {
    if (!ingest_) {
      if (req_.stream_id().empty()) {
        return absl::InvalidArgumentError(
            "stream_id is empty on the first AppendFramesRequest");
      }
      KVMEM_ASSIGN_OR_RETURN(const std::string id,
                             caller_.EngineId(req_.stream_id()));
      absl::StatusOr<StreamHandle> stream = engine_->Find(id);
      if (!stream.ok()) return stream.status();
      client_id_ = req_.stream_id();
      ingest_.emplace(*std::move(stream),
                      [c = caller_](const StreamHandle& st, uint64_t bytes) {
                        return c.AdmitBytes(st, bytes);
                      });
    } else if (!req_.stream_id().empty() && req_.stream_id() != client_id_) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream_id \"", req_.stream_id(), "\" differs from \"",
                       client_id_, "\" of this call; use one call per stream"));
    }
    if (req_.item_case() == v1::AppendFramesRequest::ITEM_NOT_SET) {
      return absl::InvalidArgumentError(
          "AppendFramesRequest has neither frame nor chunk");
    }
    return ingest_
        ->Feed(req_.has_frame() ? req_.mutable_frame() : nullptr,
               req_.has_chunk() ? req_.mutable_chunk() : nullptr)
        .status();
  }

  MemoryEngine* const engine_;
  Executor* const executor_;
  const Caller caller_;
  grpc::ByteBuffer* const out_;  // The response's bytes.
  grpc::ByteBuffer in_;          // The message being read.
  v1::AppendFramesRequest req_;  // ... parsed.
  std::string client_id_;        // The caller's name for the stream.
  std::optional<FrameIngest> ingest_;
  uint64_t messages_ = 0;  // Parsed so far.
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewAppendFramesReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    grpc::ByteBuffer* resp) {
  return new AppendFramesReactor(engine, executor, std::move(caller), resp);
}

}  // namespace kvmem
