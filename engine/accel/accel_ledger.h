// AccelLedger: one stream's account of its accelerator calls (searches,
// scans, staging of recalled KV, prefetch searches) and whether its index
// was last seen below the accelerator's recall floor.
//
// Thread safety: all methods are safe to call concurrently (one small lock,
// never held across a call into the accelerator).
#ifndef KVMEM_ENGINE_ACCEL_ACCEL_LEDGER_H_
#define KVMEM_ENGINE_ACCEL_ACCEL_LEDGER_H_

#include "absl/base/thread_annotations.h"
#include "base/sync.h"
#include "engine/types.h"

namespace kvmem {

class AccelLedger {
 public:
  // Adds a call's cost to the stream's total.
  void Add(const CallCost& c) ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    total_ += c;
  }
  CallCost Total() const ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    return total_;
  }
  // Records whether the index is below the recall floor now; true when it
  // just crossed below (the moment to warn, once per crossing).
  bool NoteBelowFloor(bool below) ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    const bool crossed = below && !below_floor_;
    below_floor_ = below;
    return crossed;
  }

 private:
  mutable kvmem::Mutex mu_;
  CallCost total_ ABSL_GUARDED_BY(mu_);
  bool below_floor_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvmem

#endif  // KVMEM_ENGINE_ACCEL_ACCEL_LEDGER_H_
