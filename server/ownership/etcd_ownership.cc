#include "server/ownership/etcd_ownership.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/ownership/peer_probe.h"

namespace kvmem {

namespace {

SteadyClock::duration ToSteady(absl::Duration d) {
  return std::chrono::duration_cast<SteadyClock::duration>(
      absl::ToChronoNanoseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdOwnership>> EtcdOwnership::Start(
    const EtcdOwnershipOptions& options) {
  if (options.advertise.empty()) {
    return absl::InvalidArgumentError(
        "ownership through etcd needs this server's address as clients reach "
        "it (--advertise=host:port)");
  }
  if (options.ttl < absl::Seconds(2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ownership lease TTL ", absl::FormatDuration(options.ttl),
                     " is under 2 s"));
  }
  EtcdOwnershipOptions o = options;
  // A renewal must give up before the next is due.
  o.etcd.call_timeout = std::min(o.etcd.call_timeout, o.ttl / 3);
  KVMEM_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                         EtcdClient::Connect(o.etcd));
  std::unique_ptr<EtcdOwnership> own(new EtcdOwnership(o, std::move(etcd)));
  const SteadyClock::time_point t0 = SteadyClock::now();
  absl::StatusOr<int64_t> lease = own->etcd_->GrantLease(o.ttl);
  if (!lease.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot grant the ownership lease: ", lease.status().message()));
  }
  {
    kvmem::MutexLock lock(&own->mu_);
    own->lease_ = *lease;
    own->valid_until_ = t0 + ToSteady(o.ttl);
  }
  own->renewer_ = std::thread([o = own.get()] { o->RenewLoop(); });
  return own;
}

EtcdOwnership::EtcdOwnership(const EtcdOwnershipOptions& options,
                             std::unique_ptr<EtcdClient> etcd)
    : options_(options), etcd_(std::move(etcd)) {}

EtcdOwnership::~EtcdOwnership() {
  int64_t lease = 0;
  {
    kvmem::MutexLock lock(&mu_);
    stopping_ = true;
    lease = lease_;
  }
  if (renewer_.joinable()) renewer_.join();
  // Hands every stream over now rather than after the TTL.
  if (lease != 0) etcd_->RevokeLease(lease).IgnoreError();
}

std::string EtcdOwnership::Key(const std::string& id) const {
  return absl::StrCat(options_.key_prefix, "streams/", id);
}

int64_t EtcdOwnership::lease() const {
  kvmem::MutexLock lock(&mu_);
  return lease_;
}

absl::Duration EtcdOwnership::Margin() const {
  return std::max(options_.ttl / 6, absl::Milliseconds(500));
}

void EtcdOwnership::RenewLoop() {
  kvmem::MutexLock lock(&mu_);
  while (!stopping_) {
    // Every ttl/3; every second while renewals fail.
    const absl::Duration wait =
        failing_ ? std::min(options_.ttl / 3, absl::Seconds(1))
                 : options_.ttl / 3;
    mu_.AwaitWithTimeout(kvmem::Condition(&stopping_), wait);
    if (stopping_) break;
    mu_.Unlock();
    RenewOnce();
    mu_.Lock();
  }
}

void EtcdOwnership::RenewOnce() {
  const int64_t lease = this->lease();
  SteadyClock::time_point t0 = SteadyClock::now();
  absl::StatusOr<absl::Duration> ttl =
      lease != 0 ? etcd_->KeepAlive(lease)
                 : absl::StatusOr<absl::Duration>(absl::NotFoundError("none"));
  if (ttl.ok()) {
    bool was_failing;
    {
      kvmem::MutexLock lock(&mu_);
      valid_until_ = t0 + ToSteady(*ttl);
      was_failing = failing_;
      failing_ = false;
      lost_ = false;
    }
    if (was_failing && options_.warn) {
      options_.warn(absl::StrCat("ownership lease ", lease, " renewed again"));
    }
    return;
  }
  if (ttl.status().code() == absl::StatusCode::kNotFound) {
    // Gone in etcd: every key it held is gone with it. Told even when the
    // lapse was told already: streams may have been taken up since.
    Lose(absl::UnavailableError(absl::StrCat(
             "this server's ownership lease ", lease,
             " expired in etcd; its streams are taken up again on demand")),
         /*again=*/true);
    t0 = SteadyClock::now();
    absl::StatusOr<int64_t> fresh = etcd_->GrantLease(options_.ttl);
    kvmem::MutexLock lock(&mu_);
    if (fresh.ok()) {
      lease_ = *fresh;
      valid_until_ = t0 + ToSteady(options_.ttl);
      lost_ = false;
      failing_ = false;
      return;
    }
    lease_ = 0;
    failing_ = true;
    return;
  }
  bool tell;
  SteadyClock::time_point until;
  {
    kvmem::MutexLock lock(&mu_);
    tell = !failing_;
    failing_ = true;
    until = valid_until_;
  }
  if (tell && options_.warn) {
    options_.warn(absl::StrCat("ownership lease ", lease,
                               " not renewed: ", ttl.status().message()));
  }
  if (SteadyClock::now() + ToSteady(Margin()) >= until) {
    Lose(absl::UnavailableError(absl::StrCat(
        "this server could not renew its ownership lease in etcd (",
        ttl.status().message(),
        ") and stopped serving its streams before the lease could expire")));
  }
}

void EtcdOwnership::Lose(const absl::Status& why, bool again) {
  {
    kvmem::MutexLock lock(&mu_);
    if (lost_ && !again) return;
    lost_ = true;
  }
  if (options_.warn) options_.warn(std::string(why.message()));
  kvmem::MutexLock lock(&lost_mu_);
  if (on_lost_) on_lost_(why);
}

void EtcdOwnership::OnLost(std::function<void(const absl::Status&)> fn) {
  kvmem::MutexLock lock(&lost_mu_);
  on_lost_ = std::move(fn);
}

absl::Status EtcdOwnership::CheckServing() {
  kvmem::MutexLock lock(&mu_);
  if (lost_ || lease_ == 0) {
    return absl::UnavailableError(
        "this server's stream ownership (etcd lease) lapsed; it serves "
        "streams again once etcd renews it");
  }
  if (SteadyClock::now() + ToSteady(Margin()) >= valid_until_) {
    return absl::UnavailableError(
        "this server's stream ownership (etcd lease) was not renewed in "
        "time; it stops serving before the lease can expire");
  }
  return absl::OkStatus();
}

absl::StatusOr<EtcdHolder> EtcdOwnership::Claim(const std::string& id,
                                                int64_t lease) {
  absl::StatusOr<EtcdHolder> h =
      etcd_->CreateIfAbsent(Key(id), options_.advertise, lease);
  if (!h.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot take ownership of stream \"", id,
                     "\" in etcd: ", h.status().message()));
  }
  return h;
}

bool EtcdOwnership::OwnerGone(const std::string& address) {
  if (options_.probe_timeout <= absl::ZeroDuration()) return false;
  // Another host's loopback is only seen from that host.
  if (IsHostLocalAddress(address) && !IsHostLocalAddress(options_.advertise)) {
    return false;
  }
  const SteadyClock::time_point now = SteadyClock::now();
  {
    kvmem::MutexLock lock(&probe_mu_);
    auto it = probed_.find(address);
    if (it != probed_.end() && now < it->second) return false;
  }
  const PeerState state = ProbePeer(address, options_.probe_timeout);
  if (state == PeerState::kRefused) return true;
  kvmem::MutexLock lock(&probe_mu_);
  if (probed_.size() >= 1024) probed_.clear();  // Owners are few.
  probed_[address] = SteadyClock::now() + std::chrono::milliseconds(250);
  return false;
}

absl::StatusOr<uint64_t> EtcdOwnership::Acquire(const std::string& id) {
  KVMEM_RETURN_IF_ERROR(CheckServing());
  const int64_t lease = this->lease();
  KVMEM_ASSIGN_OR_RETURN(EtcdHolder h, Claim(id, lease));
  if (h.lease != lease && h.value != options_.advertise && OwnerGone(h.value)) {
    // Its lease goes, and with it every stream the dead server held.
    const absl::Status revoked = etcd_->RevokeLease(h.lease);
    if (!revoked.ok() && !absl::IsNotFound(revoked)) {
      return absl::UnavailableError(
          absl::StrCat("stream \"", id, "\": its owner at ", h.value,
                       " refuses connections, and its etcd lease ", h.lease,
                       " could not be revoked: ", revoked.message()));
    }
    if (options_.warn) {
      options_.warn(
          absl::StrCat("stream \"", id, "\": its owner at ", h.value,
                       " refuses connections (gone); revoked its etcd lease ",
                       h.lease, ", which frees every stream it held"));
    }
    KVMEM_ASSIGN_OR_RETURN(h, Claim(id, lease));
  }
  if (h.lease == lease) return static_cast<uint64_t>(h.create_revision);
  if (h.value == options_.advertise) {
    return absl::UnavailableError(absl::StrCat(
        "stream \"", id, "\" is held by an earlier instance of this server (",
        options_.advertise, ", etcd lease ", h.lease,
        ") until that lease expires (at most ",
        absl::FormatDuration(options_.ttl), ")"));
  }
  return WithOwner(
      absl::UnavailableError(absl::StrCat(
          "stream \"", id, "\" is owned by the kvmem-server at ", h.value)),
      h.value);
}

void EtcdOwnership::Release(const std::string& id) {
  const absl::Status st = etcd_->DeleteIfHeld(Key(id), lease());
  if (!st.ok() && options_.warn) {
    options_.warn(absl::StrCat("stream \"", id,
                               "\": ownership key not released (it lapses "
                               "with the lease): ",
                               st.message()));
  }
}

absl::Status EtcdOwnership::Moved(const std::string& id,
                                  const absl::Status& cause) {
  absl::StatusOr<std::optional<EtcdHolder>> h = etcd_->Get(Key(id));
  if (h.ok() && h->has_value() && (*h)->value != options_.advertise) {
    return WithOwner(
        absl::UnavailableError(absl::StrCat(
            "stream \"", id, "\" was taken over by the kvmem-server at ",
            (*h)->value, " (", cause.message(), ")")),
        (*h)->value);
  }
  return absl::UnavailableError(
      absl::StrCat("stream \"", id, "\" was taken over by another server (",
                   cause.message(), ")"));
}

}  // namespace kvmem
