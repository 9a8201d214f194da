// ProbePeer: is a kvmem-server still there at an address another server
// advertised? Used by stream ownership (etcd_ownership.h) to take over the
// streams of an owner that is gone without waiting for its lease to expire.
//
// The only answer that counts as "gone" is a refusal: every address the
// name resolves to answers the TCP handshake with a reset (ECONNREFUSED:
// the host is up and nothing listens on the port; a process killed or
// crashed loses its listening socket once the kernel has torn it down,
// after freeing its memory: a moment for a large heap). A paused process
// (SIGSTOP) still completes handshakes from its listening socket's
// backlog, and a host that is down, partitioned or filtered does not
// answer in time: both are kUnknown, as is a name that does not resolve
// within the timeout (resolved on a helper thread; at most 4 run at once,
// past that kUnknown).
// Nothing here decides safety: a stream taken from an owner that was alive
// after all is fenced by the store (its next commit is refused).
//
// Thread safety: free functions, callable from any thread.
#ifndef KVMEM_SERVER_OWNERSHIP_PEER_PROBE_H_
#define KVMEM_SERVER_OWNERSHIP_PEER_PROBE_H_

#include <string>

#include "absl/time/time.h"

namespace kvmem {

enum class PeerState {
  kListening,  // A handshake completed on one of its addresses.
  kRefused,    // Every address refused: nothing listens there.
  kUnknown,    // No answer in time, unresolvable, or not an address.
};

// Probes "host:port", "[v6]:port" or "unix:/path" (a unix socket: a path
// that does not exist, or refuses, is kRefused) within `timeout` in all,
// name resolution included.
PeerState ProbePeer(const std::string& address, absl::Duration timeout);

// True when "host:port" names this host's loopback (127.0.0.0/8, ::1,
// "localhost") or a unix socket: a place only processes on the same host
// can probe.
bool IsHostLocalAddress(const std::string& address);

}  // namespace kvmem

#endif  // KVMEM_SERVER_OWNERSHIP_PEER_PROBE_H_
