#include "storage/rados_cold_store.h"

#include <cerrno>
#include <map>
#include <rados/librados.hpp>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "storage/layer_trailer.h"
#include "storage/rados_io.h"
#include "storage/rados_store_impl.h"
#include "storage/rocks_keys.h"

namespace kvmem::rados_store {
namespace {

using rados_io::AioBatch;
using rados_io::FromRc;
using rados_io::ScanOmap;

}  // namespace

// The write's payload objects and the refs its records will hold.
struct PayloadPlan {
  std::vector<std::pair<std::string, librados::bufferlist>> objects;
  std::optional<Ref> frame;
  std::vector<std::pair<LayerId, Ref>> layers;
  std::vector<std::pair<uint64_t, Ref>> blocks;

  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& o : objects) n.push_back(o.first);
    return n;
  }
};

namespace {

PayloadPlan PlanPayload(const StreamWrite& w, uint64_t epoch, uint64_t seq) {
  PayloadPlan plan;
  if (w.frame) {
    const auto& [index, bytes] = *w.frame;
    std::string name = rados_io::StripedName(
        absl::StrCat("f.", index, ".", epoch, ".", seq), bytes.size());
    plan.frame = Ref{name, 0, bytes.size()};
    plan.objects.emplace_back(std::move(name), rados_io::Text(bytes));
  }
  // Block records are objects too (tens of KiB with their summaries and
  // token codes: read back in parallel at recovery, not through the head's
  // omap).
  for (const auto& [id, record] : w.blocks) {
    std::string name = rados_io::StripedName(
        absl::StrCat("b.", id, ".", epoch, ".", seq), record.size());
    plan.blocks.push_back({id, Ref{name, 0, record.size()}});
    plan.objects.emplace_back(std::move(name), rados_io::Text(record));
  }
  // One object per block: its layers of this write, each with its CRC32C
  // trailer (GetBlockLayers checks it), concatenated; named once its size
  // is known.
  std::map<uint64_t, size_t> object_of;
  std::vector<uint64_t> blocks;
  for (const BlockLayerWrite& l : w.block_layers) {
    auto [it, added] = object_of.try_emplace(l.block_id, plan.objects.size());
    if (added) {
      plan.objects.emplace_back(std::string(), librados::bufferlist());
      blocks.push_back(l.block_id);
    }
    librados::bufferlist& bl = plan.objects[it->second].second;
    const std::string t =
        LayerTrailer(LayerKey(w.stream_id, l.block_id, l.layer), l.bytes);
    plan.layers.push_back(
        {{l.block_id, l.layer},
         Ref{"", bl.length(), l.bytes.size() + t.size(), true}});
    bl.append(l.bytes.data(), static_cast<unsigned>(l.bytes.size()));
    bl.append(t.data(), static_cast<unsigned>(t.size()));
  }
  for (uint64_t block : blocks) {
    auto& [name, bl] = plan.objects[object_of[block]];
    name = rados_io::StripedName(
        absl::StrCat("l.", block, ".", epoch, ".", seq), bl.length());
  }
  for (auto& [id, ref] : plan.layers) {
    ref.object = plan.objects[object_of[id.first]].first;
  }
  return plan;
}

}  // namespace

RadosColdStore::~RadosColdStore() {
  {
    kvmem::MutexLock lock(&mu_);
    entries_.clear();  // Their IoCtx copies go before the cluster handle.
  }
  pool_.close();
  cluster_.shutdown();
}

absl::Status RadosColdStore::Connect() {
  const RadosColdStoreOptions& o = options_;
  if (o.pool.empty()) {
    return absl::InvalidArgumentError("rados store: the pool name is empty");
  }
  int rc = cluster_.init2(o.client_name.c_str(), "ceph", 0);
  if (rc < 0) return FromRc(rc, absl::StrCat("rados init as ", o.client_name));
  rc = cluster_.conf_read_file(o.ceph_conf.empty() ? nullptr
                                                   : o.ceph_conf.c_str());
  if (rc < 0 && !o.ceph_conf.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ceph_conf \"", o.ceph_conf, "\" cannot be read (rados ", rc, ")"));
  }
  (void)cluster_.conf_parse_env(nullptr);
  const std::string secs =
      absl::StrCat(std::max<int64_t>(1, absl::ToInt64Seconds(o.op_timeout)));
  for (const char* key : {"rados_osd_op_timeout", "rados_mon_op_timeout",
                          "client_mount_timeout"}) {
    (void)cluster_.conf_set(key, secs.c_str());
  }
  rc = cluster_.connect();
  if (rc < 0) {
    return absl::UnavailableError(
        absl::StrCat("rados store: cannot reach the Ceph cluster (ceph_conf \"",
                     o.ceph_conf, "\") within ", secs, " s: rados ", rc));
  }
  index_ = absl::StrCat(o.prefix, rados_io::kIndex);
  rc = cluster_.ioctx_create(o.pool.c_str(), pool_);
  if (rc == -ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("rados store: pool \"", o.pool,
                     "\" does not exist (ceph osd pool create ", o.pool, ")"));
  }
  return FromRc(rc, absl::StrCat("opening pool ", o.pool));
}

std::shared_ptr<StreamEntry> RadosColdStore::Entry(
    absl::string_view stream_id) {
  kvmem::MutexLock lock(&mu_);
  auto it = entries_.find(stream_id);
  if (it == entries_.end()) {
    it = entries_
             .emplace(std::string(stream_id),
                      std::make_shared<StreamEntry>(
                          pool_, absl::StrCat(options_.prefix, stream_id)))
             .first;
  }
  return it->second;
}

absl::Status RadosColdStore::Fenced(const StreamEntry& e,
                                    absl::string_view stream_id) const {
  return absl::AbortedError(absl::StrCat(
      "stream \"", stream_id, "\" is owned by a newer store instance (epoch ",
      e.fenced_by, "; this one held ", e.epoch,
      "): it no longer reads or writes it"));
}

absl::Status RadosColdStore::Claim(StreamEntry& e, bool create) {
  // A coordinator's token for this stream may be claimed again by the
  // holding that got it (equal); the options' token must grow.
  if (e.token == 0 && coordinated_.load()) {
    return absl::AbortedError(
        "this store instance touches only streams its coordinator let it "
        "claim (ClaimStream), and this one is not claimed (or was released)");
  }
  const uint64_t token = e.token != 0 ? e.token : options_.fencing_token;
  const bool reclaim_ok = e.token != 0;
  for (int attempt = 0; attempt < 32; ++attempt) {
    librados::bufferlist value;
    const int got = e.io.getxattr(rados_io::kHead, rados_io::kEpochAttr, value);
    if (got == -ENOENT && !create) return absl::OkStatus();  // No stream.
    librados::ObjectWriteOperation op;
    uint64_t old = 0;
    if (got == -ENOENT) {
      op.create(true);
    } else if (got < 0) {
      return FromRc(got, "reading the stream's epoch");
    } else {
      if (!rados_io::ParseU64(value.to_str(), &old)) {
        return absl::DataLossError(absl::StrCat(
            "the head's epoch \"", value.to_str(), "\" is not a number"));
      }
      if (token != 0 && (token < old || (token == old && !reclaim_ok))) {
        e.fenced = true;
        e.fenced_by = old;
        return absl::AbortedError(absl::StrCat(
            "fencing token ", token, " is not above the stream's epoch ", old));
      }
      op.cmpxattr(rados_io::kEpochAttr, LIBRADOS_CMPXATTR_OP_EQ, old);
    }
    const uint64_t next = token != 0 ? token : old + 1;
    op.setxattr(rados_io::kEpochAttr, rados_io::Text(rados_io::U64(next)));
    const int rc = e.io.operate(rados_io::kHead, &op);
    if (rc == -EEXIST || rc == -ECANCELED) continue;  // Another claimer.
    KVMEM_RETURN_IF_ERROR(FromRc(rc, "claiming the stream"));
    e.epoch = next;
    e.seq = 0;
    e.claimed = true;
    e.loaded = false;  // What the earlier owner wrote until now counts.
    return absl::OkStatus();
  }
  return absl::AbortedError("claiming the stream: other claimers kept winning");
}

absl::Status RadosColdStore::Load(StreamEntry& e) {
  Manifest m;
  absl::Status bad;
  auto refs = [&](const std::string& key, librados::bufferlist& v, Ref* ref) {
    if (!rados_io::DecodeRef(v.to_str(), ref)) {
      bad = absl::DataLossError(
          absl::StrCat("manifest entry ", key, " is damaged"));
      return false;
    }
    m.Take(*ref);
    return true;
  };
  KVMEM_RETURN_IF_ERROR(
      ScanOmap(e.io, rados_io::kHead, "f/", [&](const std::string& k, auto& v) {
        uint64_t frame = 0;
        Ref ref;
        if (!rados_io::ParseKey(k, &frame) || !refs(k, v, &ref)) return false;
        m.frames[frame] = std::move(ref);
        return true;
      }));
  KVMEM_RETURN_IF_ERROR(
      ScanOmap(e.io, rados_io::kHead, "l/", [&](const std::string& k, auto& v) {
        uint64_t block = 0;
        uint32_t layer = 0;
        Ref ref;
        if (!rados_io::ParseKey(k, &block, &layer) || !refs(k, v, &ref)) {
          return false;
        }
        m.layers[{block, layer}] = std::move(ref);
        return true;
      }));
  KVMEM_RETURN_IF_ERROR(
      ScanOmap(e.io, rados_io::kHead, "b/", [&](const std::string& k, auto& v) {
        uint64_t block = 0;
        Ref ref;
        if (!rados_io::ParseKey(k, &block) || !refs(k, v, &ref)) return false;
        m.blocks[block] = std::move(ref);
        return true;
      }));
  KVMEM_RETURN_IF_ERROR(
      ScanOmap(e.io, rados_io::kHead, "m/", [&](const std::string& k, auto&) {
        uint64_t frame = 0;
        if (rados_io::ParseKey(k, &frame)) {
          m.metas.insert(frame);
        }
        return true;
      }));
  KVMEM_RETURN_IF_ERROR(bad);
  bytes_ += static_cast<int64_t>(m.bytes) - static_cast<int64_t>(e.m.bytes);
  e.m = std::move(m);
  e.loaded = true;
  return absl::OkStatus();
}

absl::Status RadosColdStore::Ready(StreamEntry& e, bool write) {
  if (e.fenced) return absl::AbortedError("fenced");
  if (e.released) {
    return absl::AbortedError("the stream was released by this store instance");
  }
  if (!e.claimed && (write || !e.loaded)) {
    KVMEM_RETURN_IF_ERROR(Claim(e, write));
  }
  if (!e.loaded) {
    if (!e.claimed) {  // No head: an empty stream, read without a claim.
      e.m = Manifest();
      e.loaded = true;
      return absl::OkStatus();
    }
    KVMEM_RETURN_IF_ERROR(Load(e));
  }
  return absl::OkStatus();
}

absl::Status RadosColdStore::ReadLocked(
    absl::string_view stream_id,
    const std::function<absl::Status(StreamEntry&)>& fn) {
  std::shared_ptr<StreamEntry> e = Entry(stream_id);
  {
    kvmem::ReaderMutexLock lock(&e->mu);
    if (e->loaded && !e->fenced) return fn(*e);
  }
  kvmem::MutexLock lock(&e->mu);
  const absl::Status ready = Ready(*e, /*write=*/false);
  if (e->fenced) return Fenced(*e, stream_id);
  KVMEM_RETURN_IF_ERROR(ready);
  return fn(*e);
}

absl::Status RadosColdStore::Index(StreamEntry& e,
                                   const std::string& stream_id) {
  if (e.indexed) return absl::OkStatus();
  librados::ObjectWriteOperation op;
  op.omap_set({{stream_id, librados::bufferlist()}});
  KVMEM_RETURN_IF_ERROR(
      FromRc(pool_.operate(index_, &op), "indexing the stream"));
  e.indexed = true;
  return absl::OkStatus();
}

absl::Status RadosColdStore::Commit(const StreamWrite& w) {
  std::shared_ptr<StreamEntry> e = Entry(w.stream_id);
  kvmem::MutexLock lock(&e->mu);
  const absl::Status ready = Ready(*e, /*write=*/true);
  if (e->fenced) return Fenced(*e, w.stream_id);
  KVMEM_RETURN_IF_ERROR(ready);
  if (w.config && !w.config->empty()) {
    KVMEM_RETURN_IF_ERROR(Index(*e, w.stream_id));
  }
  PayloadPlan plan = PlanPayload(w, e->epoch, ++e->seq);
  if (absl::Status written = rados_io::WriteObjects(e->io, plan.objects);
      !written.ok()) {
    rados_io::RemoveObjects(e->io, plan.names());  // Nothing refers to them.
    return written;
  }
  absl::Status head = CommitHead(*e, w, plan);
  if (!head.ok() && head.code() != absl::StatusCode::kUnavailable) {
    rados_io::RemoveObjects(e->io, plan.names());
  }
  if (e->fenced) return Fenced(*e, w.stream_id);
  return head;
}

namespace {

// The keys a write removes, as the manifest stands before it.
std::set<std::string> RemovedKeys(const StreamWrite& w, const Manifest& m) {
  std::set<std::string> rm;
  for (uint64_t b : w.delete_block_layers) {
    for (auto it = m.layers.lower_bound({b, 0});
         it != m.layers.end() && it->first.first == b; ++it) {
      rm.insert(rados_io::LayerKey(b, it->first.second));
    }
  }
  for (const auto& [first, last] : w.delete_frames) {
    for (auto it = m.frames.lower_bound(first);
         it != m.frames.end() && it->first <= last; ++it) {
      rm.insert(rados_io::FrameKey(it->first));
    }
  }
  for (const auto* ranges : {&w.delete_frames, &w.delete_frame_metas}) {
    for (const auto& [first, last] : *ranges) {
      for (auto it = m.metas.lower_bound(first);
           it != m.metas.end() && *it <= last; ++it) {
        rm.insert(rados_io::MetaKey(*it));
      }
    }
  }
  return rm;
}

std::map<std::string, librados::bufferlist> SetKeys(const StreamWrite& w,
                                                    const PayloadPlan& plan) {
  std::map<std::string, librados::bufferlist> set;
  if (w.config) set[rados_io::kConfigKey] = rados_io::Text(*w.config);
  if (w.state) set[rados_io::kStateKey] = rados_io::Text(*w.state);
  if (w.frame) {
    set[rados_io::FrameKey(w.frame->first)] =
        rados_io::Text(rados_io::EncodeRef(*plan.frame));
    if (w.frame_meta) {
      set[rados_io::MetaKey(w.frame->first)] = rados_io::Text(*w.frame_meta);
    }
  }
  for (const auto& [id, ref] : plan.blocks) {
    set[rados_io::BlockKey(id)] = rados_io::Text(rados_io::EncodeRef(ref));
  }
  for (const auto& [id, ref] : plan.layers) {
    set[rados_io::LayerKey(id.first, id.second)] =
        rados_io::Text(rados_io::EncodeRef(ref));
  }
  return set;
}

// The manifest after the write, and the objects it no longer refers to.
void Apply(const StreamWrite& w, const PayloadPlan& plan, Manifest* m,
           std::vector<std::string>* unused) {
  for (uint64_t b : w.delete_block_layers) {
    auto first = m->layers.lower_bound({b, 0});
    auto last = m->layers.lower_bound({b + 1, 0});
    for (auto it = first; it != last; ++it) m->Drop(it->second, unused);
    m->layers.erase(first, last);
  }
  for (const auto& [first, last] : w.delete_frames) {
    auto a = m->frames.lower_bound(first);
    auto b = m->frames.upper_bound(last);
    for (auto it = a; it != b; ++it) m->Drop(it->second, unused);
    m->frames.erase(a, b);
    m->metas.erase(m->metas.lower_bound(first), m->metas.upper_bound(last));
  }
  for (const auto& [first, last] : w.delete_frame_metas) {
    m->metas.erase(m->metas.lower_bound(first), m->metas.upper_bound(last));
  }
  auto put = [&](auto& map, const auto& key, const Ref& ref) {
    auto [it, added] = map.try_emplace(key, ref);
    if (!added) {
      m->Drop(it->second, unused);
      it->second = ref;
    }
    m->Take(ref);
  };
  if (plan.frame) {
    put(m->frames, w.frame->first, *plan.frame);
    if (w.frame_meta) m->metas.insert(w.frame->first);
  }
  for (const auto& [id, ref] : plan.layers) put(m->layers, id, ref);
  for (const auto& [id, ref] : plan.blocks) put(m->blocks, id, ref);
}

}  // namespace

absl::Status RadosColdStore::CommitHead(StreamEntry& e, const StreamWrite& w,
                                        const PayloadPlan& plan) {
  librados::ObjectWriteOperation op;
  op.cmpxattr(rados_io::kEpochAttr, LIBRADOS_CMPXATTR_OP_EQ, e.epoch);
  const std::set<std::string> rm = RemovedKeys(w, e.m);
  if (!rm.empty()) op.omap_rm_keys(rm);
  const std::map<std::string, librados::bufferlist> set = SetKeys(w, plan);
  if (!set.empty()) op.omap_set(set);
  const int rc = e.io.operate(rados_io::kHead, &op);
  if (rc == -ECANCELED) {
    librados::bufferlist now;
    if (e.io.getxattr(rados_io::kHead, rados_io::kEpochAttr, now) >= 0) {
      (void)rados_io::ParseU64(now.to_str(), &e.fenced_by);
    }
    e.fenced = true;
    return absl::AbortedError("fenced");
  }
  if (rc == -ETIMEDOUT) {
    e.loaded = false;  // The outcome is unknown: read the head again.
    return absl::UnavailableError(
        absl::StrCat("committing to the stream's head timed out after ",
                     absl::FormatDuration(options_.op_timeout),
                     ": the write may have been applied whole, or not at all"));
  }
  KVMEM_RETURN_IF_ERROR(FromRc(rc, "committing to the stream's head"));
  const uint64_t before = e.m.bytes;
  std::vector<std::string> unused;
  Apply(w, plan, &e.m, &unused);
  bytes_ += static_cast<int64_t>(e.m.bytes) - static_cast<int64_t>(before);
  rados_io::RemoveObjects(e.io, unused);
  return absl::OkStatus();
}

absl::Status RadosColdStore::DeleteStream(absl::string_view stream_id) {
  std::shared_ptr<StreamEntry> e = Entry(stream_id);
  kvmem::MutexLock lock(&e->mu);
  const absl::Status ready = Ready(*e, /*write=*/false);
  if (e->fenced) return Fenced(*e, stream_id);
  KVMEM_RETURN_IF_ERROR(ready);
  if (!e->claimed) return absl::OkStatus();  // No head: nothing stored.
  // The head keeps its epoch (so fencing survives a delete) and loses every
  // record in one operation; then the objects go, listed or left behind.
  librados::ObjectWriteOperation op;
  op.cmpxattr(rados_io::kEpochAttr, LIBRADOS_CMPXATTR_OP_EQ, e->epoch);
  op.omap_clear();
  const int rc = e->io.operate(rados_io::kHead, &op);
  if (rc == -ECANCELED) {
    e->fenced = true;
    return Fenced(*e, stream_id);
  }
  KVMEM_RETURN_IF_ERROR(FromRc(rc, "clearing the stream's head"));
  bytes_ -= static_cast<int64_t>(e->m.bytes);
  e->m = Manifest();
  std::vector<std::string> objects;
  try {
    for (auto it = e->io.nobjects_begin(); it != e->io.nobjects_end(); ++it) {
      if (it->get_oid() != rados_io::kHead) objects.push_back(it->get_oid());
    }
  } catch (const std::exception&) {
    // Listing failed: the objects stay as garbage; the records are gone.
  }
  rados_io::RemoveObjects(e->io, objects, /*striped=*/false);
  librados::ObjectWriteOperation unindex;
  unindex.omap_rm_keys({std::string(stream_id)});
  (void)pool_.operate(index_, &unindex);
  e->indexed = false;
  kvmem::MutexLock store_lock(&mu_);
  acked_.erase(std::string(stream_id));
  return absl::OkStatus();
}

}  // namespace kvmem::rados_store

// The module's entry point (storage/rados_loader.cc loads it): a store
// connected to the cluster, or nullptr with *status set.
extern "C" kvmem::ColdStore* kvmem_rados_open(
    const kvmem::RadosColdStoreOptions* options, absl::Status* status) {
  auto store = std::make_unique<kvmem::rados_store::RadosColdStore>(*options);
  *status = store->Connect();
  return status->ok() ? store.release() : nullptr;
}
