// kvmem-server's config file: TOML [server] keys set flags,
// command-line flags override them, [stream_defaults] fill what OpenStream
// leaves zero, --print-config shows the effective result (and reads back to
// itself), and every mistake is an exit code 2 with the file, line and key.
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "client/cpp/kvmem_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ops/huge_pages.h"
#include "tests/test_util.h"
#include "tests/wire_fixture.h"
#include "tools/common/server_process.h"

namespace kvmem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct ServerRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr.
};

ServerRun RunServer(const std::string& args) {
  ServerRun r;
  const std::string cmd =
      std::string(KVMEM_SERVER_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class ConfigTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  // A server on its own data dir, socket and log under the test's dir,
  // named `name`, with one more flag.
  ServerProcessOptions Named(const std::string& name, const std::string& flag) {
    ServerProcessOptions o;
    o.binary = KVMEM_SERVER_BINARY;
    o.data_dir = dir_.path() + "/" + name;
    o.unix_socket = dir_.path() + "/" + name + ".sock";
    o.log_file = dir_.path() + "/" + name + ".log";
    o.extra_args = {flag};
    return o;
  }
  // The log of a server (Named) started with `flag` and stopped; empty
  // with a test failure when it did not start or stop cleanly.
  std::string StartupLog(const std::string& name, const std::string& flag) {
    const ServerProcessOptions o = Named(name, flag);
    ServerProcess server(o);
    std::string error;
    const bool started = server.Start(std::chrono::seconds(30), &error);
    EXPECT_TRUE(started) << error;
    if (!started) return "";
    EXPECT_EQ(server.Stop(), 0);
    std::ifstream log(o.log_file);
    return std::string(std::istreambuf_iterator<char>(log), {});
  }
  // A server started with `flags` on a socket and data dir of its own
  // (it is expected to refuse them).
  ServerRun RunRefused(const std::string& flags) {
    return RunServer(flags + " --listen= --unix_socket=" + dir_.path() +
                     "/bad.sock --data_dir=" + dir_.path() + "/bad");
  }
  testing::TempDir dir_;
};

TEST_F(ConfigTest, FileSetsFlagsAndCommandLineOverridesIt) {
  const std::string cfg = Write("kvmem.toml", R"(
# a comment
[server]
wal_sync = "commit"
max_streams_per_tenant = 7
tune_malloc = false
instance_name = "from-file"

[stream_defaults]
frames_per_block = 2
hot_window_tokens = 96
replacement = "lru"
cold_precision = "int8"
warm_budget_bytes = 1048576
)");
  ServerRun r = RunServer("--config=" + cfg + " --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\nwal_sync = \"commit\"\n"));
  EXPECT_THAT(r.output, HasSubstr("\nmax_streams_per_tenant = 7\n"));
  EXPECT_THAT(r.output, HasSubstr("\ntune_malloc = false\n"));
  EXPECT_THAT(r.output, HasSubstr("\nframes_per_block = 2\n"));
  EXPECT_THAT(r.output, HasSubstr("\nhot_window_tokens = 96\n"));
  EXPECT_THAT(r.output, HasSubstr("\nreplacement = \"lru\"\n"));
  EXPECT_THAT(r.output, HasSubstr("\ncold_precision = \"int8\"\n"));
  EXPECT_THAT(r.output, HasSubstr("\nwarm_budget_bytes = 1048576\n"));
  // Unset defaults appear as comments with the built-in value.
  EXPECT_THAT(r.output, HasSubstr("\n# index_factory = \"Progressive\"\n"));
  EXPECT_THAT(r.output, HasSubstr("\n# score = \"mass\"\n"));
  // Untouched flags keep their defaults.
  EXPECT_THAT(r.output, HasSubstr("\nlisten = \"127.0.0.1:50551\"\n"));

  // Flags win over the file, in either spelling and position.
  r = RunServer("--wal_sync=off --config " + cfg +
                " --max-streams-per-tenant=9 --print_config");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\nwal_sync = \"off\"\n"));
  EXPECT_THAT(r.output, HasSubstr("\nmax_streams_per_tenant = 9\n"));
  EXPECT_THAT(r.output, HasSubstr("\ninstance_name = \"from-file\"\n"));
}

TEST_F(ConfigTest, PrintedConfigReadsBackToItself) {
  ServerRun defaults = RunServer("--print-config");
  ASSERT_EQ(defaults.exit_code, 0) << defaults.output;
  const std::string cfg = Write("printed.toml", defaults.output);
  ServerRun again = RunServer("--config=" + cfg + " --print-config");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(again.output, defaults.output);

  const std::string custom = Write("custom.toml", R"([server]
data_dir = "/tmp/some dir/with \"quotes\"\tand a tab"
global_warm_budget_bytes = 12345
max_total_bytes = "18446744073709551615"
[stream_defaults]
index_factory = "HNSW16"
shot_similarity_threshold = 0.5
segment_mode = "shot"
)");
  ServerRun first = RunServer("--config=" + custom + " --print-config");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ServerRun second = RunServer("--config=" + Write("p2.toml", first.output) +
                               " --print-config");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.output, first.output);
  EXPECT_THAT(
      first.output,
      HasSubstr("data_dir = \"/tmp/some dir/with \\\"quotes\\\"\\u0009and "
                "a tab\""));
  EXPECT_THAT(first.output,
              HasSubstr("\nmax_total_bytes = \"18446744073709551615\"\n"));

  // --config only counts on the command line.
  const std::string flagfile = Write("flags", "--config=" + custom + "\n");
  ServerRun indirect = RunServer("--flagfile=" + flagfile + " --print-config");
  EXPECT_EQ(indirect.exit_code, 2) << indirect.output;
  EXPECT_THAT(indirect.output, HasSubstr("--config must be given on the "
                                         "command line"));
}

TEST_F(ConfigTest, MistakesNameFileLineAndKey) {
  struct Case {
    std::string toml, expect;
  };
  const std::vector<Case> cases = {
      {"[server]\nlisten = \"x:1\"\nno_such_flag = 1\n",
       ":3: [server] no_such_flag is not a kvmem-server flag"},
      {"[server]\nmax_streams_per_tenant = \"lots\"\n",
       ":2: [server] max_streams_per_tenant = lots: "},
      {"[server]\nlisten = [1, 2]\n",
       ":2: [server] listen must be a string, number or bool"},
      {"[serve]\nlisten = \"x\"\n", ":1: serve is not a section"},
      {"listen = \"x\"\n", ":1: listen is not a section"},
      {"[stream_defaults]\nframes_per_blok = 2\n",
       ":2: [stream_defaults] frames_per_blok is not a stream default; known: "
       "hot_window_tokens, frames_per_block"},
      {"[stream_defaults]\nframes_per_block = -1\n",
       ":2: [stream_defaults] frames_per_block is -1; must be an integer in "
       "[0, 4294967295]"},
      {"[stream_defaults]\nreplacement = \"fifo\"\n",
       ":2: [stream_defaults] replacement is fifo; must be \"lru\" or "
       "\"heat\""},
      {"[stream_defaults]\ncold_precision = \"int2\"\n",
       ":2: [stream_defaults] cold_precision is int2; must be \"full\", "
       "\"int8\" or \"int4\""},
      {"[stream_defaults]\nindex_factory = \"NoSuchIndex\"\n",
       "[stream_defaults]: config.index_policy.index_factory"},
      {"[server]\nlisten = \"unterminated\n", ":2:"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path =
        Write("bad" + std::to_string(i) + ".toml", cases[i].toml);
    ServerRun r = RunServer("--config=" + path + " --print-config");
    EXPECT_EQ(r.exit_code, 2) << cases[i].toml << r.output;
    EXPECT_THAT(r.output, HasSubstr(cases[i].expect)) << cases[i].toml;
    EXPECT_THAT(r.output, Not(HasSubstr("[server]\n")))
        << "printed a config despite the error";
  }
  ServerRun missing = RunServer("--config=" + dir_.path() + "/absent.toml");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("absent.toml cannot be read"));
}

// Reads /proc/PID/FILE whole.
std::string ProcFile(pid_t pid, const std::string& file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// --huge_pages=on: where the kernel offers transparent huge pages, the
// server starts itself again with glibc's tunable set, keeping its pid and
// its name; off, auto with a local store (the default), or where the kernel
// offers none, it does not.
TEST_F(ConfigTest, HugePagesStartTheServerAgainUnderItsOwnName) {
  const std::string mode = TransparentHugePageMode();
  const bool offered = mode == "always" || mode == "madvise";
  // The servers inherit this environment: none of glibc's tunables preset.
  const char* preset = getenv("GLIBC_TUNABLES");
  const bool had = preset != nullptr;
  const std::string kept = had ? preset : "";
  unsetenv("GLIBC_TUNABLES");
  for (const std::string value : {"on", "off", "auto"}) {
    SCOPED_TRACE("--huge_pages=" + value);
    const bool on = value == "on";
    const ServerProcessOptions o = Named(value, "--huge_pages=" + value);
    ServerProcess server(o);
    std::string error;
    ASSERT_TRUE(server.Start(std::chrono::seconds(30), &error)) << error;
    EXPECT_EQ(ProcFile(server.pid(), "comm"), "kvmem-server\n");
    std::string env = ProcFile(server.pid(), "environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    const bool set = env.find("GLIBC_TUNABLES=glibc.malloc.hugetlb=1\n") !=
                     std::string::npos;
    EXPECT_EQ(set, on && offered) << "transparent huge pages: " << mode;
    EXPECT_EQ(server.Stop(), 0);
    std::ifstream log(o.log_file);
    const std::string text(std::istreambuf_iterator<char>(log), {});
    if (on) {
      EXPECT_THAT(text, HasSubstr(offered ? "heap on transparent huge pages"
                                          : "heap on 4 KiB pages"));
    } else {
      EXPECT_THAT(text, Not(HasSubstr("heap on")));
    }
  }
  if (had) setenv("GLIBC_TUNABLES", kept.c_str(), 1);
  ServerRun bad = RunServer("--huge_pages=yes --print-config");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output,
              HasSubstr("--huge_pages is \"yes\"; use auto, on or off"));
}

// --cold_form: auto is frames (on every store); the log says which form
// the server keeps; a value it does not know stops it (exit 2) naming it.
TEST_F(ConfigTest, ColdFormIsLoggedAndCheckedAtStart) {
  for (const std::string value : {"auto", "frames", "layers"}) {
    SCOPED_TRACE("--cold_form=" + value);
    EXPECT_THAT(
        StartupLog("cold-" + value, "--cold_form=" + value),
        HasSubstr(absl::StrCat("cold blocks kept as ",
                               value == "layers" ? "layers" : "frames")));
  }
  ServerRun bad = RunRefused("--cold_form=sometimes");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("--cold_form is \"sometimes\"; use auto, "
                                    "frames or layers"));
}

// --recall_threads: the log says how many threads a recall uses; a count
// out of range stops the server (exit 2) naming it.
TEST_F(ConfigTest, RecallThreadsAreLoggedAndCheckedAtStart) {
  for (const std::string value : {"1", "3"}) {
    SCOPED_TRACE("--recall_threads=" + value);
    EXPECT_THAT(
        StartupLog("recall-threads-" + value, "--recall_threads=" + value),
        HasSubstr("recall threads " + value + ")"));
  }
  for (const std::string value : {"-1", "65"}) {
    ServerRun bad = RunRefused("--recall_threads=" + value);
    EXPECT_EQ(bad.exit_code, 2) << value;
    EXPECT_THAT(bad.output, HasSubstr("--recall_threads is " + value +
                                      "; must be in 0..64"));
  }
}

TEST_F(ConfigTest, StreamDefaultsApplyToStreamsThatLeaveFieldsZero) {
  const std::string cfg = Write("kvmem.toml", R"([server]
instance_name = "from-file"
[stream_defaults]
frames_per_block = 2
default_top_k = 3
)");
  ServerProcessOptions o;
  o.binary = KVMEM_SERVER_BINARY;
  o.data_dir = dir_.path() + "/data";
  o.unix_socket = dir_.path() + "/kvmem.sock";
  o.log_file = dir_.path() + "/server.log";
  o.extra_args = {"--config=" + cfg};
  ServerProcess server(o);
  std::string error;
  ASSERT_TRUE(server.Start(std::chrono::seconds(30), &error)) << error;
  auto client = KvmemClient::Connect(server.target());

  const testing::TestGeometry g;
  v1::StreamConfig zero = testing::WireConfig(g, 64, 0, {1});
  v1::StreamConfig own = testing::WireConfig(g, 64, 4, {1});
  v1::OpenStreamResponse a, b;
  ASSERT_TRUE(client->OpenStream("uses-defaults", zero, &a).ok());
  ASSERT_TRUE(client->OpenStream("sets-its-own", own, &b).ok());
  EXPECT_EQ(a.stats().config().block_policy().frames_per_block(), 2u);
  EXPECT_EQ(a.stats().config().recall_defaults().top_k(), 3u);
  EXPECT_EQ(b.stats().config().block_policy().frames_per_block(), 4u);
  // Reopening with the same (zero) config is the same stream.
  ASSERT_TRUE(client->OpenStream("uses-defaults", zero, &a).ok());
  EXPECT_FALSE(a.created());

  // [server] instance_name reaches every response's metadata.
  grpc::ClientContext ctx;
  v1::ListStreamsResponse list;
  ASSERT_TRUE(
      client->stub()->ListStreams(&ctx, v1::ListStreamsRequest(), &list).ok());
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find(kInstanceHeader);
  ASSERT_NE(it, md.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "from-file");
  client.reset();  // An idle channel would slow the graceful shutdown.
  EXPECT_EQ(server.Stop(), 0);

  // Restarted with other defaults: existing streams reopen with the zero
  // config and keep their settings; new streams get the new defaults.
  std::ofstream(cfg) << "[stream_defaults]\nframes_per_block = 3\n";
  ServerProcess again(o);
  ASSERT_TRUE(again.Start(std::chrono::seconds(30), &error)) << error;
  client = KvmemClient::Connect(again.target());
  grpc::Status st = client->OpenStream("uses-defaults", zero, &a);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(a.created());
  EXPECT_EQ(a.stats().config().block_policy().frames_per_block(), 2u);
  EXPECT_EQ(a.stats().config().recall_defaults().top_k(), 3u);
  ASSERT_TRUE(client->OpenStream("new-one", zero, &b).ok());
  EXPECT_EQ(b.stats().config().block_policy().frames_per_block(), 3u);
  // An explicit different value is still a different config.
  v1::StreamConfig other = testing::WireConfig(g, 64, 5, {1});
  EXPECT_EQ(client->OpenStream("uses-defaults", other, &a).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  client.reset();
  EXPECT_EQ(again.Stop(), 0);
}

}  // namespace
}  // namespace kvmem
