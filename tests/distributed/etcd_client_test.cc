// The etcd calls stream ownership rests on (server/ownership/etcd_client.h),
// against a real etcd the test starts on loopback ports: a key created only
// when absent, under a lease, with its create revision as the fencing
// token; a lease kept alive keeps the key, an expired or revoked one frees
// it; tokens of later holders are larger; etcd restarted keeps leases and
// keys; a stopped etcd fails calls within their deadline. And against a
// cluster of three members: calls move on from a member that died, a
// server's ownership lease outlives the member it renewed through, and a
// cluster without a quorum fails calls within their deadline.
#include "server/ownership/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/ownership/etcd_ownership.h"
#include "tests/distributed/etcd_process.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A call that could not reach etcd (down, or no answer in time).
bool Unreached(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::EtcdProcess::Installed()) {
      GTEST_SKIP() << testing::EtcdProcess::Missing();
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
  const auto t0 = Clock::now();
  auto down = client_->Get("/k/cam");
  const double waited = SecondsSince(t0);
  EXPECT_FALSE(down.ok());
  EXPECT_TRUE(Unreached(down.status())) << down.status();
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

TEST(EtcdMembersTest, ListsMembersAndRefusesBadLists) {
  auto one = EtcdMembers("127.0.0.1:2379");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, std::vector<std::string>{"127.0.0.1:2379"});
  auto three = EtcdMembers("a:1, b:2,c:3 ");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(*three, (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  std::string many;
  for (size_t i = 0; i <= kMaxEtcdMembers; ++i) {
    absl::StrAppend(&many, i > 0 ? "," : "", "h:", 2000 + i);
  }
  for (const std::string& bad :
       {std::string(""), std::string("a:1,,b:2"), std::string("a:1,"),
        std::string("a:1,a:1"), many}) {
    auto m = EtcdMembers(bad);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EtcdOptions o;
    o.endpoint = bad;
    EXPECT_EQ(EtcdClient::Connect(o).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_NE(EtcdMembers("a:1,a:1").status().message().find("a:1 twice"),
            std::string::npos);
}

// Three members on loopback, started together.
class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::EtcdProcess::Installed()) {
      GTEST_SKIP() << testing::EtcdProcess::Missing();
    }
    std::string cluster;
    for (int i = 0; i < 3; ++i) {
      const std::string name = absl::StrCat("m", i);
      members_.push_back(std::make_unique<testing::EtcdProcess>(
          dir_.path() + "/" + name, name));
      absl::StrAppend(&cluster, i > 0 ? "," : "", members_.back()->peer());
    }
    for (auto& m : members_) m->Launch(cluster);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(members_[i]->WaitReady())
          << testing::ReadFile(absl::StrCat(dir_.path(), "/m", i, "/etcd.out"));
    }
  }

  // The member that is etcd's leader (asked of each member), -1 if none
  // says so.
  int Leader() const {
    for (int i = 0; i < 3; ++i) {
      auto stub = etcdserverpb::Maintenance::NewStub(grpc::CreateChannel(
          members_[i]->endpoint(), grpc::InsecureChannelCredentials()));
      etcdserverpb::StatusRequest req;
      etcdserverpb::StatusResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(2));
      if (stub->Status(&ctx, req, &resp).ok() &&
          resp.leader() == resp.header().member_id()) {
        return i;
      }
    }
    return -1;
  }

  // The members' endpoints, in the order given, comma-separated.
  std::string Endpoints(std::vector<int> order) const {
    std::string out;
    for (int i : order) {
      absl::StrAppend(&out, out.empty() ? "" : ",", members_[i]->endpoint());
    }
    return out;
  }

  std::unique_ptr<EtcdClient> Client(const std::string& endpoints) {
    EtcdOptions o;
    o.endpoint = endpoints;
    o.call_timeout = absl::Seconds(2);
    auto c = EtcdClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  testing::TempDir dir_;
  std::vector<std::unique_ptr<testing::EtcdProcess>> members_;
};

// The member killed is the leader, listed first: the hardest case (the
// client's member dies and the others elect a new leader meanwhile).
TEST_F(EtcdClusterTest, CallsMoveOnFromAMemberThatDied) {
  const int lead = Leader();
  ASSERT_GE(lead, 0);
  const int b = (lead + 1) % 3, c = (lead + 2) % 3;
  std::unique_ptr<EtcdClient> client = Client(Endpoints({lead, b, c}));
  ASSERT_NE(client, nullptr);
  auto lease = client->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto held = client->CreateIfAbsent("/k/cam", "a", *lease);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(client->member(), members_[lead]->endpoint());
  members_[lead]->Kill();
  // The renewal goes to the members left once they have a leader again:
  // until then each answers "no leader" at once (retried here as the
  // server's renewer does, every second at most).
  const auto t0 = Clock::now();
  absl::StatusOr<absl::Duration> ttl = client->KeepAlive(*lease);
  while (!ttl.ok() && Unreached(ttl.status()) && SecondsSince(t0) < 15) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    ttl = client->KeepAlive(*lease);
  }
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  std::printf("renewed %.2f s after the leader died\n", SecondsSince(t0));
  EXPECT_NE(client->member(), members_[lead]->endpoint());
  auto got = client->Get("/k/cam");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ((*got)->lease, *lease);
  EXPECT_EQ((*got)->create_revision, held->create_revision);
  auto rival_lease = client->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(rival_lease.ok()) << rival_lease.status();
  auto rival = client->CreateIfAbsent("/k/cam", "b", *rival_lease);
  ASSERT_TRUE(rival.ok()) << rival.status();
  EXPECT_EQ(rival->lease, *lease);  // Still the first holding's.
  // A client whose first member is the dead one gets its answers too.
  std::unique_ptr<EtcdClient> late = Client(Endpoints({lead, c, b}));
  ASSERT_NE(late, nullptr);
  auto seen = late->Get("/k/cam");
  ASSERT_TRUE(seen.ok() && seen->has_value()) << seen.status();
  EXPECT_EQ((*seen)->create_revision, held->create_revision);
  EXPECT_EQ(late->member(), members_[c]->endpoint());
  // Without a quorum a write fails within its deadlines, naming the call.
  // (A renewal may still be answered for a moment by a leader that has
  // not yet noticed it lost its quorum: etcd's lease semantics.)
  members_[b]->Kill();
  const auto t1 = Clock::now();
  auto lost = client->CreateIfAbsent("/k/other", "a", *lease);
  const double waited = SecondsSince(t1);
  EXPECT_FALSE(lost.ok());
  EXPECT_TRUE(Unreached(lost.status())) << lost.status();
  EXPECT_NE(lost.status().message().find("Txn"), std::string::npos)
      << lost.status();
  EXPECT_LT(waited, 3 * 2.0 + 1);  // At most one deadline per member.
}

// A server's ownership (EtcdOwnership, the default TTL) renews through
// whichever member answers: its lease, and the streams it holds, outlive the
// member it renewed through, even when that member was the leader (the
// others elect a new one meanwhile), without a lapse; another server still
// finds them held.
TEST_F(EtcdClusterTest, AnOwnershipOutlivesItsMember) {
  const int lead = Leader();
  ASSERT_GE(lead, 0);
  const int next = (lead + 1) % 3, last = (lead + 2) % 3;
  EtcdOwnershipOptions o;
  o.etcd.endpoint = Endpoints({lead, next, last});
  o.advertise = "server-a:1";
  auto a = EtcdOwnership::Start(o);
  ASSERT_TRUE(a.ok()) << a.status();
  std::atomic<int> lapses{0};
  (*a)->OnLost([&](const absl::Status&) { ++lapses; });
  auto token = (*a)->Acquire("cam");
  ASSERT_TRUE(token.ok()) << token.status();
  members_[lead]->Kill();
  // Two TTLs: the lease would have lapsed without renewals.
  std::this_thread::sleep_for(absl::ToChronoSeconds(2 * o.ttl));
  EXPECT_EQ(lapses.load(), 0);
  EXPECT_TRUE((*a)->CheckServing().ok()) << (*a)->CheckServing();
  auto again = (*a)->Acquire("cam");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *token);  // The same holding, not a new one.
  EtcdOwnershipOptions ob = o;
  ob.etcd.endpoint = Endpoints({last, next});
  ob.advertise = "server-b:1";
  auto b = EtcdOwnership::Start(ob);
  ASSERT_TRUE(b.ok()) << b.status();
  auto refused = (*b)->Acquire("cam");
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_EQ(OwnerOf(refused.status()),
            std::optional<std::string>("server-a:1"));
}

}  // namespace
}  // namespace kvmem
