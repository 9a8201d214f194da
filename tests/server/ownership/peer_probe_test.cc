// ProbePeer (server/ownership/peer_probe.h) against real sockets: a
// listening socket is kListening even when nothing accepts (a paused
// process's backlog), a closed port or a missing unix socket is kRefused,
// an address that does not answer or does not parse is kUnknown within the
// timeout. IsHostLocalAddress names loopback and unix sockets.
#include "server/ownership/peer_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

// A TCP socket on 127.0.0.1 bound to a free port; listening if asked.
class TcpSocket {
 public:
  explicit TcpSocket(bool listen) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    if (listen) {
      EXPECT_EQ(::listen(fd_, 16), 0);
    }
  }
  ~TcpSocket() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

constexpr absl::Duration kTimeout = absl::Milliseconds(300);

TEST(PeerProbeTest, AListeningSocketIsThereEvenWhenNothingAccepts) {
  TcpSocket s(/*listen=*/true);
  // Several probes: each completes from the backlog, none is accepted.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ProbePeer(s.address(), kTimeout), PeerState::kListening);
  }
  const std::string port = s.address().substr(s.address().rfind(':'));
  EXPECT_EQ(ProbePeer("localhost" + port, kTimeout), PeerState::kListening);
}

TEST(PeerProbeTest, APortNothingListensOnRefuses) {
  TcpSocket s(/*listen=*/true);
  const std::string address = s.address();
  s.Close();
  EXPECT_EQ(ProbePeer(address, kTimeout), PeerState::kRefused);
  TcpSocket bound(/*listen=*/false);  // Bound, not listening: refused too.
  EXPECT_EQ(ProbePeer(bound.address(), kTimeout), PeerState::kRefused);
}

TEST(PeerProbeTest, UnixSockets) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/kvmem.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  EXPECT_EQ(ProbePeer("unix:" + path, kTimeout), PeerState::kListening);
  EXPECT_EQ(ProbePeer("unix://" + path, kTimeout), PeerState::kListening);
  ::close(fd);  // The file stays, nothing listens: refused.
  EXPECT_EQ(ProbePeer("unix:" + path, kTimeout), PeerState::kRefused);
  ::unlink(path.c_str());
  EXPECT_EQ(ProbePeer("unix:" + path, kTimeout), PeerState::kRefused);
}

TEST(PeerProbeTest, WhatIsNotAnAddressIsUnknown) {
  for (const std::string bad :
       {"", "no-port", "host:", ":80", "127.0.0.1:99999", "127.0.0.1:8x",
        "::1:80", "[::1]", "[::1]80", "host.invalid:80"}) {
    EXPECT_EQ(ProbePeer(bad, kTimeout), PeerState::kUnknown) << bad;
  }
}

// A listener whose accept queue is full drops further handshakes (what a
// host that does not answer looks like): kUnknown once the timeout passes,
// not a wait for TCP's retransmissions.
TEST(PeerProbeTest, AnAddressThatDoesNotAnswerIsUnknownWithinTheTimeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::listen(fd, 0), 0);
  std::vector<int> fill;
  for (int i = 0; i < 4; ++i) {  // Never accepted: the queue fills.
    fill.push_back(
        ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    ::connect(fill.back(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  absl::SleepFor(absl::Milliseconds(50));
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ProbePeer(address, kTimeout), PeerState::kUnknown);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::milliseconds(1500));
  for (int f : fill) ::close(f);
  ::close(fd);
}

TEST(PeerProbeTest, HostLocalAddresses) {
  EXPECT_TRUE(IsHostLocalAddress("127.0.0.1:5"));
  EXPECT_TRUE(IsHostLocalAddress("127.8.0.1:5"));
  EXPECT_TRUE(IsHostLocalAddress("localhost:5"));
  EXPECT_TRUE(IsHostLocalAddress("[::1]:5"));
  EXPECT_TRUE(IsHostLocalAddress("unix:/tmp/kvmem.sock"));
  EXPECT_FALSE(IsHostLocalAddress("10.0.0.7:5"));
  EXPECT_FALSE(IsHostLocalAddress("[fe80::1]:5"));
  EXPECT_FALSE(IsHostLocalAddress("kvmem-0.kvmem:50051"));
  EXPECT_FALSE(IsHostLocalAddress("not an address"));
}

}  // namespace
}  // namespace kvmem
