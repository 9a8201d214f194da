// KvmemClient: the C++ client a front end links to talk to kvmem-server.
// Blocking calls over one channel; payloads larger than the chunk size are
// split into FrameHeader + PayloadChunk messages automatically.
//
// Thread safety: a KvmemClient may be shared by threads (gRPC channels and
// stubs are thread-safe). A SessionClient belongs to one thread at a time.
#ifndef KVMEM_CLIENT_CPP_KVMEM_CLIENT_H_
#define KVMEM_CLIENT_CPP_KVMEM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kvmem/v1/service.grpc.pb.h"

namespace kvmem {

struct ClientOptions {
  // Payload bytes per message when uploading; larger frames are chunked.
  uint32_t chunk_bytes = 1u << 20;
  int max_message_bytes = 64 << 20;
  // A connection of this client's own instead of one shared with other
  // clients of the same target (gRPC's global subchannel pool): load
  // generators use one per simulated camera.
  bool own_connection = false;
  // Sent on every call as "authorization: Bearer <key>" when the server
  // has tenants (kvmem-server --api_keys_file).
  std::string api_key;
  // TLS (TCP targets): the CA that signed the server's certificate; with
  // tls_cert_file and tls_key_file also a client certificate (for servers
  // run with --tls_client_ca_file). tls_server_name overrides the name the
  // certificate is checked against (default: the target's host).
  std::string tls_ca_file, tls_cert_file, tls_key_file, tls_server_name;
  // The shared-memory arena attached on first use (AttachSharedMemory):
  // room for the leases held at once (e.g. two recall sets of a 7B model,
  // 2 x ~72 MiB, when one is released after the next arrives).
  uint64_t shm_arena_bytes = 256ull << 20;
  // Servers sharing a store (kvmem-server --etcd) answer a call on a
  // stream another server owns with UNAVAILABLE and the owner's address in
  // the trailing metadata kOwnerHeader. The client then sends that
  // stream's calls to the owner, up to this many hops per call (0: never;
  // the status comes back as it is). Followed: the unary calls,
  // AppendFrames (resuming after the owner's last durable frame),
  // Recall, FetchBlocks/FetchInto and StartSession; not shared-memory
  // delivery, which needs the owner on this host.
  int max_redirects = 3;
};

// A frame to upload: header fields (its payload field is ignored) and payload.
struct OutgoingFrame {
  v1::FrameHeader header;
  std::string payload;
};

// One block's bytes from FetchBlocks.
struct FetchedBlock {
  v1::RecalledBlock info;
  std::string payload;  // All its frames, concatenated as appended.
};

// How FetchBlocks lays out and chunks the bytes.
struct FetchOptions {
  v1::PayloadLayout layout = v1::PAYLOAD_LAYOUT_UNSPECIFIED;  // FRAME_MAJOR
  std::vector<uint32_t> layers;  // BLOCK/TOKEN_LAYER_MAJOR; empty: all.
  uint32_t max_chunk_bytes = 0;  // 0: the server's default (1 MiB).
  // TOKEN_LAYER_MAJOR only: the tokens to send of some blocks (the rest
  // send all theirs); see FetchBlocksRequest.tokens.
  std::vector<v1::BlockTokens> tokens;
};

// One block's bytes, where they are: in shared memory, in a caller's buffer
// or in a Delivery's own storage.
struct BlockView {
  uint64_t block_id = 0;
  v1::RecalledBlock info;  // FetchBlocks only (a recall has it in its set).
  const uint8_t* data = nullptr;
  size_t size = 0;
  // TOKEN_LAYER_MAJOR (a recall's delivery, FetchShared, FetchInto): the
  // tokens the bytes hold, offsets in the block. Empty in other layouts.
  std::vector<uint32_t> token_offsets;
};

class ClientArena;  // A mapped shared-memory arena (client/cpp/shm.cc).
class KvmemClient;

// Blocks delivered by FetchShared or a recall with delivery (REQUIRES: the
// KvmemClient that made it outlives it). Through shared
// memory the views point into the client's read-only mapping of its arena,
// held under a lease: they stay valid until Release (or destruction), and
// the server does not reuse the range before then, for at least the lease
// time the server grants (AttachSharedMemoryResponse.lease_ms). Inline
// bytes belong to the Delivery.
class Delivery {
 public:
  Delivery() = default;
  Delivery(Delivery&& other) noexcept { *this = std::move(other); }
  Delivery& operator=(Delivery&& other) noexcept;
  ~Delivery();

  const std::vector<BlockView>& blocks() const { return blocks_; }
  uint64_t bytes() const { return bytes_; }
  bool shared_memory() const { return arena_ != nullptr; }
  uint64_t lease_id() const { return lease_id_; }

  // Gives the lease back now (nothing to do for inline bytes). DATA_LOSS
  // when the server had reclaimed it (held past lease_ms): the bytes may
  // have been overwritten while they were read.
  grpc::Status Release();
  // Gives the lease back with this client's next shared-memory fetch or
  // recall (no round trip of its own; what a front end does each frame).
  // Whether the bytes stayed intact is not reported: use Release for that.
  // Destruction and move-assignment do this.
  void ReleaseLater();

 private:
  friend class KvmemClient;
  friend class SessionClient;
  KvmemClient* client_ = nullptr;
  std::shared_ptr<ClientArena> arena_;
  uint64_t lease_id_ = 0;
  uint64_t bytes_ = 0;
  std::vector<BlockView> blocks_;
  std::vector<std::string> owned_;  // Inline bytes.
};

class SessionClient;

// Metadata every per-stream call carries: the stream id (a proxy in front of
// several servers hashes it; deploy/nginx/kvmem.conf).
inline constexpr char kStreamIdHeader[] = "kvmem-stream-id";
// Metadata every response carries: the server's --instance_name.
inline constexpr char kInstanceHeader[] = "kvmem-instance";
// Trailing metadata of a call refused because another server owns the
// stream: that server's address (ClientOptions::max_redirects).
inline constexpr char kOwnerHeader[] = "kvmem-owner";
// Trailing metadata of a FetchBlocks refused for room: the blocks it sent
// whole before the refusal (FetchBlocks and FetchInto resume from there).
inline constexpr char kBlocksSentHeader[] = "kvmem-blocks-sent";

class KvmemClient {
 public:
  // Adds the options' credentials (API key) to a call's context, and the
  // stream id as metadata kStreamIdHeader (a sharding proxy routes on it;
  // deploy/nginx/) when not empty.
  static void Authorize(const ClientOptions& options, grpc::ClientContext* ctx,
                        const std::string& stream_id = "");

  // target: "unix:/path/to.sock", "unix:///abs/path" or "host:port".

  static std::unique_ptr<KvmemClient> Connect(
      const std::string& target, const ClientOptions& options = {});

  // Waits until the channel is connected or the deadline passes.
  bool WaitForReady(std::chrono::milliseconds timeout);

  grpc::Status OpenStream(const std::string& stream_id,
                          const v1::StreamConfig& config,
                          v1::OpenStreamResponse* resp);
  grpc::Status CloseStream(const std::string& stream_id,
                           v1::StreamStats* stats);
  grpc::Status DeleteStream(const std::string& stream_id);
  grpc::Status ListStreams(v1::ListStreamsResponse* resp);
  grpc::Status GetStreamStats(const std::string& stream_id,
                              v1::StreamStats* stats);

  // Uploads frames in order over one AppendFrames call. On failure gRPC
  // delivers no response message; the status message names the stream's last
  // durable frame, from which to resume.
  grpc::Status AppendFrames(const std::string& stream_id,
                            const std::vector<OutgoingFrame>& frames,
                            v1::AppendFramesResponse* resp);

  grpc::Status Recall(const v1::RecallRequest& req, v1::RecallResponse* resp);

  // Fetches the payloads of the given blocks, in request order. A server
  // that refuses the next block for room in the caller's share of
  // --max_queued_response_bytes ("FetchBlocks sent N of M blocks": other
  // fetches of the tenant hold it until they are read) is asked again for
  // the blocks not yet received, after 20, 40, ... 320 ms without progress
  // (about 0.6 s), then its refusal is returned. FetchInto alike.
  grpc::Status FetchBlocks(const std::string& stream_id,
                           const std::vector<uint64_t>& block_ids,
                           std::vector<FetchedBlock>* blocks,
                           uint32_t max_chunk_bytes = 0);

  // FetchBlocks into a buffer the caller reuses from call to call (grown
  // when too small, never shrunk): no allocation or page faults once it is
  // large enough. views[i] points into *buffer.
  grpc::Status FetchInto(const std::string& stream_id,
                         const std::vector<uint64_t>& block_ids,
                         const FetchOptions& options,
                         std::vector<uint8_t>* buffer,
                         std::vector<BlockView>* views);

  // Shared memory (a unix-socket target on the server's host): attaches an
  // arena of `bytes` (0: options().shm_arena_bytes, or the largest that
  // fits when the server has no room for that); while one is attached,
  // a call asking for no more than it holds does nothing, and one asking
  // for more attaches a larger arena in its place (deliveries in the old
  // one stay valid until released). FetchShared and shared-memory recalls
  // attach on first use, and again after a server restart.
  grpc::Status AttachSharedMemory(uint64_t bytes = 0);
  // The arena's id (0: none attached).
  uint64_t shm_arena_id() const;

  // The blocks' bytes placed in this client's arena by the server (one
  // copy there, none through the socket); views in *out.
  grpc::Status FetchShared(const std::string& stream_id,
                           const std::vector<uint64_t>& block_ids,
                           const FetchOptions& options, Delivery* out);

  // Recall with delivery of the recalled blocks' bytes in the same
  // exchange (req.delivery: MODE_INLINE or MODE_SHARED_MEMORY; its
  // shm_arena_id is filled in, attaching when needed; held_block_ids left
  // out). Without delivery set, *delivered ends up empty.
  grpc::Status RecallDelivered(v1::RecallRequest req, v1::RecallResponse* resp,
                               Delivery* delivered);

  // Gives leases back (Delivery::Release calls this).
  grpc::Status ReleaseLeases(uint64_t arena_id,
                             const std::vector<uint64_t>& lease_ids,
                             v1::ReleaseLeasesResponse* resp);

  // grpc.health.v1 Check for a service ("" is the server as a whole).
  grpc::Status CheckHealth(const std::string& service,
                           grpc::health::v1::HealthCheckResponse* resp);

  // Starts a Session bound to stream_id; opens (creating) the stream when
  // config is given.
  grpc::Status StartSession(const std::string& stream_id,
                            const v1::StreamConfig* config,
                            std::unique_ptr<SessionClient>* session,
                            v1::OpenStreamResponse* opened = nullptr);

  v1::KvMemory::Stub* stub() { return stub_.get(); }
  const ClientOptions& options() const { return options_; }
  // Where this client sends a stream's calls: the target it was connected
  // to, or the owner a server redirected it to.
  std::string RouteOf(const std::string& stream_id) const;
  ~KvmemClient();

 private:
  friend class SessionClient;
  friend class Delivery;
  // TOKEN_LAYER_MAJOR: each view's token_offsets, from o.tokens (all of
  // the block's tokens where o does not name it). Other layouts: nothing.
  static void NoteFetchedTokens(const FetchOptions& o,
                                std::vector<BlockView>* views);
  static v1::FetchBlocksRequest FetchRequest(
      const std::string& stream_id, const std::vector<uint64_t>& block_ids,
      const FetchOptions& options);
  KvmemClient(std::string target, std::shared_ptr<grpc::Channel> channel,
              const ClientOptions& options);
  static std::shared_ptr<grpc::Channel> MakeChannel(
      const std::string& target, const ClientOptions& options);
  // The stub for a stream's calls (its route's).
  v1::KvMemory::Stub* StubFor(const std::string& stream_id);
  // After a failed call: true when the server named another owner (the
  // stream's route now leads there) and the call should be made again.
  bool Follow(const std::string& stream_id, const grpc::ClientContext& ctx,
              const grpc::Status& status);
  // FetchBlocks of req's blocks through on_chunk (ReadFetchStream's), asked
  // again for the blocks not yet received while the server refuses the next
  // one for room (FetchBlocks above); truncate(n) drops what arrived past
  // the first n blocks (an attempt's partial block, or a redirected call's).
  grpc::Status FetchResuming(
      const std::string& stream_id, v1::FetchBlocksRequest req,
      const std::function<void(size_t)>& truncate,
      const std::function<void(v1::FetchBlocksResponse*, bool)>& on_chunk);
  // Runs call (a fresh, authorised context each time) on the stream's
  // route, following redirects (ClientOptions::max_redirects).
  grpc::Status Routed(const std::string& stream_id,
                      const std::function<grpc::Status(
                          v1::KvMemory::Stub*, grpc::ClientContext*)>& call);
  std::shared_ptr<ClientArena> Arena() const;
  // A Delivery of resp.delivered (shared memory in `arena`, or inline
  // bytes moved out of resp).
  grpc::Status TakeDelivery(const std::shared_ptr<ClientArena>& arena,
                            v1::RecallResponse* resp, Delivery* out);
  // A recall with delivery through `recall` (unary or a session's), the
  // arena's id filled in for shared memory.
  grpc::Status Delivering(
      v1::RecallRequest* req, v1::RecallResponse* resp, Delivery* delivered,
      const std::function<grpc::Status(const v1::RecallRequest&,
                                       v1::RecallResponse*)>& recall);
  // Runs call with the attached arena (attaching first); on a NOT_FOUND
  // naming the arena (the server restarted, or dropped it), attaches a new
  // one and runs call once more.
  grpc::Status WithArena(
      const std::function<grpc::Status(const std::shared_ptr<ClientArena>&)>&
          call);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvMemory::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  // Leases to release with the next delivery into arena `arena_id`.
  void DeferRelease(uint64_t arena_id, uint64_t lease_id);
  std::vector<uint64_t> TakeDeferred(uint64_t arena_id);
  // Leases taken for a call that failed, deferred again: the server
  // releases them before it runs a delivery, but a failed call may not have
  // reached it (and a lease released already is ignored there).
  void DeferAgain(uint64_t arena_id, const std::vector<uint64_t>& lease_ids);

  ClientOptions options_;
  const std::string target_;
  mutable std::mutex route_mu_;
  std::map<std::string, std::string> routes_;  // Stream -> owner's target.
  // Stubs of the owners' targets (never removed: pointers stay valid).
  std::map<std::string, std::unique_ptr<v1::KvMemory::Stub>> owner_stubs_;
  mutable std::mutex arena_mu_;
  std::shared_ptr<ClientArena> arena_;  // Guarded by arena_mu_.
  // (arena id, lease id) released by ReleaseLater; guarded by arena_mu_.
  std::vector<std::pair<uint64_t, uint64_t>> deferred_;
};

// A live-camera Session: each call writes its request and waits for the
// matching response, so responses never need reordering.
class SessionClient {
 public:
  ~SessionClient();

  // Appends one frame; ack receives the server's acknowledgement.
  grpc::Status Append(const OutgoingFrame& frame, v1::AppendAck* ack);

  // Runs a recall on the session's stream (stream_id in req may be empty).
  // A rejected query returns its status; the session stays usable.
  grpc::Status Recall(const v1::RecallRequest& req, v1::RecallResponse* resp);
  // Recall with delivery, as KvmemClient::RecallDelivered (a shared-memory
  // arena is the client's that started the session, which must outlive
  // it).
  grpc::Status RecallDelivered(v1::RecallRequest req, v1::RecallResponse* resp,
                               Delivery* delivered);

  // Half-closes and returns the call's final status.
  grpc::Status Finish();

 private:
  friend class KvmemClient;
  SessionClient(KvmemClient* client, const std::string& stream_id,
                v1::KvMemory::Stub* stub);
  grpc::Status Exchange(v1::SessionRequest* req, v1::SessionResponse* resp,
                        bool wait_for_response);
  grpc::Status Broken();

  KvmemClient* const client_;
  grpc::ClientContext ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>>
      stream_;
  uint32_t chunk_bytes_;
  uint64_t seq_ = 0;
  bool finished_ = false;
};

// Splits a frame into the request messages AppendFrames and Session send:
// the header carrying the first chunk_bytes of payload, then chunks.
// fn is called for each message: fn(header, nullptr) or fn(nullptr, chunk).
template <typename Fn>
bool ForEachFrameMessage(const OutgoingFrame& frame, uint32_t chunk_bytes,
                         Fn fn) {
  const std::string& p = frame.payload;
  const size_t first = std::min<size_t>(p.size(), chunk_bytes);
  v1::FrameHeader header = frame.header;
  header.set_payload_bytes(p.size());
  header.set_payload(p.data(), first);
  if (!fn(&header, nullptr)) return false;
  for (size_t off = first; off < p.size(); off += chunk_bytes) {
    v1::PayloadChunk chunk;
    chunk.set_frame_index(frame.header.frame_index());
    chunk.set_offset(off);
    chunk.set_data(p.data() + off,
                   std::min<size_t>(chunk_bytes, p.size() - off));
    if (!fn(nullptr, &chunk)) return false;
  }
  return true;
}

}  // namespace kvmem

#endif  // KVMEM_CLIENT_CPP_KVMEM_CLIENT_H_
