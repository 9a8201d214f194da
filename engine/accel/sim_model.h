// The cost model of the simulated retrieval accelerator (the `sim`
// backend, in the spirit of V-Rex's ANN engine beside an edge SoC's DRAM):
// pure functions from a hardware description and a call's shape to modelled
// time, DRAM bytes and energy. The backend that reports these next to the
// CPU's results is SimAccelerator (engine/accel/accelerator.h).
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
//
// Staging (InjectionCost, StagingBytesFor): see below; the stateful parts
// (the SRAM split and the recall queue) live in engine/accel/accelerator.h.
#ifndef KVMEM_ENGINE_ACCEL_SIM_MODEL_H_
#define KVMEM_ENGINE_ACCEL_SIM_MODEL_H_

#include <cstddef>
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
  // On-chip SRAM shared by the hot-window cache and the staging buffer
  // (the article: "a few MB to tens of MB" on edge SoCs; re-partitioned "at
  // a granularity of a few hundred KB, with double buffering").
  uint64_t sram_bytes = 8ull << 20;
  uint64_t sram_granule_bytes = 256ull << 10;
  double sram_read_bytes_per_s = 256e9;  // Attention reading staged KV.
  bool double_buffering = true;
  // The recall queue: concurrent recalls are served by priority, one
  // injection of at most this many blocks at a time ("hardware sorts by the
  // software's priority and limits the KV blocks per injection ... within
  // tens of cycles").
  uint32_t max_blocks_per_injection = 8;
  uint32_t arbitration_cycles = 32;
  // Recall is a hard constraint: the sim flags an approximate index whose
  // sampled recall@k falls below this.
  double recall_floor = 0.95;
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

// One block's KV to stage: `bytes` starting `offset` past a burst boundary,
// layer-major (one run) or frame-major (`rows` runs).
struct StageItem {
  uint64_t bytes = 0;
  uint64_t offset = 0;
  bool layer_major = true;
  uint32_t rows = 1;
};

// One injection: the items move through a staging buffer of buffer_bytes
// (split in two halves with double buffering) in chunks that fit a half;
// the attention consumes each chunk from SRAM (sram_read_bytes_per_s).
// Double-buffered, chunk i+1 moves while chunk i is consumed:
//   t = m_1 + sum_{i>1} max(m_i, c_{i-1}) + c_n
// otherwise each chunk moves, then is consumed: t = sum (m_i + c_i).
// A frame-major item is chunked on row boundaries; a layer-major one in
// half-sized runs, each after the first starting where the last ended.
SimCost InjectionCost(const SimHardware& hw, const StageItem* items, size_t n,
                      uint64_t buffer_bytes);

// The staging buffer an injection of these items asks for: twice (once
// without double buffering) the largest item, in whole granules, at least
// one granule and at most the SRAM less one granule for the hot window.
uint64_t StagingBytesFor(const SimHardware& hw, const StageItem* items,
                         size_t n);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_ACCEL_SIM_MODEL_H_
