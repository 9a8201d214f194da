// The cost model of the simulated retrieval accelerator (issue 5's `sim`
// backend, in the spirit of V-Rex's ANN engine beside an edge SoC's DRAM):
// pure functions from a hardware description and a call's shape to modelled
// time, DRAM bytes and energy. The backend that reports these next to the
// CPU's results is not built yet; this is its arithmetic, tested on its own.
//
// Search: the engine streams every summary from DRAM at low precision
// (precision_bits per element) through `lanes` multiply-accumulate lanes at
// `clock_hz`; vectors whose bound survives are rescored at 16 bits (a
// quarter of the low-precision rate per lane at 8 bits: lanes * 8 / 16 / 2);
// a top-k sorter takes one candidate per cycle. Stages are pipelined, so the
// time is the slowest stage plus the pipeline's fill latency; DRAM streaming
// overlaps compute, so the call takes max(compute, DRAM).
//
// Moves (KV into the staging buffer): DRAM moves whole bursts. A
// layer-major block moves as one contiguous run: ceil((offset % burst +
// bytes) / burst) bursts. A frame-major block moves one run per (layer,
// frame) row, each paying its own misalignment and a per-transaction setup;
// so misaligned or non-layer-major moves cost more (the article's pitfall:
// "otherwise DMA burst efficiency halves").
#ifndef KVMEM_ENGINE_SIM_MODEL_H_
#define KVMEM_ENGINE_SIM_MODEL_H_

#include <cstdint>

namespace kvmem {

struct SimHardware {
  uint32_t lanes = 256;         // MAC lanes of the ANN engine.
  double clock_hz = 800e6;      // ANN engine clock.
  uint32_t precision_bits = 8;  // First-stage precision (4 or 8).
  uint32_t pipeline_fill_cycles = 32;
  double dram_bandwidth_bytes_per_s = 100e9;
  uint32_t burst_bytes = 64;
  uint32_t transaction_setup_cycles = 16;  // Per DMA transaction.
  double dram_pj_per_byte = 20;            // DRAM access energy.
  double mac_pj = 0.2;                     // One low-precision MAC.
};

struct SimCost {
  double seconds = 0;
  uint64_t dram_bytes = 0;  // Bytes the bursts move (>= payload bytes).
  double joules = 0;
};

// One single-query search over `vectors` summaries of `dim` elements,
// `refined` of them rescored at full precision, top-k of them sorted.
SimCost SearchCost(const SimHardware& hw, uint64_t vectors, uint32_t dim,
                   uint64_t refined);

// Moving `bytes` of KV that start `offset` bytes past a burst boundary:
// layer-major as one run, or frame-major as `rows` runs of bytes / rows.
SimCost MoveCost(const SimHardware& hw, uint64_t bytes, uint64_t offset,
                 bool layer_major, uint32_t rows);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_SIM_MODEL_H_
