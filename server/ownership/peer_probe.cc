#include "server/ownership/peer_probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"

namespace kvmem {

namespace {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

bool SplitHostPort(const std::string& address, std::string* host,
                   std::string* port) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return false;
    }
    *host = address.substr(1, close - 1);
    *port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return false;
    *host = address.substr(0, colon);
    *port = address.substr(colon + 1);
    // A bare IPv6 address without brackets is ambiguous.
    if (host->find(':') != std::string::npos) return false;
  }
  return !host->empty() && !port->empty() &&
         port->find_first_not_of("0123456789") == std::string::npos &&
         port->size() <= 5;
}

// The unix socket path of "unix:/path" or "unix:///path"; empty otherwise.
std::string UnixPath(const std::string& address) {
  if (!absl::StartsWith(address, "unix:")) return "";
  std::string path = address.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  return path;
}

bool NumericEndpoint(const std::string& host, uint16_t port, Endpoint* e) {
  auto* v4 = reinterpret_cast<sockaddr_in*>(&e->addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    e->len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&e->addr);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    e->len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

// Resolver threads still running (a resolver that hangs keeps its thread
// until it gives up); past kMaxResolving a probe of a name is kUnknown.
std::atomic<int> resolving{0};
constexpr int kMaxResolving = 4;

// getaddrinfo on a helper thread, waited for until `deadline`: a resolver
// that does not answer must not hold the caller past its probe timeout.
// The helper owns its state (shared) and ends when the resolver does.
bool Resolve(const std::string& host, const std::string& port,
             Clock::time_point deadline, std::vector<Endpoint>* out) {
  if (resolving.fetch_add(1) >= kMaxResolving) {
    resolving.fetch_sub(1);
    return false;
  }
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<Endpoint> found;
  };
  auto state = std::make_shared<State>();
  std::thread([state, host, port] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* list = nullptr;
    std::vector<Endpoint> found;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &list) == 0) {
      for (addrinfo* a = list; a != nullptr; a = a->ai_next) {
        if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
        Endpoint e;
        std::memcpy(&e.addr, a->ai_addr, a->ai_addrlen);
        e.len = a->ai_addrlen;
        found.push_back(e);
      }
      freeaddrinfo(list);
    }
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->found = std::move(found);
      state->done = true;
      state->cv.notify_all();
    }
    resolving.fetch_sub(1);
  }).detach();
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_until(lock, deadline, [&] { return state->done; })) {
    return false;
  }
  *out = std::move(state->found);
  return !out->empty();
}

// One handshake, bounded by `deadline`.
PeerState Connect(const Endpoint& e, Clock::time_point deadline) {
  const int fd =
      ::socket(e.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return PeerState::kUnknown;
  PeerState state = PeerState::kUnknown;
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&e.addr), e.len) == 0) {
    state = PeerState::kListening;
  } else if (errno == EINPROGRESS) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    pollfd p{fd, POLLOUT, 0};
    socklen_t len = sizeof(err);
    if (left.count() > 0 &&
        ::poll(&p, 1, static_cast<int>(left.count())) == 1 &&
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
      state = err == 0              ? PeerState::kListening
              : err == ECONNREFUSED ? PeerState::kRefused
                                    : PeerState::kUnknown;
    }
  } else if (errno == ECONNREFUSED ||
             (e.addr.ss_family == AF_UNIX && errno == ENOENT)) {
    state = PeerState::kRefused;
  } else if (e.addr.ss_family == AF_UNIX && errno == EAGAIN) {
    state = PeerState::kListening;  // A full backlog: someone listens.
  }
  ::close(fd);
  return state;
}

}  // namespace

PeerState ProbePeer(const std::string& address, absl::Duration timeout) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         absl::ToChronoNanoseconds(timeout));
  std::vector<Endpoint> endpoints;
  if (const std::string path = UnixPath(address); !path.empty()) {
    Endpoint e;
    auto* un = reinterpret_cast<sockaddr_un*>(&e.addr);
    if (path.size() >= sizeof(un->sun_path)) return PeerState::kUnknown;
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, path.data(), path.size());
    e.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) +
                                   path.size() + 1);
    endpoints.push_back(e);
  } else {
    std::string host, port;
    if (!SplitHostPort(address, &host, &port)) return PeerState::kUnknown;
    const int port_number = std::stoi(port);
    if (port_number <= 0 || port_number > 65535) return PeerState::kUnknown;
    Endpoint e;
    if (NumericEndpoint(host, static_cast<uint16_t>(port_number), &e)) {
      endpoints.push_back(e);
    } else if (!Resolve(host, port, deadline, &endpoints)) {
      return PeerState::kUnknown;
    }
  }
  bool all_refused = true;
  for (const Endpoint& e : endpoints) {
    const PeerState s = Connect(e, deadline);
    if (s == PeerState::kListening) return s;
    all_refused = all_refused && s == PeerState::kRefused;
  }
  return all_refused ? PeerState::kRefused : PeerState::kUnknown;
}

bool IsHostLocalAddress(const std::string& address) {
  if (!UnixPath(address).empty()) return true;
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return false;
  if (host == "localhost" || absl::EndsWith(host, ".localhost")) return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 &&
         IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace kvmem
