// The block records a seal writes outside RocksDB's WAL
// (RocksColdStoreOptions::log_token_groups): written after the commit that
// logged their stand-ins, and logged at a clean close if no flush has
// written them by then.
#include <map>
#include <string>
#include <vector>

#include "storage/rocks_keys.h"
#include "storage/rocks_store.h"

namespace kvmem {

void RocksColdStore::WriteUnlogged(
    absl::string_view stream_id,
    const std::vector<const std::pair<uint64_t, std::string>*>& records) {
  rocksdb::WriteBatch batch;
  std::vector<std::string> keys;
  for (const auto* r : records) {
    keys.push_back(NumberedKey(stream_id, r->first));
    batch.Put(blocks_, keys.back(), r->second);
  }
  if (keys.empty()) return;
  rocksdb::WriteOptions unlogged = write_options_;
  unlogged.disableWAL = true;
  unlogged.sync = false;  // RocksDB refuses a synced write without the WAL.
  // The logged stand-in stays whatever happens here; an I/O error still
  // stops the store's writes until it reopens, as any write's does.
  if (!Written(DbWrite(unlogged, &batch), "block record").ok()) return;
  const uint64_t seq = db_.db->GetLatestSequenceNumber();  // >= the write's.
  const uint64_t flushed = listener_->blocks_flushed_seq();
  kvmem::MutexLock lock(&unlogged_mu_);
  for (auto it = unlogged_.begin(); it != unlogged_.end();) {
    it = it->second <= flushed ? unlogged_.erase(it) : std::next(it);
  }
  for (std::string& k : keys) unlogged_[std::move(k)] = seq;
}

void RocksColdStore::LogUnflushedRecords() {
  std::map<std::string, uint64_t> keys;
  {
    kvmem::MutexLock lock(&unlogged_mu_);
    keys.swap(unlogged_);
  }
  if (keys.empty() || failed_.load() || db_.read_only || blocks_ == nullptr) {
    return;  // Left as stand-ins: recovery completes them.
  }
  const uint64_t flushed = listener_->blocks_flushed_seq();
  rocksdb::WriteBatch batch;
  for (const auto& [key, seq] : keys) {
    std::string record;
    if (seq > flushed &&
        db_.db->Get(rocksdb::ReadOptions(), blocks_, key, &record).ok()) {
      batch.Put(blocks_, key, record);
    }
  }
  if (batch.Count() > 0) {
    Written(DbWrite(write_options_, &batch), "block records at close")
        .IgnoreError();
  }
}

}  // namespace kvmem
