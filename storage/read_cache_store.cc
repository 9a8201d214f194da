#include "storage/read_cache_store.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "storage/forwarding_store.h"
#include "storage/rocks_db.h"

namespace kvmem {
namespace {

constexpr char kFrame = 'F';
constexpr char kLayer = 'L';
constexpr uint64_t kMinCapacity = 64ull << 20;

void PutBigEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = bytes - 1; i >= 0; --i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

// kind, the stream id, a NUL (never in a stream id), then big-endian
// numbers: keys of one stream sort together, by frame or (block, layer).
std::string StreamPrefix(char kind, absl::string_view stream_id) {
  std::string k(1, kind);
  k.append(stream_id.data(), stream_id.size());
  k.push_back('\0');
  return k;
}
std::string FrameKey(absl::string_view stream_id, uint64_t frame) {
  std::string k = StreamPrefix(kFrame, stream_id);
  PutBigEndian(frame, 8, &k);
  return k;
}
std::string BlockPrefix(absl::string_view stream_id, uint64_t block) {
  std::string k = StreamPrefix(kLayer, stream_id);
  PutBigEndian(block, 8, &k);
  return k;
}
std::string LayerKey4(absl::string_view stream_id, uint64_t block,
                      uint32_t layer) {
  std::string k = BlockPrefix(stream_id, block);
  PutBigEndian(layer, 4, &k);
  return k;
}

class ReadCacheStore final : public ForwardingColdStore {
 public:
  ReadCacheStore(std::unique_ptr<ColdStore> inner, ReadCacheOptions options,
                 std::unique_ptr<rocksdb::DB> db)
      : ForwardingColdStore(std::move(inner)),
        options_(std::move(options)),
        db_(std::move(db)) {
    read_.verify_checksums = true;
    write_.disableWAL = true;
  }

  const ReadCacheCounters* counters() const { return &counters_; }

  absl::Status Commit(const StreamWrite& w) override {
    const absl::Status s = inner().Commit(w);
    rocksdb::WriteBatch drop;
    if (w.frame.has_value()) drop.Delete(FrameKey(w.stream_id, w.frame->first));
    for (const auto& [first, last] : w.delete_frames) {
      drop.DeleteRange(FrameKey(w.stream_id, first),
                       FrameKey(w.stream_id, last) + std::string(1, '\0'));
    }
    for (uint64_t b : w.delete_block_layers) {
      const std::string p = BlockPrefix(w.stream_id, b);
      drop.DeleteRange(p, p + std::string(5, '\xff'));
    }
    for (const BlockLayerWrite& l : w.block_layers) {
      drop.Delete(LayerKey4(w.stream_id, l.block_id, l.layer));
    }
    const uint64_t gen = Change(w.stream_id, &drop);
    if (s.ok() && options_.write_through) {
      rocksdb::WriteBatch keep;
      uint64_t bytes = 0;
      if (w.frame.has_value()) {
        const absl::string_view f = w.frame->second;
        keep.Put(FrameKey(w.stream_id, w.frame->first),
                 rocksdb::Slice(f.data(), f.size()));
        bytes += f.size();
      }
      for (const BlockLayerWrite& l : w.block_layers) {
        keep.Put(LayerKey4(w.stream_id, l.block_id, l.layer), l.bytes);
        bytes += l.bytes.size();
      }
      if (keep.Count() > 0) Insert(w.stream_id, gen, &keep, bytes);
    }
    return s;
  }

  absl::StatusOr<std::string> GetFrame(absl::string_view stream_id,
                                       uint64_t f) override {
    const std::string key = FrameKey(stream_id, f);
    if (std::optional<std::string> v = Lookup(key)) {
      Hit(v->size());
      return *std::move(v);
    }
    const uint64_t gen = Generation(stream_id);
    absl::StatusOr<std::string> v = inner().GetFrame(stream_id, f);
    if (!Missed(v.status())) return v;
    rocksdb::WriteBatch keep;
    keep.Put(key, *v);
    Insert(stream_id, gen, &keep, v->size());
    return v;
  }

  // Through GetFrame (cached whole frames), not the inner store's parts.
  absl::StatusOr<std::vector<std::string>> GetFrameParts(
      absl::string_view stream_id, uint64_t part_bytes,
      const std::vector<FramePart>& parts) override {
    return ColdStore::GetFrameParts(stream_id, part_bytes, parts);
  }

  absl::StatusOr<std::vector<std::string>> GetFrames(
      absl::string_view stream_id, uint64_t first, uint64_t last) override {
    if (first > last || last - first >= kMaxLocalRange) {
      return inner().GetFrames(stream_id, first, last);
    }
    std::vector<std::string> keys;
    for (uint64_t f = first;; ++f) {
      keys.push_back(FrameKey(stream_id, f));
      if (f == last) break;
    }
    return ReadMany(stream_id, keys, [&](const std::vector<size_t>& missing) {
      if (missing.size() == keys.size()) {
        return inner().GetFrames(stream_id, first, last);
      }
      // The frames missing, as one range from the first to the last of
      // them (the range's cached frames are read again).
      absl::StatusOr<std::vector<std::string>> v = inner().GetFrames(
          stream_id, first + missing.front(), first + missing.back());
      if (!v.ok()) return v;
      std::vector<std::string> out;
      for (size_t i : missing) out.push_back((*v)[i - missing.front()]);
      return absl::StatusOr<std::vector<std::string>>(std::move(out));
    });
  }

  absl::StatusOr<std::string> GetBlockLayer(absl::string_view stream_id,
                                            uint64_t block_id,
                                            uint32_t layer) override {
    absl::StatusOr<std::vector<std::string>> v =
        GetBlockLayers(stream_id, block_id, {layer});
    if (!v.ok()) return v.status();
    return std::move(v->front());
  }

  absl::StatusOr<std::vector<std::string>> GetBlockLayers(
      absl::string_view stream_id, uint64_t block_id,
      const std::vector<uint32_t>& layers) override {
    std::vector<std::string> keys;
    for (uint32_t l : layers) keys.push_back(LayerKey4(stream_id, block_id, l));
    return ReadMany(stream_id, keys, [&](const std::vector<size_t>& missing) {
      std::vector<uint32_t> want;
      for (size_t i : missing) want.push_back(layers[i]);
      return inner().GetBlockLayers(stream_id, block_id, want);
    });
  }

  absl::Status DeleteStream(absl::string_view stream_id) override {
    const absl::Status s = inner().DeleteStream(stream_id);
    DropStream(stream_id);
    return s;
  }
  absl::Status ClaimStream(absl::string_view stream_id,
                           uint64_t token) override {
    DropStream(stream_id);
    return inner().ClaimStream(stream_id, token);
  }
  void ReleaseStream(absl::string_view stream_id) override {
    inner().ReleaseStream(stream_id);
    DropStream(stream_id);
  }

 private:
  // A GetFrames range longer than this goes to the inner store directly.
  static constexpr uint64_t kMaxLocalRange = 4096;

  // The cached payload under key, counted; nullopt on a miss (or an entry
  // RocksDB finds damaged: read again from the inner store).
  std::optional<std::string> Lookup(const std::string& key) {
    std::string v;
    if (broken_.load(std::memory_order_acquire) ||
        !db_->Get(read_, key, &v).ok()) {
      return std::nullopt;
    }
    return v;
  }
  void Hit(uint64_t bytes) {
    counters_.hits.fetch_add(1, std::memory_order_relaxed);
    counters_.hit_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Several payloads read as one: those the cache holds, and the others
  // through read_missing(their indexes into keys), which returns them in
  // that order. A change of the stream while they are read (some entries
  // from before a commit, some from after) starts again, so the answer
  // never mixes two writes; after kAttempts, everything from the inner
  // store (then nothing is kept).
  using MissingReader = std::function<absl::StatusOr<std::vector<std::string>>(
      const std::vector<size_t>&)>;
  absl::StatusOr<std::vector<std::string>> ReadMany(
      absl::string_view stream_id, const std::vector<std::string>& keys,
      const MissingReader& read_missing) {
    constexpr int kAttempts = 3;
    std::vector<size_t> all(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) all[i] = i;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const uint64_t gen = Generation(stream_id);
      std::vector<std::string> out(keys.size());
      std::vector<size_t> missing;
      uint64_t hit_bytes = 0;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (std::optional<std::string> v = Lookup(keys[i])) {
          hit_bytes += v->size();
          out[i] = *std::move(v);
        } else {
          missing.push_back(i);
        }
      }
      absl::StatusOr<std::vector<std::string>> v;
      if (!missing.empty()) {
        v = read_missing(missing);
        if (!Missed(v.status(), missing.size())) return v.status();
      }
      if (Generation(stream_id) != gen) continue;  // Changed meanwhile.
      const size_t hits = keys.size() - missing.size();
      if (hits > 0) {
        counters_.hits.fetch_add(hits, std::memory_order_relaxed);
        counters_.hit_bytes.fetch_add(hit_bytes, std::memory_order_relaxed);
      }
      if (missing.empty()) return out;
      rocksdb::WriteBatch keep;
      uint64_t bytes = 0;
      for (size_t j = 0; j < missing.size(); ++j) {
        keep.Put(keys[missing[j]], (*v)[j]);
        bytes += (*v)[j].size();
        out[missing[j]] = std::move((*v)[j]);
      }
      Insert(stream_id, gen, &keep, bytes);
      return out;
    }
    absl::StatusOr<std::vector<std::string>> v = read_missing(all);
    Missed(v.status(), keys.size());
    return v;
  }

  // Counts n payloads read from the inner store; true when they were read.
  bool Missed(const absl::Status& s, size_t n = 1) {
    if (!s.ok()) {
      if (!absl::IsNotFound(s)) {
        counters_.inner_errors.fetch_add(1, std::memory_order_relaxed);
      }
      return false;
    }
    counters_.misses.fetch_add(n, std::memory_order_relaxed);
    return true;
  }

  uint64_t Generation(absl::string_view stream_id) {
    absl::MutexLock l(&mu_);
    auto it = generation_.find(stream_id);
    return it == generation_.end() ? 0 : it->second;
  }

  // Applies `drop` and gives the stream a new generation; returns it.
  uint64_t Change(absl::string_view stream_id, rocksdb::WriteBatch* drop) {
    absl::MutexLock l(&mu_);
    if (drop->Count() > 0 && !db_->Write(write_, drop).ok()) {
      // An entry that could not be dropped must not be read: forget them
      // all (Lookups fail on an empty cache, never return a stale entry).
      DropAllLocked();
    }
    const uint64_t g = ++last_generation_;
    auto it = generation_.find(stream_id);
    if (it == generation_.end()) {
      generation_.emplace(std::string(stream_id), g);
    } else {
      it->second = g;
    }
    return g;
  }

  void DropStream(absl::string_view stream_id) {
    rocksdb::WriteBatch drop;
    for (char kind : {kFrame, kLayer}) {
      const std::string p = StreamPrefix(kind, stream_id);
      std::string end = p;
      end.back() = '\x01';
      drop.DeleteRange(p, end);
    }
    Change(stream_id, &drop);
  }

  void DropAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    rocksdb::WriteBatch all;
    all.DeleteRange(std::string(), std::string(1, '\xff'));
    if (!db_->Write(write_, &all).ok()) {
      broken_.store(true, std::memory_order_release);
    }
  }

  // Stores `keep` unless the stream changed since generation `gen`.
  void Insert(absl::string_view stream_id, uint64_t gen,
              rocksdb::WriteBatch* keep, uint64_t bytes) {
    absl::MutexLock l(&mu_);
    auto it = generation_.find(stream_id);
    if ((it == generation_.end() ? 0 : it->second) != gen ||
        broken_.load(std::memory_order_relaxed)) {
      counters_.skipped_inserts.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (!db_->Write(write_, keep).ok()) {
      counters_.insert_errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    counters_.inserted_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  const ReadCacheOptions options_;
  const std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ReadOptions read_;
  rocksdb::WriteOptions write_;
  ReadCacheCounters counters_;
  absl::Mutex mu_;
  // Per stream, the generation of its last change (0: none since open);
  // never erased, so a reader's generation cannot come back.
  std::map<std::string, uint64_t, std::less<>> generation_ ABSL_GUARDED_BY(mu_);
  uint64_t last_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Set when stale entries could not be dropped: no reads or inserts then.
  std::atomic<bool> broken_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<ColdStore>> WithReadCache(
    std::unique_ptr<ColdStore> inner, const ReadCacheOptions& options,
    const ReadCacheCounters** counters) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("read cache: the directory is empty");
  }
  if (options.capacity_bytes < kMinCapacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("read cache: capacity ", options.capacity_bytes,
                     " bytes is below the minimum, ", kMinCapacity));
  }
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compaction_style = rocksdb::kCompactionStyleFIFO;
  o.compaction_options_fifo.max_table_files_size = options.capacity_bytes;
  o.write_buffer_size = static_cast<size_t>(
      std::min<uint64_t>(options.capacity_bytes / 4, 64ull << 20));
  o.max_write_buffer_number = 2;
  o.max_open_files = -1;  // FIFO compaction requires it.
  // KV payloads hardly compress; the cache spends no CPU trying.
  o.compression = rocksdb::kNoCompression;
  o.info_log_level = rocksdb::WARN_LEVEL;
  // What a previous run kept may have been overwritten since (another
  // server owned the stream): the cache starts empty.
  rocksdb::Status s = rocksdb::DestroyDB(options.path, o);
  if (!s.ok()) return FromRocks(s, "read cache: emptying " + options.path);
  rocksdb::DB* raw = nullptr;
  s = rocksdb::DB::Open(o, options.path, &raw);
  if (!s.ok()) return FromRocks(s, "read cache: opening " + options.path);
  auto store = std::make_unique<ReadCacheStore>(
      std::move(inner), options, std::unique_ptr<rocksdb::DB>(raw));
  if (counters != nullptr) *counters = store->counters();
  return store;
}

}  // namespace kvmem
