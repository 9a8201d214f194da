// Server (server/server.h) started in process: options -> Start, a real
// gRPC client over its unix socket and TCP port, Shutdown, and a restart
// over the same store that finds the stream again.
#include "server/server.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "kvmem/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

ServerOptions TestOptions(const std::string& dir) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.unix_socket = dir + "/kvmem.sock";
  o.store.path = dir + "/db";
  o.store.write_buffer_bytes = 4 << 20;
  o.store.block_cache_bytes = 8 << 20;
  o.worker_threads = 2;
  return o;
}

v1::OpenStreamRequest OpenRequest(const std::string& id) {
  v1::OpenStreamRequest req;
  req.set_stream_id(id);
  v1::StreamGeometry* g = req.mutable_config()->mutable_geometry();
  g->set_layers(2);
  g->set_kv_heads(2);
  g->set_head_dim(16);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(8);
  req.mutable_config()->set_hot_window_tokens(64);
  return req;
}

TEST(ServerTest, StartsServesShutsDownAndRecoversInProcess) {
  testing::TempDir dir;
  const ServerOptions options = TestOptions(dir.path());
  {
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_GT((*server)->tcp_port(), 0);
    // Over the unix socket: open a stream.
    auto unix_stub = v1::KvMemory::NewStub(grpc::CreateChannel(
        "unix:" + options.unix_socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::OpenStreamResponse opened;
    grpc::Status s = unix_stub->OpenStream(&ctx, OpenRequest("cam-1"), &opened);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(opened.created());
    // Over TCP, at the port the server picked: the same engine.
    auto tcp_stub = v1::KvMemory::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string((*server)->tcp_port()),
        grpc::InsecureChannelCredentials()));
    grpc::ClientContext list_ctx;
    v1::ListStreamsResponse listed;
    s = tcp_stub->ListStreams(&list_ctx, v1::ListStreamsRequest(), &listed);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(listed.streams_size(), 1);
    EXPECT_EQ(listed.streams(0).stream_id(), "cam-1");
    (*server)->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
    // Shut down: the socket is gone and calls fail.
    EXPECT_FALSE(std::ifstream(options.unix_socket).good());
    (*server)->Shutdown(std::chrono::system_clock::now());  // Idempotent.
  }
  // A second server over the same store recovers the stream.
  auto again = Server::Start(options);
  ASSERT_TRUE(again.ok()) << again.status();
  auto stats = (*again)->engine().GetStats("cam-1");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->stream_id, "cam-1");
}

TEST(ServerTest, OptionsOutOfRangeAreInvalidArgumentNamingTheFlag) {
  testing::TempDir dir;
  ServerOptions none = TestOptions(dir.path());
  none.listen.clear();
  none.unix_socket.clear();
  auto s = Server::Start(none);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--unix_socket"), std::string::npos)
      << s.status();

  ServerOptions chunk = TestOptions(dir.path());
  chunk.max_chunk_bytes = chunk.max_message_bytes;
  s = Server::Start(chunk);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--max_chunk_bytes"), std::string::npos)
      << s.status();

  ServerOptions keys = TestOptions(dir.path());
  keys.api_keys = "not a key line";
  s = Server::Start(keys);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
      << s.status();

  ServerOptions profile = TestOptions(dir.path());
  profile.accelerator_profile = dir.path() + "/missing.toml";
  s = Server::Start(profile);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--accelerator_profile"),
            std::string::npos)
      << s.status();
}

// --store picks the cold store through storage/store_factory.h: memory:
// serves without touching the data dir; an unknown scheme is refused
// before anything starts, naming the flag.
TEST(ServerTest, TheStoreFlagPicksTheStore) {
  testing::TempDir dir;
  ServerOptions memory = TestOptions(dir.path());
  memory.store_spec = "memory:";
  {
    auto server = Server::Start(memory);
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = v1::KvMemory::NewStub(grpc::CreateChannel(
        "unix:" + memory.unix_socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::OpenStreamResponse opened;
    grpc::Status s = stub->OpenStream(&ctx, OpenRequest("cam-1"), &opened);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(opened.created());
    (*server)->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
  }
  EXPECT_FALSE(std::filesystem::exists(memory.store.path));
  ServerOptions rocks = TestOptions(dir.path());
  rocks.store_spec = "rocksdb:" + dir.path() + "/other";
  {
    auto server = Server::Start(rocks);
    ASSERT_TRUE(server.ok()) << server.status();
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/other"));
  ServerOptions unknown = TestOptions(dir.path());
  unknown.store_spec = "s3:bucket";
  auto s = Server::Start(unknown);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--store: "), std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("rocksdb:DIR, rados:POOL or memory:"),
            std::string::npos)
      << s.status();
  // rados: with a cluster configuration that cannot be read is refused at
  // once, naming the file (tests/distributed/ runs it on a real cluster).
  ServerOptions rados = TestOptions(dir.path());
  rados.store_spec = "rados:kvmem";
  rados.rados.ceph_conf = dir.path() + "/no-such-ceph.conf";
  auto r = Server::Start(rados);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_NE(r.status().message().find("no-such-ceph.conf"), std::string::npos)
      << r.status();
  // A read cache goes in front of a shared store only: with a local one it
  // is refused at start, naming the flag and the store.
  for (const std::string& local : {std::string("memory:"), std::string()}) {
    ServerOptions cached = TestOptions(dir.path());
    cached.store_spec = local;
    cached.store_cache.path = dir.path() + "/cache";
    auto c = Server::Start(cached);
    ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
        << c.status();
    EXPECT_NE(c.status().message().find("--store_cache="), std::string::npos)
        << c.status();
    EXPECT_NE(c.status().message().find("is local"), std::string::npos)
        << c.status();
  }
}

TEST(ServerTest, AnAddressInUseFailsStartWithoutAServer) {
  testing::TempDir dir;
  auto first = Server::Start(TestOptions(dir.path()));
  ASSERT_TRUE(first.ok()) << first.status();
  testing::TempDir other;
  ServerOptions clash = TestOptions(other.path());
  clash.listen = "127.0.0.1:" + std::to_string((*first)->tcp_port());
  auto second = Server::Start(clash);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable)
      << second.status();
}

}  // namespace
}  // namespace kvmem
