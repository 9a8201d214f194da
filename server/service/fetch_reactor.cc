// The FetchBlocks reactor: the blocks' bytes as a stream of chunks, or
// placed in the caller's shared-memory arena.
//
// Byte stream. Chunks go out straight from where the bytes are (a warm
// block's memory, the store's read) as slices of the message
// (SerializeWithBytes), from the gRPC thread that saw the last write done.
// Blocks are read one ahead: while block i's chunks are being sent, block
// i+1 is read on the executor (a RocksDB read may block), so storage and
// the socket work at the same time. Warm blocks are read inline (a copy of
// RAM). A reader that finds the next block not read yet leaves a
// continuation that the read runs when it ends. A block's bytes count in
// the tenant's held answers (--max_queued_response_bytes, with the
// Sessions') from before its read until its last chunk is written: a block
// is read ahead only while half the share stays free, and a call whose next
// block finds no room ends RESOURCE_EXHAUSTED saying how many blocks it sent
// (a client that opened many fetches and read none pinned a block or two of
// each in RAM, counted nowhere).
#include <cmath>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "engine/stream_config.h"
#include "server/service/delivery.h"
#include "server/service/delivery_sinks.h"
#include "server/service/proto_convert.h"
#include "server/service/reactors.h"
#include "server/service/service_options.h"
#include "server/service/shm_arenas.h"
#include "server/service/status_util.h"
#include "server/service/wire.h"

namespace kvmem {
namespace {

// The smallest max_chunk_bytes a fetch may ask for (0 aside): the server's
// own --max_chunk_bytes floor.
constexpr uint32_t kMinChunkBytes = 1024;

// One block read ahead of the sender.
struct Ahead {
  Admission::Reservation held;  // The block's bytes, in the tenant's share.
  kvmem::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<std::vector<PayloadPiece>> pieces ABSL_GUARDED_BY(mu);
  BlockInfo info ABSL_GUARDED_BY(mu);
  // Set by a sender that found the read not done; the read runs it.
  std::function<void()> then ABSL_GUARDED_BY(mu);
};

class FetchBlocksReactor final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchBlocksReactor(MemoryEngine* engine, Executor* executor, Caller caller,
                     const ServiceOptions& options,
                     const v1::FetchBlocksRequest& req)
      : executor_(executor),
        caller_(std::move(caller)),
        shm_(options.shm),
        helpers_(options.copy_helpers) {
    const uint32_t max_chunk = options.max_chunk_bytes;
    absl::Status s = Prepare(engine, req, max_chunk);
    if (!s.ok()) {
      Finish(ToGrpcStatus(caller_.Scrub(s)));
      return;
    }
    if (arena_id_ != 0) {
      // Shared memory: one step, on the executor unless every block is in
      // RAM.
      if (all_warm_) {
        Place();
      } else {
        executor_->Submit([this] { Place(); });
      }
      return;
    }
    if (!StartRead(/*needed=*/true)) return;
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // A lease the client will never hear of in full goes back now, and
      // the blocks held leave the tenant's share (a read still running
      // keeps its own until it ends).
      if (lease_) shm_->Abandon(*lease_);
      out_.Clear();
      pieces_.clear();
      held_ = nullptr;
      ahead_ = nullptr;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client stopped reading"));
      return;
    }
    if (arena_id_ != 0) {
      NextPlaced();
    } else {
      Next();
    }
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Prepare(MemoryEngine* engine, const v1::FetchBlocksRequest& req,
                       uint32_t max_chunk) {
    // Leases the client is done with go back whatever becomes of the fetch.
    KVMEM_RETURN_IF_ERROR(
        ReleaseNamedLeases(shm_, caller_.tenant(), req.shm_arena_id(),
                           absl::MakeConstSpan(req.release_lease_ids().data(),
                                               req.release_lease_ids().size()),
                           "release_lease_ids"));
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
    // A message per byte cost an audit's 1 MiB fetch 16 s of server CPU.
    if (req.max_chunk_bytes() != 0 && req.max_chunk_bytes() < kMinChunkBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_chunk_bytes is ", req.max_chunk_bytes(),
                       "; must be 0 or at least ", kMinChunkBytes));
    }
    KVMEM_ASSIGN_OR_RETURN(layout_,
                           LayoutFromProto(req.layout(), req.layers_size()));
    layers_.assign(req.layers().begin(), req.layers().end());
    chunk_ = req.max_chunk_bytes() == 0 ? std::min(1u << 20, max_chunk)
                                        : req.max_chunk_bytes();
    arena_id_ = req.shm_arena_id();
    all_warm_ = true;
    for (size_t i = 0; i < static_cast<size_t>(req.block_ids_size()); ++i) {
      absl::StatusOr<BlockInfo> b = stream_->GetBlock(req.block_ids(i));
      if (!b.ok()) return b.status();
      blocks_.push_back(*b);
      all_warm_ = all_warm_ && b->tier == Tier::kWarm;
    }
    return TokensOf(req);
  }

  // req.tokens as one list per block of block_ids (empty: all tokens);
  // tokens_ stays empty unless the layout is TOKEN_LAYER_MAJOR. Each list is
  // checked against its block before it is copied to the block's other
  // places in block_ids (a valid list holds at most the block's tokens; an
  // audit's list of 250,000 offsets for a block named 1,024 times took 1 GB
  // before the check refused it).
  absl::Status TokensOf(const v1::FetchBlocksRequest& req) {
    if (!GathersTokens(req.layout())) {
      if (req.tokens_size() > 0) {
        return absl::InvalidArgumentError(
            "tokens is set; it needs layout PAYLOAD_LAYOUT_TOKEN_LAYER_MAJOR");
      }
      return absl::OkStatus();
    }
    // Where each block id stands in block_ids (a block listed twice gets
    // the same tokens each time), and whether tokens named it yet.
    absl::flat_hash_map<uint64_t, std::pair<std::vector<size_t>, bool>> at;
    for (int i = 0; i < req.block_ids_size(); ++i) {
      at[req.block_ids(i)].first.push_back(i);
    }
    tokens_.assign(req.block_ids_size(), {});
    for (const v1::BlockTokens& t : req.tokens()) {
      auto it = at.find(t.block_id());
      if (it == at.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokens names block ", t.block_id(),
                         ", which is not in block_ids"));
      }
      if (it->second.second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokens names block ", t.block_id(), " twice"));
      }
      it->second.second = true;
      const std::vector<size_t>& places = it->second.first;
      std::vector<uint32_t>& first = tokens_[places[0]];
      first.assign(t.token_offsets().begin(), t.token_offsets().end());
      const BlockInfo& b = blocks_[places[0]];
      KVMEM_RETURN_IF_ERROR(
          ValidateTokenList(first, b.token_count, b.id, "tokens"));
      for (size_t k = 1; k < places.size(); ++k) tokens_[places[k]] = first;
    }
    return absl::OkStatus();
  }

  // What block i's read will hold: a token gather copies just its tokens
  // of its layers (rounded up); any other read keeps the whole block alive
  // at full precision whatever layers it sends (a warm block's memory, or a
  // cold block built whole from its frames), so it counts the payload.
  uint64_t ReadBytes(size_t i) const {
    const BlockInfo& b = blocks_[i];
    if (tokens_.empty()) return b.payload_bytes;
    long double bytes = static_cast<long double>(b.payload_bytes);
    if (!tokens_[i].empty() && b.token_count > 0) {
      bytes = bytes * tokens_[i].size() / b.token_count;
    }
    const uint32_t layers = stream_->config().geometry.layers;
    if (!layers_.empty() && layers > 0) bytes = bytes * layers_.size() / layers;
    return static_cast<uint64_t>(std::ceil(bytes));
  }

  // Starts reading the next block (block_; none past the last) once its
  // bytes are reserved in the tenant's share: inline when it was in RAM at
  // Prepare (a block that left RAM since is read here all the same: rare
  // and bounded), else on the executor. Without room a read ahead waits
  // for the current block to be sent (true, nothing started); a read
  // `needed` now ends the call (false).
  bool StartRead(bool needed) {
    ahead_ = nullptr;
    if (block_ >= blocks_.size()) return true;
    absl::StatusOr<Admission::Reservation> held =
        caller_.ReserveAnswerBytes(ReadBytes(block_), /*ahead=*/!needed);
    if (!held.ok()) {
      if (!needed) return true;
      absl::Status refused = absl::ResourceExhaustedError(
          absl::StrCat("FetchBlocks sent ", block_, " of ", blocks_.size(),
                       " blocks: ", held.status().message()));
      refused.SetPayload(kBlocksSentPayload, absl::Cord(absl::StrCat(block_)));
      Finish(ToGrpcStatus(caller_.Scrub(refused)));
      return false;
    }
    const size_t i = block_++;
    auto a = std::make_shared<Ahead>();
    a->held = *std::move(held);
    ahead_ = a;
    std::vector<uint32_t> tokens;
    if (!tokens_.empty()) tokens = tokens_[i];
    auto read = [a, stream = *stream_, id = blocks_[i].id, layout = layout_,
                 layers = layers_, gather = !tokens_.empty(),
                 tokens = std::move(tokens)] {
      BlockInfo info;
      absl::StatusOr<std::vector<PayloadPiece>> pieces =
          gather ? stream.ReadBlockTokens(id, tokens, layers, &info)
                 : stream.ReadBlockPayload(id, layout, layers, &info);
      std::function<void()> then;
      {
        kvmem::MutexLock lock(&a->mu);
        a->pieces = std::move(pieces);
        a->info = info;
        a->done = true;
        then = std::move(a->then);
      }
      if (then) then();
    };
    if (blocks_[i].tier == Tier::kWarm) {
      read();
    } else {
      executor_->Submit(std::move(read));
    }
    return true;
  }

  // Sends the next chunk, taking the next block (read ahead) when the
  // current one is used up; finishes after the last.
  void Next() {
    while (piece_ >= pieces_.size()) {
      // The current block is written: its bytes leave the share (the last
      // message's slices of them first).
      out_.Clear();
      pieces_.clear();
      held_ = nullptr;
      if (ahead_ == nullptr) {
        if (block_ >= blocks_.size()) {
          Finish(grpc::Status::OK);
          return;
        }
        if (!StartRead(/*needed=*/true)) return;
      }
      std::shared_ptr<Ahead> a = ahead_;
      {
        kvmem::MutexLock lock(&a->mu);
        if (!a->done) {
          a->then = [this] { Next(); };
          return;
        }
        if (!a->pieces.ok()) {
          Finish(ToGrpcStatus(caller_.Scrub(a->pieces.status())));
          return;
        }
        // The header carries the block as read (a tier move may have
        // changed it since the request was checked).
        pieces_ = *std::move(a->pieces);
        current_ = a->info;
        held_ = std::move(a->held);
      }
      StartRead(/*needed=*/false);
      piece_ = 0;
      piece_pos_ = 0;
      block_offset_ = 0;
    }
    SendChunk();
  }

  // [piece_pos_, + chunk) of the current piece, from where its bytes are.
  void SendChunk() {
    const PayloadPiece& p = pieces_[piece_];
    const size_t piece_bytes = p.size();
    resp_.Clear();
    resp_.set_block_id(current_.id);
    resp_.set_frame_index(p.frame_index);
    resp_.set_layer(p.layer);
    resp_.set_offset(block_offset_);
    if (block_offset_ == 0) ToProto(current_, resp_.mutable_block());
    const size_t n = std::min<size_t>(chunk_, piece_bytes - piece_pos_);
    std::vector<absl::string_view> chunk;
    size_t skip = piece_pos_, left = n;
    for (absl::string_view part : p.parts) {
      if (skip >= part.size()) {
        skip -= part.size();
        continue;
      }
      const size_t take = std::min(left, part.size() - skip);
      chunk.push_back(part.substr(skip, take));
      skip = 0;
      left -= take;
      if (left == 0) break;
    }
    const std::shared_ptr<const void> keep = p.keep;
    piece_pos_ += n;
    block_offset_ += n;
    if (piece_pos_ == piece_bytes) {
      ++piece_;
      piece_pos_ = 0;
    }
    resp_.set_last_chunk_of_block(piece_ == pieces_.size());
    const grpc::Status serialized = SerializeWithBytes(
        resp_, v1::FetchBlocksResponse::kDataFieldNumber, chunk, keep, &out_);
    if (!serialized.ok()) {
      Finish(serialized);
      return;
    }
    StartWrite(&out_);
  }

  // Shared memory: every block placed under one lease (ShmSink), then one
  // message per block naming its region.
  void Place() {
    if (shm_ == nullptr) {
      Finish(ToGrpcStatus(NoSharedMemory()));
      return;
    }
    DeliveryRequest d;
    d.stream = &*stream_;
    for (const BlockInfo& b : blocks_) d.block_ids.push_back(b.id);
    d.layout = layout_;
    d.layers = layers_;
    d.tokens = tokens_;
    d.executor = executor_;
    d.helpers = helpers_;
    ShmSink sink(shm_, caller_.tenant(), arena_id_);
    absl::StatusOr<Delivered> p = Deliver(d, &sink);
    if (!p.ok()) {
      Finish(ToGrpcStatus(caller_.Scrub(p.status())));
      return;
    }
    lease_ = sink.lease();
    for (size_t i = 0; i < d.block_ids.size(); ++i) {
      v1::FetchBlocksResponse& r = placed_.emplace_back();
      r.set_block_id(d.block_ids[i]);
      r.set_frame_index(p->blocks[i].first_frame);
      ToProto(p->blocks[i], r.mutable_block());
      *r.mutable_shm() = sink.Region(i);
      r.set_last_chunk_of_block(true);
    }
    NextPlaced();
  }

  void NextPlaced() {
    if (block_ >= placed_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const grpc::Status serialized = SerializeMessage(placed_[block_++], &out_);
    if (!serialized.ok()) {
      if (lease_) shm_->Abandon(*lease_);
      Finish(serialized);
      return;
    }
    StartWrite(&out_);
  }

  Executor* const executor_;
  const Caller caller_;
  ShmArenas* const shm_;
  const int helpers_;
  std::optional<StreamHandle> stream_;
  PayloadLayout layout_ = PayloadLayout::kFrameMajor;
  std::vector<uint32_t> layers_;
  // TOKEN_LAYER_MAJOR: each block's tokens (empty: all); else empty.
  std::vector<std::vector<uint32_t>> tokens_;
  std::vector<BlockInfo> blocks_;  // As at Prepare.
  bool all_warm_ = false;
  uint32_t chunk_ = 0;
  uint64_t arena_id_ = 0;
  std::vector<v1::FetchBlocksResponse> placed_;
  std::optional<ShmArenas::Lease> lease_;  // Shared memory, once placed.
  // The next block to read (byte stream) or to place (shared memory).
  size_t block_ = 0;
  std::shared_ptr<Ahead> ahead_;
  BlockInfo current_;
  std::vector<PayloadPiece> pieces_;
  Admission::Reservation held_;  // pieces_' bytes, in the tenant's share.
  size_t piece_ = 0;
  size_t piece_pos_ = 0;
  uint64_t block_offset_ = 0;
  v1::FetchBlocksResponse resp_;
  grpc::ByteBuffer out_;  // The message's bytes, the write in flight.
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFetchBlocksReactor(
    MemoryEngine* engine, Executor* executor, Caller caller,
    const v1::FetchBlocksRequest& req, const ServiceOptions& options) {
  return new FetchBlocksReactor(engine, executor, std::move(caller), options,
                                req);
}

}  // namespace kvmem
