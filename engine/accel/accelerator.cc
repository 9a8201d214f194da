#include "engine/accel/accelerator.h"

#include <algorithm>
#include <chrono>

#include "base/timing.h"

namespace kvmem {
namespace {

class CpuAccelerator final : public Accelerator {
 public:
  const std::string& name() const override { return name_; }

  std::vector<ScoredId> Search(const BlockIndex& index, const float* query,
                               const SearchParams& params,
                               CallCost* cost) override {
    std::vector<ScoredId> out;
    Timed(cost, [&] { out = index.Search(query, params.k); });
    return out;
  }

  bool Scan(const BlockIndex& index, const float* query,
            const SearchParams& params, SegmentScan* out,
            CallCost* cost) override {
    bool scanned = false;
    Timed(cost, [&] { scanned = index.ScanSegments(query, out, params.mode); });
    return scanned;
  }

  bool Scan(const BlockIndex& index, const float* queries, size_t vectors,
            const SearchParams& params, SegmentScan* out,
            CallCost* cost) override {
    bool scanned = false;
    Timed(
        cost,
        [&] {
          scanned = index.ScanSegments(queries, vectors, out, params.mode);
        },
        vectors);
    return scanned;
  }

  AcceleratorStats Stats() const override {
    AcceleratorStats s;
    s.backend = name_;
    kvmem::MutexLock lock(&mu_);
    s.total = total_;
    return s;
  }

 private:
  // Runs `searches` search-like calls' work, timed, and accounts it.
  template <typename Fn>
  void Timed(CallCost* cost, Fn fn, size_t searches = 1) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    CallCost c;
    c.measured_us = MicrosSince(t0);
    c.searches = static_cast<uint32_t>(searches);
    kvmem::MutexLock lock(&mu_);
    total_ += c;
    if (cost != nullptr) *cost += c;
  }

  const std::string name_ = "cpu";
  mutable kvmem::Mutex mu_;
  CallCost total_ ABSL_GUARDED_BY(mu_);
};

class SimAccelerator final : public Accelerator {
 public:
  explicit SimAccelerator(const SimHardware& hw)
      : hw_(hw), idle_staging_(StagingBytesFor(hw, nullptr, 0)) {
    staging_ = idle_staging_;
  }

  const std::string& name() const override { return name_; }
  bool modelled() const override { return true; }
  double recall_floor() const override { return hw_.recall_floor; }

  std::vector<ScoredId> Search(const BlockIndex& index, const float* query,
                               const SearchParams& params,
                               CallCost* cost) override {
    std::vector<ScoredId> out;
    Modelled(index, params, cost, [&] { out = index.Search(query, params.k); });
    return out;
  }

  // The engine scores every summary per head in the same streaming pass a
  // search makes (the per-head vectors are slices of the same summaries),
  // then refines the k the caller expects: a search's cost.
  bool Scan(const BlockIndex& index, const float* query,
            const SearchParams& params, SegmentScan* out,
            CallCost* cost) override {
    bool scanned = false;
    Modelled(index, params, cost,
             [&] { scanned = index.ScanSegments(query, out, params.mode); });
    return scanned;
  }

  void Stage(const std::vector<StageItem>& items, const StageParams& params,
             CallCost* cost) override {
    const size_t cap = std::max<uint32_t>(1, hw_.max_blocks_per_injection);
    for (size_t first = 0; first < items.size(); first += cap) {
      const auto t0 = std::chrono::steady_clock::now();
      const size_t n = std::min(cap, items.size() - first);
      const PriorityGate::Ticket ticket = gate_.Acquire(params.priority);
      CallCost c;
      c.injections = 1;
      double service = ArbitrationSeconds();
      {
        kvmem::MutexLock lock(&mu_);
        // The staging buffer takes granules from the hot window (clean
        // copies of DRAM: dropping them costs nothing).
        const uint64_t want = StagingBytesFor(hw_, items.data() + first, n);
        if (want != staging_) {
          staging_ = want;
          ++c.repartitions;
        }
        const SimCost inj =
            InjectionCost(hw_, items.data() + first, n, staging_);
        service += inj.seconds;
        c.modelled_us = ticket.queue_s * 1e6 + service * 1e6;
        c.dram_bytes += inj.dram_bytes;
        c.energy_uj += inj.joules * 1e6;
        // With no other recall waiting, the hot window takes its granules
        // back and refills them from DRAM: that occupies the engine (the
        // next caller waits for it) but does not delay this injection.
        if (gate_.waiting() == 0 && staging_ != idle_staging_) {
          const SimCost refill =
              MoveCost(hw_, staging_ - idle_staging_, 0, true, 1);
          service += refill.seconds;
          c.dram_bytes += refill.dram_bytes;
          c.energy_uj += refill.joules * 1e6;
          staging_ = idle_staging_;
          ++c.repartitions;
        }
      }
      gate_.Release(service);
      c.queue_us = ticket.queue_s * 1e6;
      c.measured_us = MicrosSince(t0);
      Account(c);
      if (cost != nullptr) *cost += c;
    }
  }

  // Runs one search-like call over `index` through the priority queue, and
  // accounts its measured and modelled cost.
  template <typename Fn>
  void Modelled(const BlockIndex& index, const SearchParams& params,
                CallCost* cost, Fn fn) {
    const auto t0 = std::chrono::steady_clock::now();
    const PriorityGate::Ticket ticket = gate_.Acquire(params.priority);
    fn();
    const uint64_t n = index.size();
    const SimCost s =
        SearchCost(hw_, n, index.dim(), std::min<uint64_t>(n, params.k));
    const double service = ArbitrationSeconds() + s.seconds;
    gate_.Release(service);
    CallCost c;
    c.searches = 1;
    c.measured_us = MicrosSince(t0);
    c.queue_us = ticket.queue_s * 1e6;
    c.modelled_us = c.queue_us + service * 1e6;
    c.dram_bytes = s.dram_bytes;
    c.energy_uj = s.joules * 1e6;
    Account(c);
    if (cost != nullptr) *cost += c;
  }

  AcceleratorStats Stats() const override {
    AcceleratorStats s;
    s.backend = name_;
    s.modelled = true;
    s.recall_floor = hw_.recall_floor;
    s.sram_bytes = hw_.sram_bytes;
    kvmem::MutexLock lock(&mu_);
    s.total = total_;
    s.sram_staging_bytes = staging_;
    s.sram_hot_bytes =
        hw_.sram_bytes > staging_ ? hw_.sram_bytes - staging_ : 0;
    s.repartitions = total_.repartitions;
    return s;
  }

 private:
  double ArbitrationSeconds() const {
    return hw_.clock_hz > 0 ? hw_.arbitration_cycles / hw_.clock_hz : 0;
  }
  void Account(const CallCost& c) {
    kvmem::MutexLock lock(&mu_);
    total_ += c;
  }

  const std::string name_ = "sim";
  const SimHardware hw_;
  const uint64_t idle_staging_;
  PriorityGate gate_;
  mutable kvmem::Mutex mu_;
  uint64_t staging_ ABSL_GUARDED_BY(mu_) = 0;
  CallCost total_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

CallCost& CallCost::operator+=(const CallCost& o) {
  measured_us += o.measured_us;
  searches += o.searches;
  modelled_us += o.modelled_us;
  queue_us += o.queue_us;
  dram_bytes += o.dram_bytes;
  energy_uj += o.energy_uj;
  injections += o.injections;
  repartitions += o.repartitions;
  return *this;
}

void Accelerator::Stage(const std::vector<StageItem>&, const StageParams&,
                        CallCost*) {}

bool Accelerator::Scan(const BlockIndex& index, const float* query,
                       const SearchParams& params, SegmentScan* out,
                       CallCost*) {
  return index.ScanSegments(query, out, params.mode);
}

bool Accelerator::Scan(const BlockIndex& index, const float* queries,
                       size_t vectors, const SearchParams& params,
                       SegmentScan* out, CallCost* cost) {
  for (size_t j = 0; j < vectors; ++j) {
    if (!Scan(index, queries + j * index.dim(), params, &out[j], cost)) {
      return false;
    }
  }
  return true;
}

std::unique_ptr<Accelerator> NewCpuAccelerator() {
  return std::make_unique<CpuAccelerator>();
}

std::unique_ptr<Accelerator> NewSimAccelerator(const SimHardware& hw) {
  return std::make_unique<SimAccelerator>(hw);
}

Accelerator& SharedCpuAccelerator() {
  static Accelerator* cpu = NewCpuAccelerator().release();
  return *cpu;
}

PriorityGate::Ticket PriorityGate::Acquire(uint32_t priority) {
  kvmem::MutexLock lock(&mu_);
  const uint64_t seq = next_seq_++;
  const double clock_at_arrival = clock_s_;
  waiters_.push_back({priority, seq});
  while (!IsNext(seq)) cv_.Wait(&mu_);
  waiters_.erase(std::find_if(waiters_.begin(), waiters_.end(),
                              [seq](const Waiter& w) { return w.seq == seq; }));
  held_ = true;
  return {clock_s_ - clock_at_arrival};
}

void PriorityGate::Release(double modelled_s) {
  kvmem::MutexLock lock(&mu_);
  clock_s_ += modelled_s;
  held_ = false;
  cv_.SignalAll();
}

size_t PriorityGate::waiting() const {
  kvmem::MutexLock lock(&mu_);
  return waiters_.size();
}

bool PriorityGate::IsNext(uint64_t seq) const {
  if (held_) return false;
  const Waiter* best = nullptr;
  for (const Waiter& w : waiters_) {
    if (best == nullptr || w.priority > best->priority ||
        (w.priority == best->priority && w.seq < best->seq)) {
      best = &w;
    }
  }
  return best != nullptr && best->seq == seq;
}

}  // namespace kvmem
