// kvmem-server: the KV-cache memory service. Opens (or creates) the RocksDB
// cold store in --data_dir, recovers every stream, and serves kvmem.v1 plus
// grpc.health.v1 and server reflection on TCP and/or a unix socket until
// SIGINT or SIGTERM, then drains in-flight calls and closes the store.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "engine/device_profile.h"
#include "engine/executor.h"
#include "engine/memory_engine.h"
#include "server/config.h"
#include "server/kvmem_service.h"
#include "server/metrics.h"
#include "server/tenancy.h"
#include "spdlog/spdlog.h"
#include "storage/rocks_cold_store.h"

ABSL_FLAG(std::string, config, "",
          "TOML config file: [server] sets any of these flags by name, "
          "[stream_defaults] the policy of streams whose OpenStream leaves "
          "a field zero. Flags on the command line override it; "
          "--print_config shows the result.");
ABSL_FLAG(bool, print_config, false,
          "Print the effective configuration (config file, then flags) as "
          "TOML and exit.");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (GET /metrics); port 0 "
          "picks a free port. Empty: no metrics endpoint.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, write the bound metrics port to this file once serving.");
ABSL_FLAG(uint32_t, metrics_max_streams, 32,
          "Streams with a `stream` label of their own in /metrics (the "
          "first seen, until deleted); the rest are summed into "
          "stream=\"~other\".");
ABSL_FLAG(std::string, instance_name, "",
          "Name sent in every response's metadata as kvmem-instance (which "
          "server of a sharded set answered); empty: the host name.");
ABSL_FLAG(std::string, listen, "127.0.0.1:50551",
          "TCP address to serve on (host:port; port 0 picks a free port). "
          "Empty disables TCP.");
ABSL_FLAG(std::string, unix_socket, "",
          "Unix socket path to serve on (created with mode 0600). Empty "
          "disables it.");
ABSL_FLAG(std::string, data_dir, "./kvmem-data",
          "RocksDB directory of the cold store (created if missing).");
ABSL_FLAG(std::string, wal_sync, "interval",
          "When the RocksDB WAL is fsynced. commit: before each frame is "
          "acknowledged (nothing acknowledged is lost on power loss); "
          "interval: every --wal_sync_interval_ms (power loss loses at most "
          "that much); off: when the OS writes back. Under all three an "
          "acknowledged frame survives a crash of kvmem-server (kill -9).");
ABSL_FLAG(std::string, recovery, "salvage",
          "What a restart does with stored streams it cannot serve as "
          "acknowledged (acknowledged frames lost with a corrupt or "
          "truncated WAL, a config or index this build refuses). salvage: "
          "start; each such stream is quarantined (its calls answer "
          "DATA_LOSS or FAILED_PRECONDITION with the reason, ListStreams "
          "lists it, DeleteStream removes it), logged as an error and "
          "counted in kvmem_streams{state=\"quarantined\"}. strict: refuse "
          "to start, and let RocksDB refuse any WAL corruption but a torn "
          "last record.");
ABSL_FLAG(int32_t, wal_sync_interval_ms, 200,
          "With --wal_sync=interval: milliseconds between WAL fsyncs (>= 1).");
ABSL_FLAG(int32_t, disk_reserve_mib, -1,
          "MiB the data dir keeps free. Below it appends answer "
          "RESOURCE_EXHAUSTED naming the dir while reads, recalls, fetches "
          "and deletes keep working, and appends resume by themselves when "
          "space returns; if a write fails on a full disk anyway, the store "
          "stops writing and reopens once this much is free. -1: twice the "
          "memtable sizes plus 64 MiB (256 MiB with the defaults); 0: no "
          "guard.");
ABSL_FLAG(int32_t, rocksdb_write_buffer_mib, 64,
          "RocksDB memtable size per payload column family, MiB (RAM held "
          "before a flush to disk; metadata families use at most 16).");
ABSL_FLAG(int32_t, rocksdb_block_cache_mib, 64,
          "RocksDB block cache for metadata and small payloads, MiB.");
ABSL_FLAG(std::string, api_keys_file, "",
          "Tenants' API keys, lines \"tenant:key\" (keys of 16+ characters). "
          "Set (or $KVMEM_API_KEYS holding the same lines), every call needs "
          "metadata \"authorization: Bearer <key>\" and sees only its "
          "tenant's streams. Keys are never logged.");
ABSL_FLAG(uint32_t, max_streams_per_tenant, 1024,
          "Streams a tenant (the one tenant without keys) may hold; 0: no "
          "limit. Over it OpenStream is RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, max_stream_bytes, 0,
          "Payload bytes a stream may retain (frames appended and not "
          "evicted, full precision); 0: no limit.");
ABSL_FLAG(uint64_t, max_tenant_bytes, 0,
          "Payload bytes a tenant's streams may retain together; 0: no limit.");
ABSL_FLAG(uint64_t, max_total_bytes, 0,
          "Payload bytes all streams may retain together; 0: no limit. With "
          "API keys each tenant gets an equal share.");
ABSL_FLAG(uint32_t, max_calls_in_flight, 4096,
          "Calls served at once (streaming calls count while open); 0: no "
          "limit. Beyond it calls are RESOURCE_EXHAUSTED. With API keys each "
          "tenant gets an equal share.");
ABSL_FLAG(uint64_t, max_frame_bytes_in_flight, 1ull << 30,
          "Bytes of frames being received at once (a frame's buffer is "
          "allocated whole when its header arrives, and held until the "
          "frame is stored or the call ends); 0: no limit. Beyond it a frame "
          "header is RESOURCE_EXHAUSTED. With API keys each tenant gets an "
          "equal share (as of --max_total_bytes).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain for TLS on the TCP listener (with "
          "--tls_key_file); empty: plaintext TCP.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle; set, TCP clients must present a certificate it "
          "signed.");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20,
          "Largest gRPC message accepted or sent, in bytes.");
ABSL_FLAG(int32_t, max_chunk_bytes, 4 << 20,
          "Largest FetchBlocks chunk, in bytes (must be below "
          "--max_message_bytes).");
ABSL_FLAG(uint64_t, global_warm_budget_bytes, 1ull << 30,
          "RAM all streams' warm blocks may hold together (0: no cap; "
          "each stream's tier_policy.warm_budget_bytes still applies).");
ABSL_FLAG(std::string, accelerator_profile, "",
          "Run the sim accelerator backend with this hardware profile "
          "(deploy/profiles/*.toml): recalls as on the CPU, plus their "
          "modelled cost in RecallResponse.timing. Empty: the cpu backend.");
ABSL_FLAG(bool, tune_malloc, true,
          "Keep freed frame-sized buffers in the process (glibc mallopt: "
          "mmap threshold 64 MiB, trim threshold 512 MiB) instead of "
          "mapping and unmapping one per frame.");
ABSL_FLAG(int32_t, worker_threads, 0,
          "Threads for storage-bound work; 0 means 2 per core, at least 4.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound TCP port to this file once serving.");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off.");

namespace {

constexpr char kServiceName[] = "kvmem.v1.KvMemory";

// Writes port to path atomically (readers never see a partial file).
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

int Run(const kvmem::StreamConfig& stream_defaults) {
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  if (absl::GetFlag(FLAGS_tune_malloc)) {
    // Frames are hundreds of KiB: above glibc's default mmap threshold each
    // one would be mmapped and unmapped (page faults and zeroing per frame).
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const std::string unix_socket = absl::GetFlag(FLAGS_unix_socket);
  if (listen.empty() && unix_socket.empty()) {
    spdlog::error("nothing to serve on: set --listen and/or --unix_socket");
    return 2;
  }
  const int max_msg = absl::GetFlag(FLAGS_max_message_bytes);
  const int max_chunk = absl::GetFlag(FLAGS_max_chunk_bytes);
  if (max_msg < (1 << 16) || max_chunk < 1024 || max_chunk > max_msg - 4096) {
    spdlog::error(
        "--max_message_bytes={} must be >= 65536 and --max_chunk_bytes={} "
        "in [1024, max_message_bytes - 4096]",
        max_msg, max_chunk);
    return 2;
  }

  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  kvmem::RocksColdStoreOptions store_options;
  store_options.path = absl::GetFlag(FLAGS_data_dir);
  if (!kvmem::ParseWalSync(absl::GetFlag(FLAGS_wal_sync),
                           &store_options.wal_sync)) {
    spdlog::error("--wal_sync is \"{}\"; must be commit, interval or off",
                  absl::GetFlag(FLAGS_wal_sync));
    return 2;
  }
  if (absl::GetFlag(FLAGS_wal_sync_interval_ms) < 1) {
    spdlog::error("--wal_sync_interval_ms is {}; must be at least 1",
                  absl::GetFlag(FLAGS_wal_sync_interval_ms));
    return 2;
  }
  store_options.wal_sync_interval_ms =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_wal_sync_interval_ms));
  const std::string recovery = absl::GetFlag(FLAGS_recovery);
  if (recovery != "salvage" && recovery != "strict") {
    spdlog::error("--recovery is \"{}\"; must be salvage or strict", recovery);
    return 2;
  }
  store_options.strict_wal = recovery == "strict";
  const int32_t write_mib = absl::GetFlag(FLAGS_rocksdb_write_buffer_mib);
  const int32_t cache_mib = absl::GetFlag(FLAGS_rocksdb_block_cache_mib);
  if (write_mib < 1 || write_mib > 4096 || cache_mib < 1 || cache_mib > 65536) {
    spdlog::error(
        "--rocksdb_write_buffer_mib={} must be in [1, 4096] and "
        "--rocksdb_block_cache_mib={} in [1, 65536]",
        write_mib, cache_mib);
    return 2;
  }
  store_options.write_buffer_bytes = static_cast<uint64_t>(write_mib) << 20;
  store_options.block_cache_bytes = static_cast<uint64_t>(cache_mib) << 20;
  if (const int32_t reserve = absl::GetFlag(FLAGS_disk_reserve_mib);
      reserve >= 0) {
    store_options.reserve_bytes = static_cast<uint64_t>(reserve) << 20;
  } else if (reserve != -1) {
    spdlog::error("--disk_reserve_mib is {}; must be -1 (auto) or >= 0",
                  reserve);
    return 2;
  }
  auto store = kvmem::OpenRocksColdStore(store_options);
  if (!store.ok()) {
    spdlog::error("{}", store.status().ToString());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  kvmem::EngineOptions engine_options;
  engine_options.global_warm_budget_bytes =
      absl::GetFlag(FLAGS_global_warm_budget_bytes);
  engine_options.warn = [](const std::string& w) { spdlog::warn("{}", w); };
  engine_options.error = [](const std::string& e) { spdlog::error("{}", e); };
  engine_options.strict_recovery = recovery == "strict";
  engine_options.stream_defaults = stream_defaults;
  if (const std::string path = absl::GetFlag(FLAGS_accelerator_profile);
      !path.empty()) {
    auto profile = kvmem::LoadDeviceProfile(path);
    absl::StatusOr<kvmem::SimHardware> hw =
        profile.ok() ? kvmem::SimHardwareFromProfile(*profile)
                     : absl::StatusOr<kvmem::SimHardware>(profile.status());
    if (!hw.ok()) {
      spdlog::error("--accelerator_profile: {}", hw.status().ToString());
      return 2;
    }
    engine_options.sim = *hw;
    spdlog::info("sim accelerator backend: {} ({} lanes at {} MHz, {} GB/s)",
                 profile->name, hw->lanes, hw->clock_hz / 1e6,
                 hw->dram_bandwidth_bytes_per_s / 1e9);
  }
  auto engine = kvmem::MemoryEngine::Open(*std::move(store), engine_options);
  if (!engine.ok()) {
    spdlog::error("recovery failed: {}", engine.status().ToString());
    return 1;
  }
  const double recover_ms = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t0)
                                .count();
  for (const auto& s : (*engine)->ListStreams()) {
    spdlog::info(
        "recovered stream {}: {} frames, {} blocks, last durable "
        "frame {}",
        s.stream_id, s.frames, s.sealed_blocks, s.last_durable_frame);
  }
  spdlog::info(
      "opened {} with {} streams ({} quarantined) in {:.1f} ms (WAL sync: "
      "{}, recovery: {})",
      store_options.path, (*engine)->stream_count(),
      (*engine)->Quarantined().size(), recover_ms,
      kvmem::WalSyncName(store_options.wal_sync), recovery);

  int workers = absl::GetFlag(FLAGS_worker_threads);
  if (workers <= 0) {
    workers =
        std::max(4, 2 * static_cast<int>(std::thread::hardware_concurrency()));
  }
  auto executor = std::make_unique<kvmem::Executor>(workers);
  std::string keys_text;
  if (!absl::GetFlag(FLAGS_api_keys_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_api_keys_file));
    if (!in) {
      spdlog::error("--api_keys_file {} cannot be read",
                    absl::GetFlag(FLAGS_api_keys_file));
      return 2;
    }
    keys_text.assign(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
  } else if (const char* env = std::getenv("KVMEM_API_KEYS")) {
    keys_text = env;
  }
  absl::StatusOr<kvmem::Tenancy> tenancy = kvmem::Tenancy::Parse(keys_text);
  if (!tenancy.ok()) {
    spdlog::error("{}", std::string(tenancy.status().message()));
    return 2;
  }
  if (tenancy->enabled()) {
    spdlog::info("API keys on: {} tenants", tenancy->tenants());
  }
  kvmem::Limits limits;
  limits.max_streams_per_tenant = absl::GetFlag(FLAGS_max_streams_per_tenant);
  limits.max_stream_bytes = absl::GetFlag(FLAGS_max_stream_bytes);
  limits.max_tenant_bytes = absl::GetFlag(FLAGS_max_tenant_bytes);
  limits.max_total_bytes = absl::GetFlag(FLAGS_max_total_bytes);
  limits.max_calls_in_flight = absl::GetFlag(FLAGS_max_calls_in_flight);
  limits.max_frame_bytes_in_flight =
      absl::GetFlag(FLAGS_max_frame_bytes_in_flight);
  kvmem::Admission admission(&*tenancy, engine->get(), limits);
  std::string instance = absl::GetFlag(FLAGS_instance_name);
  if (instance.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    instance = host;
  }
  kvmem::ServerMetrics::Options metrics_options;
  metrics_options.max_streams = absl::GetFlag(FLAGS_metrics_max_streams);
  metrics_options.instance_name = instance;
  kvmem::ServerMetrics metrics(engine->get(), metrics_options);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (const std::string addr = absl::GetFlag(FLAGS_metrics_listen);
      !addr.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(addr, 2);
    } catch (const std::exception& e) {
      spdlog::error("--metrics_listen={}: cannot listen ({})", addr, e.what());
      return 1;
    }
    exposer->RegisterCollectable(metrics.collectable());
    const std::vector<int> ports = exposer->GetListeningPorts();
    const int port = ports.empty() ? 0 : ports[0];
    spdlog::info("metrics on http://{}/metrics (port {})", addr, port);
    WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), port);
  }
  kvmem::ServiceOptions service_options;
  service_options.metrics = &metrics;
  service_options.max_chunk_bytes = static_cast<uint32_t>(max_chunk);
  service_options.tenancy = &*tenancy;
  service_options.admission = &admission;
  kvmem::KvMemoryService service(engine->get(), executor.get(),
                                 service_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(max_msg);
  builder.SetMaxSendMessageSize(max_msg);
  {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(metrics.NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  int tcp_port = 0;
  std::shared_ptr<grpc::ServerCredentials> tcp_creds =
      grpc::InsecureServerCredentials();
  const std::string cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  const std::string key_file = absl::GetFlag(FLAGS_tls_key_file);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca_file);
  if (!cert_file.empty() || !key_file.empty() || !client_ca.empty()) {
    auto read = [](const std::string& path, std::string* out) {
      std::ifstream in(path, std::ios::binary);
      out->assign(std::istreambuf_iterator<char>(in),
                  std::istreambuf_iterator<char>());
      return in.good() || in.eof();
    };
    grpc::SslServerCredentialsOptions ssl(
        client_ca.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    if (cert_file.empty() || key_file.empty() ||
        !read(cert_file, &pair.cert_chain) ||
        !read(key_file, &pair.private_key) || pair.cert_chain.empty() ||
        pair.private_key.empty() ||
        (!client_ca.empty() && (!read(client_ca, &ssl.pem_root_certs) ||
                                ssl.pem_root_certs.empty()))) {
      spdlog::error(
          "TLS needs readable --tls_cert_file and --tls_key_file (and "
          "--tls_client_ca_file when set)");
      return 2;
    }
    ssl.pem_key_cert_pairs.push_back(pair);
    tcp_creds = grpc::SslServerCredentials(ssl);
    spdlog::info("TLS on the TCP listener{}",
                 client_ca.empty() ? "" : ", client certificates required");
  }
  if (!listen.empty()) {
    builder.AddListeningPort(listen, tcp_creds, &tcp_port);
  }
  if (!unix_socket.empty()) {
    ::unlink(unix_socket.c_str());
    builder.AddListeningPort("unix:" + unix_socket,
                             grpc::InsecureServerCredentials());
  }
  builder.RegisterService(&service);
  // The socket is created owner-only (no window where others can connect).
  const mode_t old_umask = ::umask(0077);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(old_umask);
  if (!server || (!listen.empty() && tcp_port == 0)) {
    spdlog::error("could not listen on {}{}{}", listen,
                  unix_socket.empty() ? "" : " / unix:", unix_socket);
    return 1;
  }
  if (!unix_socket.empty() && ::chmod(unix_socket.c_str(), 0600) != 0) {
    spdlog::error("could not make unix:{} owner-only (chmod 0600): {}",
                  unix_socket, std::strerror(errno));
    server->Shutdown();
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  server->GetHealthCheckService()->SetServingStatus(true);
  if (!listen.empty()) {
    spdlog::info("serving on tcp port {} as instance \"{}\"", tcp_port,
                 instance);
  }
  if (!unix_socket.empty()) spdlog::info("serving on unix:{}", unix_socket);
  WritePortFile(absl::GetFlag(FLAGS_port_file), tcp_port);

  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("signal {}: draining calls", sig);
  server->GetHealthCheckService()->SetServingStatus(false);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server->Wait();
  exposer.reset();   // Scrapes read the engine.
  executor.reset();  // Runs every queued task.
  engine->reset();   // Closes RocksDB, syncing the WAL.
  if (!unix_socket.empty()) ::unlink(unix_socket.c_str());
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --help lists the flags defined in kvmem's own sources.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "server/") ||
           absl::StrContains(file, "client/");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "the KV-cache memory service for streaming video LLMs.\n"
      "Usage: kvmem-server [--listen=HOST:PORT] [--unix_socket=PATH] "
      "[--data_dir=DIR] ...");
  // "--print-config" is accepted for --print_config (any flag's dashes).
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    std::string& a = args[i];
    if (!absl::StartsWith(a, "--")) continue;
    const size_t end = std::min(a.find('='), a.size());
    std::replace(a.begin() + 2, a.begin() + static_cast<long>(end), '-', '_');
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  // The config file first, so that flags on the command line override it.
  kvmem::StreamConfig stream_defaults;
  const std::string config = kvmem::ConfigPathFromArgs(argc, cargs.data());
  if (!config.empty()) {
    absl::Status s = kvmem::ApplyConfigFile(config, &stream_defaults);
    if (!s.ok()) {
      std::fprintf(stderr, "kvmem-server: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  absl::ParseCommandLine(argc, cargs.data());
  if (absl::GetFlag(FLAGS_config) != config) {
    std::fprintf(stderr,
                 "kvmem-server: --config must be given on the command line "
                 "(not through --flagfile or the environment)\n");
    return 2;
  }
  if (absl::Status s = kvmem::ValidateStreamDefaults(stream_defaults);
      !s.ok()) {
    std::fprintf(stderr, "kvmem-server: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_print_config)) {
    std::fputs(kvmem::EffectiveConfigToml(stream_defaults).c_str(), stdout);
    return 0;
  }
  return Run(stream_defaults);
}
