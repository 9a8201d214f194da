#include "server/service/reactors.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/service/delivery.h"
#include "server/service/frame_ingest.h"
#include "server/service/kvmem_service.h"
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

class FetchBlocksReactor final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchBlocksReactor(MemoryEngine* engine, Executor* executor, Caller caller,
                     ShmArenas* shm, const v1::FetchBlocksRequest& req,
                     uint32_t max_chunk)
      : executor_(executor), caller_(std::move(caller)), shm_(shm) {
    absl::Status s = Prepare(engine, req, max_chunk);
    if (!s.ok()) {
      Finish(ToGrpcStatus(caller_.Scrub(s)));
      return;
    }
    Continue();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client stopped reading"));
      return;
    }
    Continue();
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Prepare(MemoryEngine* engine, const v1::FetchBlocksRequest& req,
                       uint32_t max_chunk) {
    KVMEM_ASSIGN_OR_RETURN(const std::string id,
                           caller_.EngineId(req.stream_id()));
    absl::StatusOr<StreamHandle> stream = engine->Find(id);
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
    KVMEM_ASSIGN_OR_RETURN(layout_,
                           LayoutFromProto(req.layout(), req.layers_size()));
    layers_.assign(req.layers().begin(), req.layers().end());
    chunk_ = req.max_chunk_bytes() == 0 ? std::min(1u << 20, max_chunk)
                                        : req.max_chunk_bytes();
    arena_id_ = req.shm_arena_id();
    all_warm_ = true;
    for (uint64_t id : req.block_ids()) {
      absl::StatusOr<BlockInfo> b = stream_->GetBlock(id);
      if (!b.ok()) return b.status();
      blocks_.push_back(*b);
      all_warm_ = all_warm_ && b->tier == Tier::kWarm;
    }
    return absl::OkStatus();
  }

  // Blocks in RAM are read on this thread (a copy, no storage); others on
  // the executor, as RocksDB reads may block. (A block that left RAM since
  // Prepare is read here all the same: a rare, bounded read.)
  void Continue() {
    if (all_warm_) {
      Next();
    } else {
      executor_->Submit([this] { Next(); });
    }
  }

  // Shared memory: every block placed under one lease, then one message per
  // block naming its region.
  absl::Status Place() {
    std::vector<uint64_t> ids;
    for (const BlockInfo& b : blocks_) ids.push_back(b.id);
    KVMEM_ASSIGN_OR_RETURN(
        Placed p,
        PlaceBlocks(shm_, caller_, arena_id_, *stream_, ids, layout_, layers_));
    for (size_t i = 0; i < ids.size(); ++i) {
      v1::FetchBlocksResponse& r = placed_.emplace_back();
      r.set_block_id(ids[i]);
      r.set_frame_index(p.blocks[i].first_frame);
      ToProto(p.blocks[i], r.mutable_block());
      *r.mutable_shm() = p.regions[i];
      r.set_last_chunk_of_block(true);
    }
    return absl::OkStatus();
  }

  // Sends the next message: the next chunk (reading the next block when the
  // current one is used up) or, shared memory, the next block's region;
  // finishes after the last.
  void Next() {
    if (arena_id_ != 0) {
      if (!placed_done_) {
        placed_done_ = true;
        const absl::Status s = Place();
        if (!s.ok()) {
          Finish(ToGrpcStatus(caller_.Scrub(s)));
          return;
        }
      }
      if (block_ >= placed_.size()) {
        Finish(grpc::Status::OK);
        return;
      }
      Write(placed_[block_++]);
      return;
    }
    while (piece_ >= pieces_.size()) {
      if (block_ >= blocks_.size()) {
        Finish(grpc::Status::OK);
        return;
      }
      // The header carries the block as read (a tier move may have changed
      // it since the request was checked).
      absl::StatusOr<std::vector<PayloadPiece>> pieces =
          stream_->ReadBlockPayload(blocks_[block_].id, layout_, layers_,
                                    &current_);
      if (!pieces.ok()) {
        Finish(ToGrpcStatus(caller_.Scrub(pieces.status())));
        return;
      }
      pieces_ = *std::move(pieces);
      ++block_;
      piece_ = 0;
      piece_pos_ = 0;
      block_offset_ = 0;
    }
    const PayloadPiece& p = pieces_[piece_];
    resp_.Clear();
    resp_.set_block_id(current_.id);
    resp_.set_frame_index(p.frame_index);
    resp_.set_layer(p.layer);
    resp_.set_offset(block_offset_);
    if (block_offset_ == 0) ToProto(current_, resp_.mutable_block());
    const size_t n = std::min<size_t>(chunk_, p.bytes.size() - piece_pos_);
    resp_.set_data(p.bytes.data() + piece_pos_, n);
    piece_pos_ += n;
    block_offset_ += n;
    if (piece_pos_ == p.bytes.size()) {
      ++piece_;
      piece_pos_ = 0;
    }
    resp_.set_last_chunk_of_block(piece_ == pieces_.size());
    Write(resp_);
  }

  void Write(const v1::FetchBlocksResponse& r) {
    const grpc::Status serialized = SerializeMessage(r, &out_);
    if (!serialized.ok()) {
      Finish(serialized);
      return;
    }
    StartWrite(&out_);
  }

  Executor* const executor_;
  const Caller caller_;
  ShmArenas* const shm_;
  std::optional<StreamHandle> stream_;
  PayloadLayout layout_ = PayloadLayout::kFrameMajor;
  std::vector<uint32_t> layers_;
  std::vector<BlockInfo> blocks_;
  bool all_warm_ = false;
  uint32_t chunk_ = 0;
  uint64_t arena_id_ = 0;
  bool placed_done_ = false;
  std::vector<v1::FetchBlocksResponse> placed_;
  size_t block_ = 0;
  BlockInfo current_;
  std::vector<PayloadPiece> pieces_;
  size_t piece_ = 0;
  size_t piece_pos_ = 0;
  uint64_t block_offset_ = 0;
  v1::FetchBlocksResponse resp_;
  grpc::ByteBuffer out_;  // The message's bytes, the write in flight.
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewAppendFramesReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    grpc::ByteBuffer* resp) {
  return new AppendFramesReactor(engine, executor, std::move(caller), resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFetchBlocksReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    const v1::FetchBlocksRequest& req, const ServiceOptions& options) {
  return new FetchBlocksReactor(engine, executor, std::move(caller),
                                options.shm, req, options.max_chunk_bytes);
}

}  // namespace kvmem
