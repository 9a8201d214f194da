#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/executor.h"
#include "base/status_macros.h"
#include "server/ops/metrics.h"
#include "server/ownership/etcd_ownership.h"
#include "server/service/kvmem_service.h"
#include "spdlog/spdlog.h"

namespace kvmem {
namespace {

constexpr char kServiceName[] = "kvmem.v1.KvMemory";

absl::Status CheckOptions(const ServerOptions& o) {
  if (o.listen.empty() && o.unix_socket.empty()) {
    return absl::InvalidArgumentError(
        "nothing to serve on: set --listen and/or --unix_socket");
  }
  const int max_msg = o.max_message_bytes, max_chunk = o.max_chunk_bytes;
  if (max_msg < (1 << 16) || max_chunk < 1024 || max_chunk > max_msg - 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", max_msg,
                     " must be >= 65536 and --max_chunk_bytes=", max_chunk,
                     " in [1024, max_message_bytes - 4096]"));
  }
  if (o.shm.max_total_bytes > 0 &&
      (o.shm.max_arena_bytes < 4096 ||
       o.shm.max_arena_bytes > o.shm.max_total_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm_max_arena_bytes=", o.shm.max_arena_bytes,
        " must be in [4096, --shm_max_total_bytes=", o.shm.max_total_bytes,
        "]"));
  }
  if (o.shm.max_total_bytes > 0 && o.shm.max_arenas_per_tenant < 1) {
    return absl::InvalidArgumentError(
        "--shm_max_arenas_per_tenant=0 must be at least 1");
  }
  if (o.shm.lease.count() < 1 || o.shm.lease.count() > 3600 * 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm_lease_ms=", o.shm.lease.count(), " must be in [1, 3600000]"));
  }
  return absl::OkStatus();
}

// Reads a whole file; false when it cannot be read.
bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  out->assign(std::istreambuf_iterator<char>(in),
              std::istreambuf_iterator<char>());
  return in.good() || in.eof();
}

// The TCP listener's credentials: plaintext, or TLS from the PEM files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(
    const ServerOptions& o) {
  if (o.tls_cert_file.empty() && o.tls_key_file.empty() &&
      o.tls_client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  const bool mtls = !o.tls_client_ca_file.empty();
  grpc::SslServerCredentialsOptions ssl(
      mtls ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  if (o.tls_cert_file.empty() || o.tls_key_file.empty() ||
      !ReadFile(o.tls_cert_file, &pair.cert_chain) ||
      !ReadFile(o.tls_key_file, &pair.private_key) || pair.cert_chain.empty() ||
      pair.private_key.empty() ||
      (mtls && (!ReadFile(o.tls_client_ca_file, &ssl.pem_root_certs) ||
                ssl.pem_root_certs.empty()))) {
    return absl::InvalidArgumentError(
        "TLS needs readable --tls_cert_file and --tls_key_file (and "
        "--tls_client_ca_file when set)");
  }
  ssl.pem_key_cert_pairs.push_back(pair);
  spdlog::info("TLS on the TCP listener{}",
               mtls ? ", client certificates required" : "");
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  KVMEM_RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<Server> s(new Server());
  s->options_ = std::move(options);
  const ServerOptions& o = s->options_;
  s->instance_ = o.instance_name;
  if (s->instance_.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    s->instance_ = host;
  }
  KVMEM_ASSIGN_OR_RETURN(Tenancy tenancy, Tenancy::Parse(o.api_keys));
  if (tenancy.enabled())
    spdlog::info("API keys on: {} tenants", tenancy.tenants());
  s->tenancy_ = std::make_unique<Tenancy>(std::move(tenancy));
  KVMEM_RETURN_IF_ERROR(s->OpenEngine());
  int workers = o.worker_threads;
  if (workers <= 0) {
    workers =
        std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  }
  s->executor_ = std::make_unique<Executor>(workers);
  s->admission_ = std::make_unique<Admission>(s->tenancy_.get(),
                                              s->engine_.get(), o.limits);
  ServerMetrics::Options metrics_options;
  metrics_options.max_streams = o.metrics_max_streams;
  metrics_options.instance_name = s->instance_;
  s->metrics_ =
      std::make_unique<ServerMetrics>(s->engine_.get(), metrics_options);
  if (s->store_cache_ != nullptr) s->metrics_->WatchStoreCache(s->store_cache_);
  KVMEM_RETURN_IF_ERROR(s->StartMetrics());
  if (!o.unix_socket.empty() && o.shm.max_total_bytes > 0) {
    ShmOptions shm = o.shm;
    if (shm.socket_path.empty()) shm.socket_path = o.unix_socket + ".shm";
    // With keys, each tenant's arenas get an equal share of the total.
    if (s->tenancy_->enabled()) {
      // Whole pages: an arena is (RoundUp), and one of the share's size must
      // fit it.
      shm.max_tenant_bytes = std::max<uint64_t>(
          4096, shm.max_total_bytes / s->tenancy_->tenants() / 4096 * 4096);
    }
    KVMEM_ASSIGN_OR_RETURN(s->shm_, ShmArenas::Start(shm));
    s->metrics_->WatchSharedMemory(s->shm_.get());
    spdlog::info("shared memory: hand-off socket {}, arenas up to {} bytes",
                 shm.socket_path, shm.max_arena_bytes);
  }
  ServiceOptions service_options;
  service_options.metrics = s->metrics_.get();
  service_options.shm = s->shm_.get();
  service_options.copy_helpers = std::clamp(
      static_cast<int>(std::thread::hardware_concurrency()) - 1, 0, 3);
  // Room for the rest of the response (the recall set) beside the bytes.
  const uint64_t max_msg = static_cast<uint64_t>(o.max_message_bytes);
  service_options.max_inline_bytes =
      max_msg - std::min<uint64_t>(1u << 20, max_msg / 2);
  service_options.max_chunk_bytes = static_cast<uint32_t>(o.max_chunk_bytes);
  // A Session's answer wraps the recall's in a few bytes more.
  service_options.max_answer_bytes =
      max_msg - std::min<uint64_t>(1024, max_msg);
  service_options.tenancy = s->tenancy_.get();
  service_options.admission = s->admission_.get();
  s->service_ = std::make_unique<KvMemoryService>(
      s->engine_.get(), s->executor_.get(), service_options);
  KVMEM_RETURN_IF_ERROR(s->StartGrpc());
  return s;
}

namespace {

// What "acknowledged" means with this store, for the log.
std::string DurabilityNote(const StoreSpec& spec,
                           const RocksColdStoreOptions& rocks) {
  switch (spec.kind) {
    case StoreSpec::Kind::kRocksDb:
      return absl::StrCat("WAL sync: ", WalSyncName(rocks.wal_sync));
    case StoreSpec::Kind::kRados:
      return "each commit on disk on every replica";
    case StoreSpec::Kind::kMemory:
      break;
  }
  return "not durable";
}

}  // namespace

absl::Status Server::StartOwnership(const ColdStore& store,
                                    EngineOptions* engine_options) {
  if (options_.etcd.empty()) return absl::OkStatus();
  if (!store.shared()) {
    return absl::InvalidArgumentError(
        "--etcd: stream ownership is for a store several servers share "
        "(--store=rados:POOL)");
  }
  EtcdOwnershipOptions o;
  o.etcd.endpoint = options_.etcd;
  o.key_prefix = options_.etcd_prefix;
  o.ttl = options_.ownership_ttl;
  o.probe_timeout = options_.ownership_probe;
  o.advertise = options_.advertise;
  if (o.advertise.empty()) {
    const size_t colon = options_.listen.rfind(':');
    const std::string host =
        colon == std::string::npos ? "" : options_.listen.substr(0, colon);
    const std::string port =
        colon == std::string::npos ? "" : options_.listen.substr(colon + 1);
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || port.empty() ||
        port == "0") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--etcd needs this server's address as clients reach it: set "
          "--advertise=host:port (--listen is \"",
          options_.listen, "\")"));
    }
    o.advertise = options_.listen;
  }
  o.warn = [](const std::string& w) { spdlog::warn("ownership: {}", w); };
  absl::StatusOr<std::unique_ptr<EtcdOwnership>> own = EtcdOwnership::Start(o);
  if (!own.ok()) {
    return absl::Status(
        own.status().code(),
        absl::StrCat("--etcd=", options_.etcd, ": ", own.status().message()));
  }
  spdlog::info(
      "stream ownership: etcd {} (keys {}streams/, lease {}, TTL {}), "
      "advertised as {}",
      options_.etcd, o.key_prefix, (*own)->lease(), absl::FormatDuration(o.ttl),
      o.advertise);
  ownership_ = *std::move(own);
  engine_options->ownership = ownership_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ColdStore>> Server::WithStoreCache(
    const StoreSpec& spec, std::unique_ptr<ColdStore> store) {
  const ReadCacheOptions& o = options_.store_cache;
  if (!store->shared()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--store_cache=", o.path,
        ": a read cache goes in front of a shared store (--store=rados:POOL);"
        " store \"",
        spec.ToString(), "\" is local"));
  }
  absl::StatusOr<std::unique_ptr<ColdStore>> cached =
      WithReadCache(std::move(store), o, &store_cache_);
  if (!cached.ok()) {
    return absl::Status(
        cached.status().code(),
        absl::StrCat("--store_cache: ", cached.status().message()));
  }
  spdlog::info("local read cache: {} (up to {} MiB{})", o.path,
               o.capacity_bytes >> 20,
               o.write_through ? ", write-through" : "");
  return cached;
}

absl::Status Server::OpenEngine() {
  EngineOptions engine_options = options_.engine;
  if (!engine_options.warn) {
    engine_options.warn = [](const std::string& w) { spdlog::warn("{}", w); };
  }
  if (!engine_options.error) {
    engine_options.error = [](const std::string& e) { spdlog::error("{}", e); };
  }
  engine_options.sim_profile_path = options_.accelerator_profile;
  StoreSpec spec{StoreSpec::Kind::kRocksDb, options_.store.path};
  if (!options_.store_spec.empty()) {
    absl::StatusOr<StoreSpec> parsed = ParseStoreSpec(options_.store_spec);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--store: ", parsed.status().message()));
    }
    spec = *std::move(parsed);
  }
  if (!spec.durable()) {
    spdlog::warn("store \"{}\" keeps nothing past this process",
                 spec.ToString());
  }
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<ColdStore> store,
                         OpenColdStore(spec, options_.store, options_.rados));
  if (!options_.store_cache.path.empty()) {
    KVMEM_ASSIGN_OR_RETURN(store, WithStoreCache(spec, std::move(store)));
  }
  KVMEM_RETURN_IF_ERROR(StartOwnership(*store, &engine_options));
  // auto: frames on every store since frames are stored in parts
  // (docs/benchmarks.md#cameras-per-node-kvmem-bench---cameras): the
  // layers form's rewrite of each demoted block held appends back.
  engine_options.demote_keeps_frames = options_.cold_form != "layers";
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<MemoryEngine>> engine =
      MemoryEngine::Open(std::move(store), engine_options);
  if (!engine.ok()) {
    const absl::Status& st = engine.status();
    if (absl::IsInvalidArgument(st) &&
        absl::StartsWith(st.message(), kSimProfileError)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--accelerator_profile: ", st.message()));
    }
    return absl::Status(st.code(),
                        absl::StrCat("recovery failed: ", st.message()));
  }
  engine_ = *std::move(engine);
  spdlog::info("accelerator backend: {}", engine_->accelerator_description());
  const double recover_ms = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t0)
                                .count();
  for (const StreamStats& st : engine_->ListStreams()) {
    spdlog::info(
        "recovered stream {}: {} frames, {} blocks, last durable frame {}",
        st.stream_id, st.frames, st.sealed_blocks, st.last_durable_frame);
  }
  spdlog::info(
      "opened {} with {} streams ({} quarantined) in {:.1f} ms ({}, "
      "recovery: {}, cold blocks kept as {}{}, recall threads {})",
      spec.ToString(), engine_->stream_count(), engine_->Quarantined().size(),
      recover_ms, DurabilityNote(spec, options_.store),
      engine_options.strict_recovery ? "strict" : "salvage",
      engine_options.demote_keeps_frames ? "frames" : "layers",
      engine_options.frame_parts ? ", new streams' frames in parts" : "",
      RecallThreads(engine_options.recall_threads));
  return absl::OkStatus();
}

absl::Status Server::StartMetrics() {
  const std::string& addr = options_.metrics_listen;
  if (addr.empty()) return absl::OkStatus();
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(addr, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics_listen=", addr, ": cannot listen (", e.what(), ")"));
  }
  exposer_->RegisterCollectable(metrics_->collectable());
  const std::vector<int> ports = exposer_->GetListeningPorts();
  metrics_port_ = ports.empty() ? 0 : ports[0];
  spdlog::info("metrics on http://{}/metrics (port {})", addr, metrics_port_);
  return absl::OkStatus();
}

absl::Status Server::StartGrpc() {
  const ServerOptions& o = options_;
  KVMEM_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tcp_creds,
                         TcpCredentials(o));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(o.max_message_bytes);
  builder.SetMaxSendMessageSize(o.max_message_bytes);
  // gRPC sets SO_REUSEPORT by default on Linux: a second server on the same
  // port would then share its connections instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // No bandwidth-delay probing: a stream's receive window stays at gRPC's
  // default lookahead (64 KiB, grown only to fit a message being read)
  // instead of growing to megabytes, so a client whose Session stops being
  // read cannot park megabytes of requests in the server
  // (SecurityTest.ASessionThatIsNeverReadIsBounded: 7.1 MiB -> 0.8 MiB).
  // Appends measured the same without it over a unix socket (docs/
  // operating.md#quotas-and-limits).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(metrics_->NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  if (!o.listen.empty()) {
    builder.AddListeningPort(o.listen, tcp_creds, &tcp_port_);
  }
  if (!o.unix_socket.empty()) {
    ::unlink(o.unix_socket.c_str());
    builder.AddListeningPort("unix:" + o.unix_socket,
                             grpc::InsecureServerCredentials());
  }
  builder.RegisterService(service_.get());
  // The socket is created owner-only (no window where others can connect).
  const mode_t old_umask = ::umask(0077);
  grpc_ = builder.BuildAndStart();
  ::umask(old_umask);
  if (!grpc_ || (!o.listen.empty() && tcp_port_ == 0)) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", o.listen,
                     o.unix_socket.empty() ? "" : " / unix:", o.unix_socket));
  }
  if (!o.unix_socket.empty() && ::chmod(o.unix_socket.c_str(), 0600) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("could not make unix:", o.unix_socket,
                     " owner-only (chmod 0600): ", std::strerror(errno)));
  }
  grpc_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  grpc_->GetHealthCheckService()->SetServingStatus(true);
  if (!o.listen.empty()) {
    spdlog::info("serving on tcp port {} as instance \"{}\"", tcp_port_,
                 instance_);
  }
  if (!o.unix_socket.empty()) spdlog::info("serving on unix:{}", o.unix_socket);
  return absl::OkStatus();
}

void Server::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (stopped_) return;
  stopped_ = true;
  if (grpc_) {
    grpc_->GetHealthCheckService()->SetServingStatus(false);
    grpc_->Shutdown(deadline);
    grpc_->Wait();
  }
  grpc_.reset();
  service_.reset();
  exposer_.reset();   // Scrapes read the engine.
  executor_.reset();  // Runs every queued task.
  shm_.reset();       // After the tasks that place blocks in arenas.
  metrics_.reset();
  admission_.reset();
  engine_.reset();     // Closes RocksDB, syncing the WAL.
  ownership_.reset();  // Hands this server's streams over (lease revoked).
  if (!options_.unix_socket.empty()) ::unlink(options_.unix_socket.c_str());
}

Server::~Server() {
  Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

}  // namespace kvmem
