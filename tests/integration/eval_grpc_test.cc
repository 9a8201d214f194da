// kvmem eval through a real kvmem-server (unix socket, Session per stream)
// gives the same kvmem recall sets and scores as the in-process engine.
#include <chrono>
#include <memory>

#include "gtest/gtest.h"
#include "tests/eval_fixture.h"
#include "tests/test_util.h"
#include "tools/common/server_process.h"

namespace kvmem {
namespace {

TEST(EvalGrpcTest, GrpcPathGivesTheInProcessRecallSets) {
  testing::TempDir dir;
  EvalOptions o = testing::SmallEval();
  o.record_kvmem_sets = true;
  auto local = RunEval(o);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->kvmem_path, "in-process");

  ServerProcessOptions so;
  so.binary = KVMEM_SERVER_BINARY;
  so.data_dir = dir.path() + "/data";
  so.unix_socket = dir.path() + "/kvmem.sock";
  so.log_file = dir.path() + "/server.log";
  ServerProcess server(so);
  std::string error;
  ASSERT_TRUE(server.Start(std::chrono::seconds(30), &error)) << error;
  o.server = server.target();
  auto remote = RunEval(o);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->kvmem_path, server.target());

  ASSERT_EQ(local->kvmem_sets.size(), remote->kvmem_sets.size());
  ASSERT_GT(local->kvmem_sets.size(), 200u);
  size_t nonempty = 0;
  for (size_t i = 0; i < local->kvmem_sets.size(); ++i) {
    const auto& a = local->kvmem_sets[i];
    const auto& b = remote->kvmem_sets[i];
    ASSERT_EQ(a.size(), b.size()) << "query " << i;
    for (size_t j = 0; j < a.size(); ++j) {
      EXPECT_EQ(a[j].begin, b[j].begin) << "query " << i;
      EXPECT_EQ(a[j].end, b[j].end) << "query " << i;
    }
    nonempty += !a.empty();
  }
  EXPECT_GT(nonempty, 100u);  // Recall had something to return.
  const PolicySummary& x = testing::PolicyOf(*local, "kvmem");
  const PolicySummary& y = testing::PolicyOf(*remote, "kvmem");
  EXPECT_EQ(x.cold_mass_recalled, y.cold_mass_recalled);
  EXPECT_EQ(x.reid_success, y.reid_success);
  // The identity channel's tokens travel with each answer (the frame
  // queries carry detections: tracks as well as the query as a whole).
  EXPECT_EQ(x.query_tokens_mean, y.query_tokens_mean);
  EXPECT_EQ(x.track_tokens_mean, y.track_tokens_mean);
  EXPECT_GT(x.query_tokens_mean, 0);
  EXPECT_GT(x.track_tokens_mean, 0);
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace kvmem
