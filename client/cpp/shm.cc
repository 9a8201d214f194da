// KvmemClient's token path beyond FetchBlocks: fetches into a reused
// buffer, the shared-memory arena (attach, hand-off, mapping, leases) and
// recall with delivery. The protocol is in proto/kvmem/v1/service.proto
// (AttachSharedMemory); the server's side in server/service/shm_arenas.h.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "client/cpp/kvmem_client.h"

namespace kvmem {

namespace {

grpc::Status Fail(grpc::StatusCode code, const std::string& what) {
  return grpc::Status(code, what);
}

grpc::Status Errno(const std::string& what) {
  return Fail(grpc::StatusCode::UNAVAILABLE,
              what + ": " + std::strerror(errno));
}

}  // namespace

// The client's read-only mapping of its arena, and the hand-off connection
// whose life is the arena's.
class ClientArena {
 public:
  static grpc::Status Attach(const v1::AttachSharedMemoryResponse& r,
                             std::shared_ptr<ClientArena>* out);
  ~ClientArena() {
    if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), bytes_);
    if (sock_ >= 0) ::close(sock_);
  }
  uint64_t id() const { return id_; }
  const uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t id_ = 0;
  const uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  int sock_ = -1;
};

grpc::Status ClientArena::Attach(const v1::AttachSharedMemoryResponse& r,
                                 std::shared_ptr<ClientArena>* out) {
  auto a = std::make_shared<ClientArena>();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (r.socket_path().size() >= sizeof addr.sun_path) {
    return Fail(grpc::StatusCode::INTERNAL,
                "hand-off socket path too long: " + r.socket_path());
  }
  std::memcpy(addr.sun_path, r.socket_path().data(), r.socket_path().size());
  a->sock_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (a->sock_ < 0) return Errno("socket");
  if (::connect(a->sock_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) !=
      0) {
    return Errno("connect to the hand-off socket " + r.socket_path());
  }
  if (::send(a->sock_, r.token().data(), r.token().size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(r.token().size())) {
    return Errno("send the arena token");
  }
  uint64_t payload[2] = {0, 0};
  iovec iov{payload, sizeof payload};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(a->sock_, &msg, MSG_CMSG_CLOEXEC);
  const cmsghdr* c = CMSG_FIRSTHDR(&msg);
  int fd = -1;
  if (c != nullptr && c->cmsg_level == SOL_SOCKET &&
      c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  }
  if (n != sizeof payload || fd < 0 || payload[0] != r.arena_id() ||
      payload[1] != r.bytes()) {
    if (fd >= 0) ::close(fd);
    return Fail(grpc::StatusCode::UNAVAILABLE,
                "the server refused the arena token (expired, or used)");
  }
  void* base = ::mmap(nullptr, payload[1], PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // The mapping keeps the memory.
  if (base == MAP_FAILED) return Errno("mmap of the arena");
  a->id_ = payload[0];
  a->bytes_ = payload[1];
  a->base_ = static_cast<const uint8_t*>(base);
  *out = std::move(a);
  return grpc::Status::OK;
}

Delivery& Delivery::operator=(Delivery&& other) noexcept {
  if (this != &other) {
    ReleaseLater();
    client_ = other.client_;
    arena_ = std::move(other.arena_);
    lease_id_ = std::exchange(other.lease_id_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    blocks_ = std::move(other.blocks_);
    owned_ = std::move(other.owned_);
    other.blocks_.clear();
  }
  return *this;
}

Delivery::~Delivery() { ReleaseLater(); }

void Delivery::ReleaseLater() {
  if (arena_ != nullptr && lease_id_ != 0 && client_ != nullptr) {
    client_->DeferRelease(arena_->id(), lease_id_);
  }
  lease_id_ = 0;
  arena_ = nullptr;
  blocks_.clear();
  owned_.clear();
  bytes_ = 0;
}

void KvmemClient::DeferRelease(uint64_t arena_id, uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(arena_mu_);
  deferred_.emplace_back(arena_id, lease_id);
}

void KvmemClient::DeferAgain(uint64_t arena_id,
                             const std::vector<uint64_t>& lease_ids) {
  std::lock_guard<std::mutex> lock(arena_mu_);
  for (uint64_t id : lease_ids) deferred_.emplace_back(arena_id, id);
}

std::vector<uint64_t> KvmemClient::TakeDeferred(uint64_t arena_id) {
  std::lock_guard<std::mutex> lock(arena_mu_);
  std::vector<uint64_t> ids;
  // Those of other (older) arenas go with them: an arena is freed, leases
  // and all, when its last delivery lets go of it. At most the server's
  // limit a call (release_lease_ids: 65,536); the rest wait for the next.
  constexpr size_t kMaxPerCall = 65536;
  std::vector<std::pair<uint64_t, uint64_t>> later;
  for (const auto& [arena, lease] : deferred_) {
    if (arena != arena_id) continue;
    if (ids.size() < kMaxPerCall) {
      ids.push_back(lease);
    } else {
      later.emplace_back(arena, lease);
    }
  }
  deferred_ = std::move(later);
  return ids;
}

grpc::Status Delivery::Release() {
  const uint64_t lease = std::exchange(lease_id_, 0);
  std::shared_ptr<ClientArena> arena = std::move(arena_);
  arena_ = nullptr;
  blocks_.clear();
  owned_.clear();
  bytes_ = 0;
  if (arena == nullptr || lease == 0) return grpc::Status::OK;
  v1::ReleaseLeasesResponse resp;
  grpc::Status s = client_->ReleaseLeases(arena->id(), {lease}, &resp);
  // The arena is gone (the server restarted): nobody wrote our mapping.
  if (s.error_code() == grpc::StatusCode::NOT_FOUND) return grpc::Status::OK;
  if (!s.ok()) return s;
  if (resp.expired_size() > 0) {
    return Fail(grpc::StatusCode::DATA_LOSS,
                "lease " + std::to_string(lease) +
                    " was reclaimed by the server (held past lease_ms): its "
                    "bytes may have been overwritten while read");
  }
  return grpc::Status::OK;
}

KvmemClient::~KvmemClient() = default;

std::shared_ptr<ClientArena> KvmemClient::Arena() const {
  std::lock_guard<std::mutex> lock(arena_mu_);
  return arena_;
}

uint64_t KvmemClient::shm_arena_id() const {
  std::shared_ptr<ClientArena> a = Arena();
  return a == nullptr ? 0 : a->id();
}

namespace {

// An AttachSharedMemory refused for the arena's size (past the server's
// largest arena, or past the caller's room under the total), not for the
// call count, the arena count or the transport.
bool RefusedForSize(const grpc::Status& s) {
  const std::string& m = s.error_message();
  return (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
          s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) &&
         (m.find("--shm_max_arena_bytes") != std::string::npos ||
          m.find("--shm_max_total_bytes") != std::string::npos);
}

}  // namespace

grpc::Status KvmemClient::AttachSharedMemory(uint64_t bytes) {
  const std::shared_ptr<ClientArena> attached = Arena();
  if (attached != nullptr && attached->bytes() >= bytes) {
    return grpc::Status::OK;
  }
  grpc::ClientContext ctx;
  Authorize(options_, &ctx);
  v1::AttachSharedMemoryRequest req;
  req.set_bytes(bytes != 0 ? bytes : options_.shm_arena_bytes);
  v1::AttachSharedMemoryResponse resp;
  grpc::Status s = stub_->AttachSharedMemory(&ctx, req, &resp);
  if (bytes == 0 && req.bytes() != 0 && RefusedForSize(s)) {
    // The default size is past what this caller may have (the server's
    // largest arena, or its share of the server's arenas with many
    // tenants): the largest that fits, or the first refusal.
    grpc::ClientContext again;
    Authorize(options_, &again);
    req.set_bytes(0);
    if (stub_->AttachSharedMemory(&again, req, &resp).ok()) s = grpc::Status();
  }
  if (!s.ok()) return s;
  std::shared_ptr<ClientArena> a;
  s = ClientArena::Attach(resp, &a);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(arena_mu_);
  // A larger one replaces the arena; deliveries in the old one keep it (and
  // its hand-off connection) until they are released.
  if (arena_ == attached) arena_ = std::move(a);
  return grpc::Status::OK;
}

grpc::Status KvmemClient::WithArena(
    const std::function<grpc::Status(const std::shared_ptr<ClientArena>&)>&
        call) {
  for (int attempt = 0;; ++attempt) {
    grpc::Status s = AttachSharedMemory();
    if (!s.ok()) return s;
    // The call and the views it makes use this arena, whatever another
    // thread attaches meanwhile.
    const std::shared_ptr<ClientArena> arena = Arena();
    if (arena == nullptr) {  // Another thread dropped it meanwhile.
      if (attempt > 0) {
        return Fail(grpc::StatusCode::UNAVAILABLE,
                    "the shared-memory arena was dropped while attaching");
      }
      continue;
    }
    s = call(arena);
    if (attempt > 0 || s.error_code() != grpc::StatusCode::NOT_FOUND ||
        s.error_message().find("shared-memory arena") == std::string::npos) {
      return s;
    }
    std::lock_guard<std::mutex> lock(arena_mu_);
    if (arena_ == arena) arena_ = nullptr;
  }
}

grpc::Status KvmemClient::ReleaseLeases(uint64_t arena_id,
                                        const std::vector<uint64_t>& lease_ids,
                                        v1::ReleaseLeasesResponse* resp) {
  grpc::ClientContext ctx;
  Authorize(options_, &ctx);
  v1::ReleaseLeasesRequest req;
  req.set_arena_id(arena_id);
  for (uint64_t id : lease_ids) req.add_lease_ids(id);
  return stub_->ReleaseLeases(&ctx, req, resp);
}

namespace {

// A region of the arena as a view; DATA_LOSS when it lies outside.
grpc::Status View(const ClientArena& a, uint64_t block_id,
                  const v1::ShmRegion& r, BlockView* v) {
  if (r.offset() > a.bytes() || r.length() > a.bytes() - r.offset()) {
    return Fail(grpc::StatusCode::DATA_LOSS, "the server placed block " +
                                                 std::to_string(block_id) +
                                                 " outside the arena");
  }
  v->block_id = block_id;
  v->data = a.base() + r.offset();
  v->size = r.length();
  return grpc::Status::OK;
}

}  // namespace

grpc::Status KvmemClient::FetchShared(const std::string& stream_id,
                                      const std::vector<uint64_t>& block_ids,
                                      const FetchOptions& options,
                                      Delivery* out) {
  Delivery d;
  d.client_ = this;
  grpc::Status s = WithArena([&](const std::shared_ptr<ClientArena>& arena) {
    grpc::ClientContext ctx;
    Authorize(options_, &ctx, stream_id);
    v1::FetchBlocksRequest req = FetchRequest(stream_id, block_ids, options);
    req.set_shm_arena_id(arena->id());
    const std::vector<uint64_t> released = TakeDeferred(arena->id());
    for (uint64_t id : released) req.add_release_lease_ids(id);
    auto reader = stub_->FetchBlocks(&ctx, req);
    d.arena_ = arena;
    v1::FetchBlocksResponse r;
    d.blocks_.clear();
    d.bytes_ = 0;
    grpc::Status viewed;
    while (reader->Read(&r)) {
      d.lease_id_ = r.shm().lease_id();
      BlockView& v = d.blocks_.emplace_back();
      v.info = r.block();
      if (viewed.ok()) viewed = View(*d.arena_, r.block_id(), r.shm(), &v);
      d.bytes_ += v.size;
    }
    grpc::Status done = reader->Finish();
    if (!done.ok()) DeferAgain(arena->id(), released);
    NoteFetchedTokens(options, &d.blocks_);
    return done.ok() ? viewed : done;
  });
  if (!s.ok()) {
    if (d.lease_id_ == 0) d.arena_ = nullptr;
    return s;
  }
  *out = std::move(d);
  return grpc::Status::OK;
}

grpc::Status KvmemClient::TakeDelivery(
    const std::shared_ptr<ClientArena>& arena, v1::RecallResponse* resp,
    Delivery* out) {
  Delivery d;
  d.client_ = this;
  d.bytes_ = resp->delivered_bytes();
  d.owned_.reserve(resp->delivered_size());  // Views into it stay put.
  for (v1::DeliveredBlock& b : *resp->mutable_delivered()) {
    BlockView& v = d.blocks_.emplace_back();
    if (b.has_shm()) {
      if (arena == nullptr) {
        return Fail(grpc::StatusCode::INTERNAL,
                    "shared-memory delivery without an arena");
      }
      d.arena_ = arena;
      d.lease_id_ = b.shm().lease_id();
      grpc::Status s = View(*arena, b.block_id(), b.shm(), &v);
      if (!s.ok()) return s;
    } else {
      d.owned_.push_back(std::move(*b.mutable_data()));
      v.block_id = b.block_id();
      v.data = reinterpret_cast<const uint8_t*>(d.owned_.back().data());
      v.size = d.owned_.back().size();
    }
    v.token_offsets.assign(b.token_offsets().begin(), b.token_offsets().end());
  }
  resp->clear_delivered();
  *out = std::move(d);
  return grpc::Status::OK;
}

grpc::Status KvmemClient::Delivering(
    v1::RecallRequest* req, v1::RecallResponse* resp, Delivery* delivered,
    const std::function<grpc::Status(const v1::RecallRequest&,
                                     v1::RecallResponse*)>& recall) {
  if (req->delivery().mode() != v1::RecallDelivery::MODE_SHARED_MEMORY) {
    grpc::Status s = recall(*req, resp);
    return s.ok() ? TakeDelivery(nullptr, resp, delivered) : s;
  }
  return WithArena([&](const std::shared_ptr<ClientArena>& arena) {
    v1::RecallDelivery* d = req->mutable_delivery();
    d->set_shm_arena_id(arena->id());
    d->clear_release_lease_ids();
    const std::vector<uint64_t> released = TakeDeferred(arena->id());
    for (uint64_t id : released) d->add_release_lease_ids(id);
    grpc::Status s = recall(*req, resp);
    if (!s.ok()) DeferAgain(arena->id(), released);
    return s.ok() ? TakeDelivery(arena, resp, delivered) : s;
  });
}

grpc::Status KvmemClient::RecallDelivered(v1::RecallRequest req,
                                          v1::RecallResponse* resp,
                                          Delivery* delivered) {
  return Delivering(
      &req, resp, delivered,
      [this](const v1::RecallRequest& r, v1::RecallResponse* o) {
        if (r.delivery().mode() != v1::RecallDelivery::MODE_SHARED_MEMORY) {
          return Recall(r, o);
        }
        // Shared memory is this host's server's: never redirected.
        grpc::ClientContext ctx;
        Authorize(options_, &ctx, r.stream_id());
        return stub_->Recall(&ctx, r, o);
      });
}

grpc::Status SessionClient::RecallDelivered(v1::RecallRequest req,
                                            v1::RecallResponse* resp,
                                            Delivery* delivered) {
  return client_->Delivering(
      &req, resp, delivered,
      [this](const v1::RecallRequest& r, v1::RecallResponse* o) {
        return Recall(r, o);
      });
}

}  // namespace kvmem
