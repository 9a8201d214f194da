// Server: kvmem-server as a library. ServerOptions -> Server::Start opens
// (or creates) the RocksDB cold store, recovers every stream into a
// MemoryEngine, and serves kvmem.v1 plus grpc.health.v1 and server reflection
// on TCP and/or a unix socket, with Prometheus metrics when asked; Shutdown
// drains the calls in flight and closes the store. main.cc only turns flags
// and the TOML config into ServerOptions; tests and tools can start a server
// in process the same way.
//
// Thread safety: Start, Shutdown and the destructor from one thread; the
// accessors from any.
#ifndef KVMEM_SERVER_SERVER_H_
#define KVMEM_SERVER_SERVER_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/memory_engine.h"
#include "server/ops/tenancy.h"
#include "server/service/shm_arenas.h"
#include "storage/read_cache_store.h"
#include "storage/rocks_cold_store.h"
#include "storage/store_factory.h"

namespace grpc {
class Server;
}
namespace prometheus {
class Exposer;
}

namespace kvmem {

class Executor;
class KvMemoryService;
class ServerMetrics;

struct ServerOptions {
  // Where to serve; at least one. listen: HOST:PORT (port 0 picks one, see
  // Server::tcp_port); unix_socket: a path, created owner-only.
  std::string listen;
  std::string unix_socket;
  // Which cold store (storage/store_factory.h; empty: rocksdb:<store.path>)
  // and RocksDB's options (path, WAL sync, sizes, disk reserve) when it is
  // RocksDB.
  std::string store_spec;
  RocksColdStoreOptions store;
  // The Ceph cluster when store_spec is rados:POOL (its pool comes from the
  // spec).
  RadosColdStoreOptions rados;
  // A local read cache in front of a shared store (storage/
  // read_cache_store.h); its path empty: none. Refused with a local store.
  ReadCacheOptions store_cache;
  // Stream ownership through etcd (server/ownership/etcd_ownership.h) for
  // servers sharing a rados store: etcd's client address (host:port);
  // empty: none, this server owns every stream of its store.
  std::string etcd;
  std::string etcd_prefix = "kvmem/";
  // This server's address as clients reach it, which other servers name
  // when they redirect a client here; empty: `listen` when it names a
  // host and a port.
  std::string advertise;
  absl::Duration ownership_ttl = absl::Seconds(10);
  // How long a server waits for a stream's owner to refuse a connection
  // before leaving the stream to the owner's lease (zero: never probes;
  // EtcdOwnershipOptions::probe_timeout).
  absl::Duration ownership_probe = absl::Milliseconds(250);
  // A block's durable copy once it leaves RAM (EngineOptions::
  // demote_keeps_frames): "frames", "layers", or "auto" (frames: every
  // appended byte written once, and with frames in parts a cold token read
  // reads its tokens' parts; layers only where reads of a few layers of
  // whole cold blocks matter more than ingest).
  std::string cold_form = "auto";  // Sets engine.demote_keeps_frames.
  // The engine (budgets, stream defaults, recovery); its warn and error
  // callbacks default to the server's log.
  EngineOptions engine;
  // A device profile (deploy/profiles/*.toml): the sim accelerator backend.
  std::string accelerator_profile;
  int max_message_bytes = 64 << 20;
  int max_chunk_bytes = 4 << 20;
  // Threads for storage-bound work; 0: 2 per core, at least 4.
  int worker_threads = 0;
  // API keys (server/ops/tenancy.h's format); empty: no keys.
  std::string api_keys;
  Limits limits;
  // The instance label of metrics (empty: the host name) and the most
  // streams they label one by one.
  std::string instance_name;
  uint32_t metrics_max_streams = 32;
  // HOST:PORT of the Prometheus endpoint; empty: none.
  std::string metrics_listen;
  // TLS on the TCP listener: PEM files; client_ca_file also requires client
  // certificates. All empty: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Shared-memory delivery for same-host clients (server/service/
  // shm_arenas.h): on when unix_socket is set and shm.max_total_bytes > 0;
  // the hand-off socket is shm.socket_path, or unix_socket + ".shm".
  ShmOptions shm;
};

class Server {
 public:
  // Opens the store, recovers the engine and starts serving. An option out
  // of range is INVALID_ARGUMENT naming it; a store or engine that cannot
  // open, or an address that cannot be bound, is the failing status.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  // Shuts down with a 10-s drain if Shutdown was not called.
  ~Server();

  // Stops accepting calls, lets calls in flight finish until `deadline`
  // (then cancels them), runs queued work and closes the store. Idempotent.
  void Shutdown(std::chrono::system_clock::time_point deadline);

  int tcp_port() const { return tcp_port_; }
  int metrics_port() const { return metrics_port_; }
  const std::string& instance_name() const { return instance_; }
  MemoryEngine& engine() { return *engine_; }
  // Null when the server has no shared memory.
  ShmArenas* shm() { return shm_.get(); }

 private:
  Server() = default;
  absl::Status OpenEngine();
  // `store` behind the local read cache options_.store_cache names
  // (INVALID_ARGUMENT naming the flag for a local store).
  absl::StatusOr<std::unique_ptr<ColdStore>> WithStoreCache(
      const StoreSpec& spec, std::unique_ptr<ColdStore> store);
  // With options_.etcd: joins etcd (engine_options->ownership).
  absl::Status StartOwnership(const ColdStore& store,
                              EngineOptions* engine_options);
  absl::Status StartMetrics();
  absl::Status StartGrpc();

  ServerOptions options_;
  std::string instance_;
  int tcp_port_ = 0;
  int metrics_port_ = 0;
  // Destroyed in reverse: the gRPC server first, then the service, the
  // metrics endpoint, the executor (running queued tasks) and the engine
  // (closing RocksDB).
  // Outlives the engine, which asks it until it closes; revokes this
  // server's lease when it goes.
  std::shared_ptr<StreamOwnership> ownership_;
  std::unique_ptr<MemoryEngine> engine_;
  std::unique_ptr<Executor> executor_;
  // After the metrics endpoint that reads it, before the service.
  std::unique_ptr<ShmArenas> shm_;
  std::unique_ptr<Tenancy> tenancy_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<ServerMetrics> metrics_;
  // The read cache's counters (owned by the engine's store); null: none.
  const ReadCacheCounters* store_cache_ = nullptr;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<KvMemoryService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  bool stopped_ = false;
};

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVER_H_
