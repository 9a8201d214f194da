#include "server/service/shm_arenas.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/service/lease_table.h"

namespace kvmem {

namespace {

constexpr uint64_t kPage = 4096;
constexpr size_t kTokenBytes = 32;  // Hex digits.

uint64_t RoundUp(uint64_t n) { return (n + kPage - 1) / kPage * kPage; }

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Appends what fd has (up to max bytes, without waiting) to *out; false
// at EOF or on an error (the peer is gone).
bool ReadSome(int fd, size_t max, std::string* out) {
  char buf[64];
  const ssize_t n = ::recv(fd, buf, std::min(max, sizeof buf), MSG_DONTWAIT);
  if (n > 0) out->append(buf, static_cast<size_t>(n));
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
}

uint64_t RandomU64() {
  uint64_t v = 0;
  while (v == 0) {
    if (::getrandom(&v, sizeof v, 0) != sizeof v) v = 0;
  }
  return v;
}

}  // namespace

absl::Status CheckLeaseIds(int ids, absl::string_view field) {
  if (ids <= kMaxLeaseIdsPerCall) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", ids, " lease ids; at most ",
                   kMaxLeaseIdsPerCall, " a call: release them in batches"));
}

// An arena: the memfd, the server's mapping of it, its leases and its
// hand-off state.
class ShmArenas::Arena {
 public:
  Arena(std::string tenant, uint64_t id, int memfd, uint8_t* base,
        uint64_t bytes, std::string token,
        std::chrono::steady_clock::time_point attach_by)
      : tenant_(std::move(tenant)),
        id_(id),
        memfd_(memfd),
        base_(base),
        bytes_(bytes),
        leases_(id, bytes),
        token_(std::move(token)),
        attach_by_(attach_by) {}
  ~Arena() {
    ::munmap(base_, bytes_);
    ::close(memfd_);
  }

  const std::string tenant_;
  const uint64_t id_;
  const int memfd_;
  uint8_t* const base_;
  const uint64_t bytes_;
  LeaseTable leases_;
  // Hand-off state: guarded by ShmArenas::mu_.
  std::string token_;
  std::chrono::steady_clock::time_point attach_by_;
  int conn_ = -1;  // The client's hand-off connection once attached.
};

absl::StatusOr<std::unique_ptr<ShmArenas>> ShmArenas::Start(
    ShmOptions options) {
  std::unique_ptr<ShmArenas> s(new ShmArenas(std::move(options)));
  const std::string& path = s->options_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shared-memory socket path \"", path, "\" is empty or longer than ",
        sizeof addr.sun_path - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  s->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return Errno("socket");
  ::unlink(path.c_str());
  // Owner-only from the start: the umask covers the window before chmod.
  const mode_t old_mask = ::umask(0077);
  const int bound =
      ::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old_mask);
  if (bound != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind the shared-memory socket ", path, ": ",
                     std::strerror(errno)));
  }
  if (::listen(s->listen_fd_, 64) != 0) return Errno("listen");
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) return Errno("pipe2");
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

ShmArenas::~ShmArenas() {
  if (thread_.joinable()) {
    const char c = 'q';
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  if (listen_fd_ >= 0) ::unlink(options_.socket_path.c_str());
  kvmem::MutexLock lock(&mu_);
  for (auto& [id, a] : arenas_) {
    if (a->conn_ >= 0) ::close(a->conn_);
  }
  arenas_.clear();
}

absl::StatusOr<ShmArenas::Created> ShmArenas::Create(const std::string& tenant,
                                                     uint64_t bytes) {
  if (bytes > options_.max_arena_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes is ", bytes, "; this server's arenas hold at most ",
        options_.max_arena_bytes, " (kvmem-server --shm_max_arena_bytes)"));
  }
  // 0: the largest arena that fits now (Count).
  KVMEM_ASSIGN_OR_RETURN(bytes, Count(tenant, RoundUp(bytes)));
  auto unreserve = [&] {
    kvmem::MutexLock lock(&mu_);
    Uncount(tenant, bytes);
  };
  const int fd = ::memfd_create("kvmem-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    unreserve();
    return Errno("memfd_create");
  }
  // The server's writable mapping first; then seals: no growing or
  // shrinking (a client's mapping can never lose its pages), and no new
  // writable mapping or write() by anyone (a client that reopens its
  // descriptor read-write through /proc still cannot write).
  void* base = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (base != MAP_FAILED &&
      ::fcntl(fd, F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
                  F_SEAL_SEAL) != 0) {
    ::munmap(base, bytes);
    base = MAP_FAILED;
  }
  if (base == MAP_FAILED) {
    const absl::Status s = Errno("an arena's memfd (ftruncate, seal, mmap)");
    ::close(fd);
    unreserve();
    return s;
  }
  Created c;
  c.bytes = bytes;
  const uint64_t t[2] = {RandomU64(), RandomU64()};
  c.token = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(t), sizeof t));
  kvmem::MutexLock lock(&mu_);
  do {
    c.arena_id = RandomU64();
  } while (arenas_.contains(c.arena_id));
  arenas_[c.arena_id] = std::make_shared<Arena>(
      tenant, c.arena_id, fd, static_cast<uint8_t*>(base), bytes, c.token,
      std::chrono::steady_clock::now() + options_.attach_timeout);
  return c;
}

std::shared_ptr<ShmArenas::Arena> ShmArenas::Find(const std::string& tenant,
                                                  uint64_t arena_id) const {
  kvmem::MutexLock lock(&mu_);
  auto it = arenas_.find(arena_id);
  if (it == arenas_.end() || it->second->tenant_ != tenant) return nullptr;
  return it->second;
}

absl::StatusOr<ShmArenas::Lease> ShmArenas::Reserve(const std::string& tenant,
                                                    uint64_t arena_id,
                                                    uint64_t bytes) {
  std::shared_ptr<Arena> a = Find(tenant, arena_id);
  if (a == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "shared-memory arena ", arena_id,
        " is not known to this server (its client left, or the server "
        "restarted): attach again (AttachSharedMemory)"));
  }
  {
    kvmem::MutexLock lock(&mu_);
    if (a->conn_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("shared-memory arena ", arena_id,
                       " has not been picked up on its hand-off socket yet"));
    }
  }
  Lease l;
  l.arena = a;
  if (bytes == 0) return l;
  if (bytes > a->bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response needs ", bytes, " bytes; shared-memory arena ", arena_id,
        " holds ", a->bytes_, ": attach a larger arena or fetch fewer blocks"));
  }
  uint64_t reclaimed = 0;
  auto got = a->leases_.Allocate(RoundUp(bytes), &reclaimed);
  if (reclaimed > 0) {
    kvmem::MutexLock lock(&mu_);
    reclaimed_ += reclaimed;
  }
  if (!got.ok()) return got.status();
  l.lease_id = got->first;
  l.offset = got->second;
  l.bytes = bytes;
  l.data = a->base_ + l.offset;
  return l;
}

void ShmArenas::Written(const Lease& lease) {
  if (lease.arena != nullptr && lease.lease_id != 0) {
    lease.arena->leases_.Start(lease.lease_id, options_.lease);
  }
}

void ShmArenas::Abandon(const Lease& lease) {
  if (lease.arena != nullptr && lease.lease_id != 0) {
    lease.arena->leases_.Abandon(lease.lease_id);
  }
}

absl::StatusOr<ShmArenas::Released> ShmArenas::Release(
    const std::string& tenant, uint64_t arena_id,
    const std::vector<uint64_t>& lease_ids) {
  std::shared_ptr<Arena> a = Find(tenant, arena_id);
  if (a == nullptr) {
    return absl::NotFoundError(absl::StrCat("shared-memory arena ", arena_id,
                                            " is not known to this server"));
  }
  Released r;
  absl::Status s = a->leases_.Release(lease_ids, &r.released, &r.expired);
  if (!s.ok()) return s;
  return r;
}

void ShmArenas::ReleaseLive(const std::string& tenant, uint64_t arena_id,
                            absl::Span<const uint64_t> lease_ids) {
  std::shared_ptr<Arena> a = Find(tenant, arena_id);
  if (a == nullptr) return;
  for (uint64_t id : lease_ids) a->leases_.Abandon(id);
}

ShmStats ShmArenas::Stats() const {
  ShmStats s;
  std::vector<std::shared_ptr<Arena>> arenas;
  {
    kvmem::MutexLock lock(&mu_);
    s.arenas = arenas_.size();
    s.arena_bytes = total_bytes_;
    s.reclaimed_leases = reclaimed_;
    s.dead_clients = dead_clients_;
    for (const auto& [id, a] : arenas_) arenas.push_back(a);
  }
  for (const auto& a : arenas) {
    const LeaseTable::Totals t = a->leases_.Live();
    s.leases += t.leases;
    s.leased_bytes += t.bytes;
  }
  return s;
}

void ShmArenas::Drop(uint64_t arena_id, bool dead_client) {
  std::shared_ptr<Arena> a;
  {
    kvmem::MutexLock lock(&mu_);
    auto it = arenas_.find(arena_id);
    if (it == arenas_.end()) return;
    a = std::move(it->second);
    arenas_.erase(it);
    Uncount(a->tenant_, a->bytes_);
    if (dead_client) ++dead_clients_;
    if (a->conn_ >= 0) ::close(a->conn_);
    a->conn_ = -1;
  }
  // The mapping goes when the last lease being written lets go of it.
}

absl::StatusOr<uint64_t> ShmArenas::Count(const std::string& tenant,
                                          uint64_t bytes) {
  kvmem::MutexLock lock(&mu_);
  const auto found = tenant_use_.find(tenant);
  const TenantArenas use =
      found != tenant_use_.end() ? found->second : TenantArenas{};
  if (use.arenas >= options_.max_arenas_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the caller holds ", use.arenas,
        " shared-memory arenas (attached or waiting for their hand-off); "
        "at most ",
        options_.max_arenas_per_tenant,
        " per tenant (kvmem-server --shm_max_arenas_per_tenant): close one "
        "(its hand-off connection) or share one arena among the calls"));
  }
  const uint64_t tenant_limit = options_.max_tenant_bytes > 0
                                    ? options_.max_tenant_bytes
                                    : options_.max_total_bytes;
  if (bytes == 0) {
    // The largest whole pages every limit leaves room for; one page when
    // none is left, so the checks below refuse it naming the limit.
    const uint64_t room =
        std::min({options_.max_arena_bytes,
                  tenant_limit - std::min(tenant_limit, use.bytes),
                  options_.max_total_bytes -
                      std::min(options_.max_total_bytes, total_bytes_)});
    bytes = std::max<uint64_t>(kPage, room / kPage * kPage);
  }
  if (use.bytes + bytes > tenant_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "an arena of ", bytes, " bytes would take the caller's arenas to ",
        use.bytes + bytes, " bytes; ", tenant_limit,
        options_.max_tenant_bytes > 0
            ? " are its share of --shm_max_total_bytes, split among tenants"
            : " are allowed (kvmem-server --shm_max_total_bytes)"));
  }
  if (total_bytes_ + bytes > options_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "an arena of ", bytes, " bytes would take this server's arenas to ",
        total_bytes_ + bytes, " bytes; it allows ", options_.max_total_bytes,
        " (kvmem-server --shm_max_total_bytes)"));
  }
  total_bytes_ += bytes;
  TenantArenas& counted = tenant_use_[tenant];
  ++counted.arenas;
  counted.bytes += bytes;
  return bytes;
}

void ShmArenas::Uncount(const std::string& tenant, uint64_t bytes) {
  total_bytes_ -= bytes;
  auto it = tenant_use_.find(tenant);
  if (it == tenant_use_.end()) return;
  --it->second.arenas;
  it->second.bytes -= bytes;
  if (it->second.arenas == 0) tenant_use_.erase(it);
}

// A pending connection sends the 32 hex digits of a token; the arena they
// name gets the connection, and the client a read-only descriptor.
void ShmArenas::HandOff(int conn, absl::string_view t) {
  std::shared_ptr<Arena> a;
  if (t.size() == kTokenBytes) {
    kvmem::MutexLock lock(&mu_);
    for (auto& [id, arena] : arenas_) {
      if (!arena->token_.empty() && arena->token_ == t) {
        a = arena;
        arena->token_.clear();  // One use.
        break;
      }
    }
  }
  if (a == nullptr) {
    ::close(conn);
    return;
  }
  // The arena counts as attached before the client can hear so: its next
  // call may come before this thread runs again.
  {
    kvmem::MutexLock lock(&mu_);
    if (!arenas_.contains(a->id_)) {
      ::close(conn);
      return;
    }
    a->conn_ = conn;
  }
  const int ro = ::open(absl::StrCat("/proc/self/fd/", a->memfd_).c_str(),
                        O_RDONLY | O_CLOEXEC);
  uint64_t payload[2] = {a->id_, a->bytes_};
  iovec iov{payload, sizeof payload};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &ro, sizeof ro);
  const bool sent =
      ro >= 0 && ::sendmsg(conn, &msg, MSG_NOSIGNAL) == sizeof payload;
  if (ro >= 0) ::close(ro);
  if (!sent) Drop(a->id_, false);  // Closes conn.
}

// The hand-off thread: accepts connections and reads their tokens (all
// without blocking: a connection that says nothing is closed after
// kHandOffWait, and stalls nobody meanwhile), hands off, and watches
// attached clients' connections (EOF: the client is gone, its arena with
// it).
void ShmArenas::Serve() {
  constexpr auto kHandOffWait = std::chrono::seconds(2);
  struct Pending {
    std::string token;
    std::chrono::steady_clock::time_point until;
  };
  // At most this many connections waiting to send their token; the
  // listener is not polled meanwhile (nor for a moment after a failed
  // accept, e.g. out of descriptors), so neither floods nor spins.
  constexpr size_t kMaxPending = 64;
  std::map<int, Pending> pending;
  auto accept_after = std::chrono::steady_clock::now();
  enum Kind { kWake, kListen, kAttached, kPending };
  for (;;) {
    const bool listening = pending.size() < kMaxPending &&
                           std::chrono::steady_clock::now() >= accept_after;
    std::vector<pollfd> fds = {
        {wake_[0], POLLIN, 0},
        {listen_fd_, static_cast<short>(listening ? POLLIN : 0), 0}};
    std::vector<std::pair<Kind, uint64_t>> what = {{kWake, 0}, {kListen, 0}};
    const auto now = std::chrono::steady_clock::now();
    std::vector<uint64_t> stale;
    {
      kvmem::MutexLock lock(&mu_);
      for (const auto& [id, a] : arenas_) {
        if (a->conn_ >= 0) {
          fds.push_back({a->conn_, POLLIN, 0});
          what.emplace_back(kAttached, id);
        } else if (!a->token_.empty() && now > a->attach_by_) {
          stale.push_back(id);
        }
      }
    }
    for (uint64_t id : stale) Drop(id, false);
    for (auto it = pending.begin(); it != pending.end();) {
      if (now > it->second.until) {
        ::close(it->first);
        it = pending.erase(it);
        continue;
      }
      fds.push_back({it->first, POLLIN, 0});
      what.emplace_back(kPending, 0);
      ++it;
    }
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;
    if (fds[1].revents & POLLIN) {
      const int conn =
          ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn >= 0) {
        pending[conn] = {std::string(), now + kHandOffWait};
      } else if (errno != EAGAIN && errno != EINTR) {
        accept_after = now + std::chrono::milliseconds(100);
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      if (what[i].first == kAttached) {
        std::string ignored;  // A client has nothing to say after its token.
        if (!ReadSome(fd, 64, &ignored)) Drop(what[i].second, true);
        continue;
      }
      Pending& p = pending[fd];
      if (!ReadSome(fd, kTokenBytes - p.token.size(), &p.token)) {
        ::close(fd);
        pending.erase(fd);
      } else if (p.token.size() == kTokenBytes) {
        const std::string token = std::move(p.token);
        pending.erase(fd);
        HandOff(fd, token);
      }
    }
  }
  for (const auto& [fd, p] : pending) ::close(fd);
}

}  // namespace kvmem
