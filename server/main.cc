// kvmem-server: the KV-cache memory service. Opens (or creates) the RocksDB
// cold store in --data_dir, recovers every stream, and serves kvmem.v1 plus
// grpc.health.v1 and server reflection on TCP and/or a unix socket until
// SIGINT or SIGTERM, then drains in-flight calls and closes the store.
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "server/ops/config.h"
#include "server/ops/huge_pages.h"
#include "server/server.h"
#include "server/shared_tier_flags.h"
#include "spdlog/spdlog.h"

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
          "RocksDB directory of the cold store (created if missing); "
          "--store names another store.");
ABSL_FLAG(std::string, store, "",
          "The cold store: rocksdb:DIR (RocksDB in DIR; empty: "
          "rocksdb:<--data_dir>), rados:POOL (a Ceph RADOS pool: the shared "
          "durable tier, see --ceph_conf) or memory: (nothing survives the "
          "process: tests and demos).");
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
          "stops writing and reopens once this much is free. -1: what the "
          "memtables hold plus 64 MiB (304 MiB with the defaults); 0: no "
          "guard.");
ABSL_FLAG(int32_t, rocksdb_write_buffer_mib, 64,
          "RocksDB memtable size per payload column family (frames, layer "
          "records, block records), MiB (RAM held before a flush to disk; "
          "the other families use at most 16).");
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
          "Bytes a stream may retain: payload (frames appended and not "
          "evicted, full precision) and the RAM its kept blocks' signals "
          "hold (scene means, track presences); 0: no limit.");
ABSL_FLAG(uint64_t, max_tenant_bytes, 0,
          "Bytes (as --max_stream_bytes counts them) a tenant's streams may "
          "retain together; 0: no limit.");
ABSL_FLAG(uint64_t, max_total_bytes, 0,
          "Bytes (as --max_stream_bytes counts them) all streams may retain "
          "together; 0: no limit. With "
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
ABSL_FLAG(uint64_t, max_queued_response_bytes, 1ull << 30,
          "Bytes of Session responses computed and not yet written, for "
          "clients that read slowly or not at all; 0: no limit. Each Session "
          "holds at most 64 responses or 16 MiB (plus one) and stops reading "
          "requests past them; a Session holding responses also stops while "
          "its tenant's pass its equal share of this.");
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
ABSL_FLAG(uint64_t, shm_max_total_bytes, 4ull << 30,
          "Shared-memory delivery (over --unix_socket): all arenas together "
          "at most this; 0 turns it off.");
ABSL_FLAG(uint64_t, shm_max_arena_bytes, 1ull << 30,
          "The largest shared-memory arena one client may attach.");
ABSL_FLAG(uint32_t, shm_max_arenas_per_tenant, 64,
          "Shared-memory arenas one tenant may hold at once (attached or "
          "waiting for their hand-off; each holds a descriptor).");
ABSL_FLAG(uint32_t, shm_lease_ms, 30000,
          "A shared-memory lease not released by then may be reclaimed (its "
          "bytes overwritten by a later delivery).");
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
ABSL_FLAG(std::string, huge_pages, "auto",
          "on: back the heap with transparent huge pages where the kernel "
          "offers them (its mode always or madvise): the server starts "
          "itself again with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 unless "
          "that tunable is set already (a recovery's engine open ~2.5x "
          "faster; 7B recall + delivery measured ~1-2 ms slower). off: no. "
          "auto (the "
          "default): on with a shared store (--store=rados:...), where "
          "takeover time matters, else off.");
ABSL_FLAG(std::string, cold_form, "auto",
          "What a block keeps on disk once it leaves RAM. frames: its frames "
          "as appended (every byte written once; a cold read reads whole "
          "frames). layers: its KV rewritten per layer (a read of a few "
          "layers reads only those; appended bytes written twice). auto "
          "(the default): frames.");
ABSL_FLAG(bool, frame_parts, true,
          "New streams store each frame in parts of consecutive tokens (a "
          "part per token at 7B), so a cold read of a few tokens reads "
          "their parts, not whole frames; a stream keeps the form it was "
          "created with.");
ABSL_FLAG(uint32_t, rebuild_kept_per_sealed, 8,
          "A stream's index rebuild (tier_policy.rebuild_every_blocks / "
          "_seconds) runs no sooner than 1/N of its indexed blocks have "
          "sealed since the last, so its cost per sealed block stays at most "
          "N blocks' re-adds whatever a client sets; 0: no floor.");
ABSL_FLAG(bool, seal_after_ack, true,
          "An append that fills its block is acknowledged once the frame is "
          "durable; the block's seal (summaries, token codes, its record) "
          "follows in the background, or at the stream's next append. "
          "false: the append seals before its ack.");
ABSL_FLAG(bool, log_token_groups, false,
          "Write a sealed block's token groups (group summaries and token "
          "codes, ~13 MB of a 7B block's record) through RocksDB's "
          "write-ahead log. false (the default): the log keeps the record "
          "without them and they go to disk once, at the memtable's flush; "
          "after a crash that lost them recovery builds them again from the "
          "block's frames.");
ABSL_FLAG(int32_t, recall_threads, 1,
          "Threads one recall may use for its scan and token scoring: the "
          "calling thread plus helpers shared by all recalls (1: the caller "
          "alone; 0: the hardware threads, at most 4; at most 64). See "
          "docs/operating.md before raising it.");
ABSL_FLAG(int32_t, worker_threads, 0,
          "Threads for storage-bound work; 0 means 2 per core, at least 4.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the bound TCP port to this file once serving.");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warn, error or off.");

namespace {

// Writes port to path atomically (readers never see a partial file).
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

// The store's flags; INVALID_ARGUMENT naming the flag.
absl::Status StoreOptionsFromFlags(kvmem::RocksColdStoreOptions* o) {
  o->path = absl::GetFlag(FLAGS_data_dir);
  if (!kvmem::ParseWalSync(absl::GetFlag(FLAGS_wal_sync), &o->wal_sync)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--wal_sync is \"", absl::GetFlag(FLAGS_wal_sync),
                     "\"; must be commit, interval or off"));
  }
  const int32_t interval = absl::GetFlag(FLAGS_wal_sync_interval_ms);
  if (interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--wal_sync_interval_ms is ", interval, "; must be at least 1"));
  }
  o->wal_sync_interval_ms = static_cast<uint32_t>(interval);
  const int32_t write_mib = absl::GetFlag(FLAGS_rocksdb_write_buffer_mib);
  const int32_t cache_mib = absl::GetFlag(FLAGS_rocksdb_block_cache_mib);
  if (write_mib < 1 || write_mib > 4096 || cache_mib < 1 || cache_mib > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rocksdb_write_buffer_mib=", write_mib,
        " must be in [1, 4096] and --rocksdb_block_cache_mib=", cache_mib,
        " in [1, 65536]"));
  }
  o->write_buffer_bytes = static_cast<uint64_t>(write_mib) << 20;
  o->log_token_groups = absl::GetFlag(FLAGS_log_token_groups);
  o->block_cache_bytes = static_cast<uint64_t>(cache_mib) << 20;
  if (const int32_t reserve = absl::GetFlag(FLAGS_disk_reserve_mib);
      reserve >= 0) {
    o->reserve_bytes = static_cast<uint64_t>(reserve) << 20;
  } else if (reserve != -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--disk_reserve_mib is ", reserve, "; must be -1 (auto) or >= 0"));
  }
  return absl::OkStatus();
}

// API keys from --api_keys_file, else $KVMEM_API_KEYS.
absl::StatusOr<std::string> ApiKeysFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_api_keys_file);
  if (path.empty()) {
    const char* env = std::getenv("KVMEM_API_KEYS");
    return std::string(env != nullptr ? env : "");
  }
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api_keys_file ", path, " cannot be read"));
  }
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

absl::StatusOr<kvmem::ServerOptions> OptionsFromFlags(
    const kvmem::StreamConfig& stream_defaults) {
  kvmem::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  KVMEM_RETURN_IF_ERROR(StoreOptionsFromFlags(&o.store));
  o.store_spec = absl::GetFlag(FLAGS_store);  // Server::Start checks it.
  KVMEM_RETURN_IF_ERROR(kvmem::SharedTierOptionsFromFlags(&o));
  o.cold_form = absl::GetFlag(FLAGS_cold_form);
  if (o.cold_form != "auto" && o.cold_form != "frames" &&
      o.cold_form != "layers") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cold_form is \"", o.cold_form, "\"; use auto, frames or layers"));
  }
  const std::string recovery = absl::GetFlag(FLAGS_recovery);
  if (recovery != "salvage" && recovery != "strict") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recovery is \"", recovery, "\"; must be salvage or strict"));
  }
  o.store.strict_wal = recovery == "strict";
  o.engine.strict_recovery = recovery == "strict";
  o.engine.global_warm_budget_bytes =
      absl::GetFlag(FLAGS_global_warm_budget_bytes);
  o.engine.stream_defaults = stream_defaults;
  o.accelerator_profile = absl::GetFlag(FLAGS_accelerator_profile);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  o.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  const int32_t recall_threads = absl::GetFlag(FLAGS_recall_threads);
  if (recall_threads < 0 || recall_threads > kvmem::kMaxRecallThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recall_threads is ", recall_threads, "; must be in 0..",
                     kvmem::kMaxRecallThreads, " (0: the hardware threads)"));
  }
  o.engine.recall_threads = recall_threads;
  o.engine.frame_parts = absl::GetFlag(FLAGS_frame_parts);
  o.engine.seal_after_ack = absl::GetFlag(FLAGS_seal_after_ack);
  o.engine.rebuild_kept_per_sealed =
      absl::GetFlag(FLAGS_rebuild_kept_per_sealed);
  KVMEM_ASSIGN_OR_RETURN(o.api_keys, ApiKeysFromFlags());
  o.limits.max_streams_per_tenant = absl::GetFlag(FLAGS_max_streams_per_tenant);
  o.limits.max_stream_bytes = absl::GetFlag(FLAGS_max_stream_bytes);
  o.limits.max_tenant_bytes = absl::GetFlag(FLAGS_max_tenant_bytes);
  o.limits.max_total_bytes = absl::GetFlag(FLAGS_max_total_bytes);
  o.limits.max_calls_in_flight = absl::GetFlag(FLAGS_max_calls_in_flight);
  o.limits.max_frame_bytes_in_flight =
      absl::GetFlag(FLAGS_max_frame_bytes_in_flight);
  o.limits.max_queued_response_bytes =
      absl::GetFlag(FLAGS_max_queued_response_bytes);
  o.instance_name = absl::GetFlag(FLAGS_instance_name);
  o.metrics_max_streams = absl::GetFlag(FLAGS_metrics_max_streams);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  o.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  o.shm.max_total_bytes = absl::GetFlag(FLAGS_shm_max_total_bytes);
  o.shm.max_arena_bytes = absl::GetFlag(FLAGS_shm_max_arena_bytes);
  o.shm.max_arenas_per_tenant = absl::GetFlag(FLAGS_shm_max_arenas_per_tenant);
  o.shm.lease = std::chrono::milliseconds(absl::GetFlag(FLAGS_shm_lease_ms));
  return o;
}

// What StartWithHugePages found (main), logged once logging is set up.
std::string heap_pages_note;

// The files a start reads (each --flagfile, --config): a server started
// again for huge pages reads them a second time.
std::vector<std::string> FilesReadAtStart(int argc, char** argv) {
  std::vector<std::string> files;
  for (const std::string& v :
       kvmem::FlagValuesFromArgs(argc, argv, "flagfile")) {
    for (absl::string_view f : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      files.emplace_back(f);
    }
  }
  const std::string config = kvmem::ConfigPathFromArgs(argc, argv);
  if (!config.empty()) files.push_back(config);
  return files;
}

// Serves until SIGINT or SIGTERM. Exit status: 2 for a bad flag, 1 when the
// server cannot start, 0 after an orderly stop.
int Run(const kvmem::StreamConfig& stream_defaults) {
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  if (!heap_pages_note.empty()) spdlog::info("{}", heap_pages_note);
  if (absl::GetFlag(FLAGS_tune_malloc)) {
    // Frames are hundreds of KiB: above glibc's default mmap threshold each
    // one would be mmapped and unmapped (page faults and zeroing per frame).
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
  absl::StatusOr<kvmem::ServerOptions> options =
      OptionsFromFlags(stream_defaults);
  if (!options.ok()) {
    spdlog::error("{}", std::string(options.status().message()));
    return 2;
  }
  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  absl::StatusOr<std::unique_ptr<kvmem::Server>> server =
      kvmem::Server::Start(*std::move(options));
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return absl::IsInvalidArgument(server.status()) ? 2 : 1;
  }
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    WritePortFile(absl::GetFlag(FLAGS_metrics_port_file),
                  (*server)->metrics_port());
  }
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->tcp_port());
  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("signal {}: draining calls", sig);
  (*server)->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(10));
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
  const std::string huge = absl::GetFlag(FLAGS_huge_pages);
  if (huge != "auto" && huge != "on" && huge != "off") {
    std::fprintf(stderr,
                 "kvmem-server: --huge_pages is \"%s\"; use auto, on or off\n",
                 huge.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_print_config)) {
    std::fputs(kvmem::EffectiveConfigToml(stream_defaults).c_str(), stdout);
    return 0;
  }
  if (huge == "on" ||
      (huge == "auto" &&
       absl::StartsWith(absl::GetFlag(FLAGS_store), "rados:"))) {
    // Returns only when it did not start the server again.
    heap_pages_note =
        kvmem::StartWithHugePages(argv, FilesReadAtStart(argc, cargs.data()));
  }
  return Run(stream_defaults);
}
