// The etcd calls stream ownership rests on (server/ownership/etcd_client.h),
// against a real etcd the test starts on loopback ports: a key created only
// when absent, under a lease, with its create revision as the fencing
// token; a lease kept alive keeps the key, an expired or revoked one frees
// it; tokens of later holders are larger; etcd restarted keeps leases and
// keys; a stopped etcd fails calls within their deadline.
#include "server/ownership/etcd_client.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/distributed/etcd_process.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::EtcdProcess::Installed()) {
      GTEST_SKIP() << KVMEM_ETCD
                   << " missing: run deploy/bootstrap.sh (installs "
                      "etcd-server)";
    }
    etcd_ = std::make_unique<testing::EtcdProcess>(dir_.path() + "/etcd");
    ASSERT_TRUE(etcd_->Start())
        << testing::ReadFile(dir_.path() + "/etcd/etcd.out");
    EtcdOptions o;
    o.endpoint = etcd_->endpoint();
    o.call_timeout = absl::Seconds(2);
    auto c = EtcdClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, TheFirstClaimWinsAndLaterTokensAreLarger) {
  auto a = client_->GrantLease(absl::Seconds(10));
  auto b = client_->GrantLease(absl::Seconds(10));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto first = client_->CreateIfAbsent("/kvmem/streams/cam", "server-a", *a);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->lease, *a);
  EXPECT_EQ(first->value, "server-a");
  EXPECT_GT(first->create_revision, 0);
  auto second = client_->CreateIfAbsent("/kvmem/streams/cam", "server-b", *b);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->lease, *a);  // Still a's: b learns who holds it.
  EXPECT_EQ(second->value, "server-a");
  EXPECT_EQ(second->create_revision, first->create_revision);
  // a hands over; b's claim then wins with a larger token.
  ASSERT_TRUE(client_->DeleteIfHeld("/kvmem/streams/cam", *b).ok());
  auto still = client_->Get("/kvmem/streams/cam");
  ASSERT_TRUE(still.ok() && still->has_value());  // Not b's to delete.
  ASSERT_TRUE(client_->DeleteIfHeld("/kvmem/streams/cam", *a).ok());
  auto taken = client_->CreateIfAbsent("/kvmem/streams/cam", "server-b", *b);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->lease, *b);
  EXPECT_GT(taken->create_revision, first->create_revision);
}

TEST_F(EtcdClientTest, AKeptLeaseHoldsAndAnExpiredOneFrees) {
  auto kept = client_->GrantLease(absl::Seconds(2));
  auto lapsed = client_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(kept.ok() && lapsed.ok());
  ASSERT_TRUE(client_->CreateIfAbsent("/k/kept", "x", *kept).ok());
  ASSERT_TRUE(client_->CreateIfAbsent("/k/lapsed", "x", *lapsed).ok());
  for (int i = 0; i < 8; ++i) {  // 4 s: twice the TTL.
    auto ttl = client_->KeepAlive(*kept);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, absl::Seconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  auto k = client_->Get("/k/kept");
  ASSERT_TRUE(k.ok());
  EXPECT_TRUE(k->has_value());
  auto l = client_->Get("/k/lapsed");
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->has_value());
  EXPECT_EQ(client_->KeepAlive(*lapsed).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(client_->RevokeLease(*kept).ok());
  k = client_->Get("/k/kept");
  ASSERT_TRUE(k.ok());
  EXPECT_FALSE(k->has_value());
}

// etcd restarted on its data keeps the holder (leases survive a restart
// with their TTL renewed); a stopped etcd fails calls within the deadline.
TEST_F(EtcdClientTest, ARestartKeepsHoldersAndADownEtcdFailsFast) {
  auto lease = client_->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok());
  auto held = client_->CreateIfAbsent("/k/cam", "a", *lease);
  ASSERT_TRUE(held.ok());
  etcd_->Stop();
  const auto t0 = std::chrono::steady_clock::now();
  auto down = client_->Get("/k/cam");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_FALSE(down.ok());
  EXPECT_TRUE(absl::IsUnavailable(down.status()) ||
              absl::IsDeadlineExceeded(down.status()))
      << down.status();
  EXPECT_LT(waited, 3.0);
  ASSERT_TRUE(etcd_->Start());
  auto after = client_->Get("/k/cam");
  for (int i = 0; i < 50 && !after.ok(); ++i) {  // The channel reconnects.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    after = client_->Get("/k/cam");
  }
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(after->has_value());
  EXPECT_EQ((*after)->create_revision, held->create_revision);
  EXPECT_TRUE(client_->KeepAlive(*lease).ok());
}

}  // namespace
}  // namespace kvmem
