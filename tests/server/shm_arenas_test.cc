// ShmArenas (server/service/shm_arenas.h) in process: the hand-off (one-time
// token, a read-only descriptor), leases (first fit, reuse, expiry, release
// reports), limits, an arena freed when its client's connection closes, and
// reservations from many threads at once.
#include "server/service/shm_arenas.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

// The client's side of the hand-off: the connection (kept open) and the
// descriptor received, or -1 for both when the server hung up.
struct HandOff {
  int conn = -1;
  int fd = -1;
  uint64_t id = 0, bytes = 0;
  ~HandOff() {
    if (fd >= 0) ::close(fd);
    if (conn >= 0) ::close(conn);
  }
};

void Pickup(const std::string& path, const std::string& token, HandOff* h) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  h->conn = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(h->conn, reinterpret_cast<sockaddr*>(&addr), sizeof addr),
            0);
  ASSERT_EQ(::send(h->conn, token.data(), token.size(), 0),
            static_cast<ssize_t>(token.size()));
  uint64_t payload[2] = {0, 0};
  iovec iov{payload, sizeof payload};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(h->conn, &msg, 0) != sizeof payload) return;
  const cmsghdr* c = CMSG_FIRSTHDR(&msg);
  ASSERT_NE(c, nullptr);
  std::memcpy(&h->fd, CMSG_DATA(c), sizeof h->fd);
  h->id = payload[0];
  h->bytes = payload[1];
}

class ShmArenasTest : public ::testing::Test {
 protected:
  void Start(ShmOptions o = {}) {
    o.socket_path = dir_.path() + "/h.sock";
    auto s = ShmArenas::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    arenas_ = *std::move(s);
  }
  testing::TempDir dir_;
  std::unique_ptr<ShmArenas> arenas_;
};

TEST_F(ShmArenasTest, HandOffGivesOneReadOnlyDescriptorPerToken) {
  Start();
  auto c = arenas_->Create("t", 10000);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes, 12288u);  // Whole pages.
  EXPECT_EQ(c->token.size(), 32u);
  // Before the hand-off there is nothing to deliver into.
  EXPECT_EQ(arenas_->Reserve("t", c->arena_id, 100).status().code(),
            absl::StatusCode::kFailedPrecondition);
  HandOff h;
  Pickup(arenas_->options().socket_path, c->token, &h);
  ASSERT_GE(h.fd, 0);
  EXPECT_EQ(h.id, c->arena_id);
  EXPECT_EQ(h.bytes, c->bytes);
  // Read-only: a writable shared mapping is refused.
  EXPECT_EQ(
      ::mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd, 0),
      MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  // Reopened read-write through /proc, the sealed memfd still refuses a
  // writable mapping and write().
  const int rw =
      ::open(("/proc/self/fd/" + std::to_string(h.fd)).c_str(), O_RDWR);
  ASSERT_GE(rw, 0) << std::strerror(errno);
  EXPECT_EQ(::mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::write(rw, "x", 1), -1);
  ::close(rw);
  void* map = ::mmap(nullptr, h.bytes, PROT_READ, MAP_SHARED, h.fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto lease = arenas_->Reserve("t", c->arena_id, 5000);
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::memset(lease->data, 0x7e, 5000);
  EXPECT_EQ(static_cast<const uint8_t*>(map)[lease->offset + 4999], 0x7e);
  ::munmap(map, h.bytes);
  // The token was for one hand-off; another tenant does not see the arena.
  HandOff again;
  Pickup(arenas_->options().socket_path, c->token, &again);
  EXPECT_LT(again.fd, 0);
  EXPECT_EQ(arenas_->Reserve("u", c->arena_id, 100).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      arenas_->Release("u", c->arena_id, {lease->lease_id}).status().code(),
      absl::StatusCode::kNotFound);
}

// A local process that connects and says nothing stalls nobody: the next
// client's hand-off goes through at once, and the silent one is hung up on.
TEST_F(ShmArenasTest, ASilentConnectionDoesNotStallHandOffs) {
  Start();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string& path = arenas_->options().socket_path;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int silent = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr),
            0);
  ASSERT_EQ(::send(silent, "0123", 4, 0), 4);  // A token's start, no more.
  auto c = arenas_->Create("t", 4096);
  ASSERT_TRUE(c.ok());
  const auto t0 = std::chrono::steady_clock::now();
  HandOff h;
  Pickup(path, c->token, &h);
  EXPECT_GE(h.fd, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  char b;
  EXPECT_EQ(::read(silent, &b, 1), 0);  // Closed after its 2 s.
  ::close(silent);
}

TEST_F(ShmArenasTest, LeasesFitReuseExpireAndReport) {
  ShmOptions o;
  o.lease = std::chrono::milliseconds(50);
  Start(o);
  auto c = arenas_->Create("t", 4 * 4096);
  ASSERT_TRUE(c.ok());
  HandOff h;
  Pickup(arenas_->options().socket_path, c->token, &h);
  auto a = arenas_->Reserve("t", c->arena_id, 4096);
  auto b = arenas_->Reserve("t", c->arena_id, 2 * 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(b->offset, 4096u);
  // A lease still being written never expires, however long it takes.
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_EQ(arenas_->Reserve("t", c->arena_id, 2 * 4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(arenas_->Stats().reclaimed_leases, 0u);
  arenas_->Written(*a);
  arenas_->Written(*b);
  // 1 page left: 2 do not fit while both leases live.
  auto full = arenas_->Reserve("t", c->arena_id, 2 * 4096);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(arenas_->Reserve("t", c->arena_id, 5 * 4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Released: the range is reused (first fit).
  auto r = arenas_->Release("t", c->arena_id, {a->lease_id});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->released, 1u);
  EXPECT_TRUE(r->expired.empty());
  auto a2 = arenas_->Reserve("t", c->arena_id, 4096);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->offset, 0u);
  arenas_->Written(*a2);
  // A second release of a lease is INVALID_ARGUMENT and releases nothing.
  EXPECT_EQ(arenas_->Release("t", c->arena_id, {a2->lease_id, a->lease_id})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arenas_->Stats().leases, 2u);
  // Past the lease time, leases are reclaimed only when room is needed.
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_EQ(arenas_->Stats().leases, 2u);
  auto big = arenas_->Reserve("t", c->arena_id, 4 * 4096);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(arenas_->Stats().reclaimed_leases, 2u);
  // Named twice, a lease is released once (not reported expired).
  r = arenas_->Release("t", c->arena_id,
                       {b->lease_id, big->lease_id, big->lease_id});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->released, 1u);
  EXPECT_EQ(r->expired, std::vector<uint64_t>{b->lease_id});
  EXPECT_EQ(arenas_->Stats().leased_bytes, 0u);
}

TEST_F(ShmArenasTest, LimitsAndAClientThatLeavesFreesItsArena) {
  ShmOptions o;
  o.max_arena_bytes = 8 * 4096;
  o.max_total_bytes = 8 * 4096;
  o.attach_timeout = std::chrono::milliseconds(100);
  Start(o);
  EXPECT_EQ(arenas_->Create("t", 9 * 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto c = arenas_->Create("t", 0);  // The largest.
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bytes, 8u * 4096);
  EXPECT_EQ(arenas_->Create("t", 4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Never picked up: void after attach_timeout, its room back.
  for (int i = 0; i < 100 && arenas_->Stats().arenas > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(arenas_->Stats().arenas, 0u);
  c = arenas_->Create("t", 0);
  ASSERT_TRUE(c.ok()) << c.status();
  auto h = std::make_unique<HandOff>();
  Pickup(arenas_->options().socket_path, c->token, h.get());
  ASSERT_GE(h->fd, 0);
  // A lease being written when the client leaves keeps the server's mapping.
  auto lease = arenas_->Reserve("t", c->arena_id, 4096);
  ASSERT_TRUE(lease.ok());
  h.reset();  // The client's connection closes.
  for (int i = 0; i < 100 && arenas_->Stats().arenas > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(arenas_->Stats().arenas, 0u);
  EXPECT_EQ(arenas_->Stats().dead_clients, 1u);
  std::memset(lease->data, 1, 4096);  // Still mapped.
  EXPECT_EQ(arenas_->Reserve("t", c->arena_id, 10).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(arenas_->Create("t", 0).ok());
}

// One tenant cannot take every arena (each a descriptor: the audit's client
// of 20,000 one-byte arenas left the process none to accept connections
// with) nor another tenant's bytes; a tenant's arena that goes gives its
// room back to that tenant.
TEST_F(ShmArenasTest, EachTenantHoldsAtMostItsArenasAndItsShare) {
  ShmOptions o;
  o.max_arena_bytes = 4 * 4096;
  o.max_total_bytes = 64 * 4096;
  o.max_tenant_bytes = 6 * 4096;
  o.max_arenas_per_tenant = 3;
  o.attach_timeout = std::chrono::milliseconds(100);
  Start(o);
  // bytes 0: the largest that fits (the arena cap, below the share).
  auto first = arenas_->Create("a", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->bytes, 4u * 4096);
  absl::StatusOr<ShmArenas::Created> over = arenas_->Create("a", 3 * 4096);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("share of --shm_max_total_bytes"),
            std::string::npos)
      << over.status();
  ASSERT_TRUE(arenas_->Create("a", 1).ok());  // One page.
  ASSERT_TRUE(arenas_->Create("a", 1).ok());
  over = arenas_->Create("a", 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("--shm_max_arenas_per_tenant"),
            std::string::npos)
      << over.status();
  EXPECT_EQ(arenas_->Stats().arenas, 3u);
  // Another tenant is not refused for a's use.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(arenas_->Create("b", 4096).ok()) << i;
  }
  EXPECT_EQ(arenas_->Create("b", 4096).status().code(),
            absl::StatusCode::kResourceExhausted);
  // None picked up: void after attach_timeout, each tenant's room back.
  for (int i = 0; i < 100 && arenas_->Stats().arenas > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(arenas_->Stats().arenas, 0u);
  EXPECT_EQ(arenas_->Stats().arena_bytes, 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(arenas_->Create("a", 2 * 4096).ok()) << i;
  }
}

// bytes 0 asks for the largest arena that fits now: within the tenant's
// share what its arenas leave, within the server's total what all leave;
// refused, naming the limit, when not a page is left.
TEST_F(ShmArenasTest, ZeroBytesIsTheLargestArenaThatFitsNow) {
  ShmOptions o;
  o.max_arena_bytes = 8 * 4096;
  o.max_total_bytes = 10 * 4096;
  o.max_tenant_bytes = 6 * 4096;
  o.max_arenas_per_tenant = 4;
  Start(o);
  auto a = arenas_->Create("a", 2 * 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  a = arenas_->Create("a", 0);  // The share's other 4 pages.
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes, 4u * 4096);
  a = arenas_->Create("a", 0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a.status().message().find("share of --shm_max_total_bytes"),
            std::string::npos)
      << a.status();
  auto b = arenas_->Create("b", 0);  // The server's last 4 pages.
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->bytes, 4u * 4096);
  b = arenas_->Create("c", 0);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("--shm_max_total_bytes"),
            std::string::npos)
      << b.status();
  EXPECT_EQ(arenas_->Stats().arena_bytes, 10u * 4096);
}

TEST_F(ShmArenasTest, ConcurrentReservationsNeverOverlap) {
  Start();
  auto c = arenas_->Create("t", 64 * 4096);
  ASSERT_TRUE(c.ok());
  HandOff h;
  Pickup(arenas_->options().socket_path, c->token, &h);
  std::atomic<int> overlaps{0}, full{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        auto l = arenas_->Reserve("t", c->arena_id, 4096 * (1 + (i + t) % 5));
        if (!l.ok()) {
          ++full;
          continue;
        }
        std::memset(l->data, t + 1, l->bytes);
        std::this_thread::yield();
        for (uint64_t k = 0; k < l->bytes; k += 512) {
          if (l->data[k] != t + 1) ++overlaps;
        }
        ASSERT_TRUE(arenas_->Release("t", c->arena_id, {l->lease_id}).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(full.load(), 0);  // 4 x at most 5 pages fit in 64.
  EXPECT_EQ(arenas_->Stats().leases, 0u);
}

}  // namespace
}  // namespace kvmem
