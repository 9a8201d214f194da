#include "engine/accel/sim_model.h"

#include <algorithm>
#include <cmath>

namespace kvmem {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) {
  return b == 0 ? 0 : (a + b - 1) / b;
}

}  // namespace

SimCost SearchCost(const SimHardware& hw, uint64_t vectors, uint32_t dim,
                   uint64_t refined) {
  SimCost c;
  if (vectors == 0 || dim == 0 || hw.lanes == 0 || hw.clock_hz <= 0) return c;
  const uint32_t bits = std::max<uint32_t>(1, hw.precision_bits);
  // Lanes process 8 / bits elements each per cycle at low precision.
  const double low_rate = hw.lanes * (8.0 / bits);
  const double refine_rate = std::max(1.0, hw.lanes / 4.0);
  const double scan_cycles = std::ceil(vectors * double(dim) / low_rate);
  const double refine_cycles = std::ceil(refined * double(dim) / refine_rate);
  const double sort_cycles = static_cast<double>(refined);
  const double compute_s =
      (std::max({scan_cycles, refine_cycles, sort_cycles}) +
       hw.pipeline_fill_cycles) /
      hw.clock_hz;
  // Summaries stream at low precision; refined ones again at 16 bits.
  const uint64_t payload = CeilDiv(vectors * dim * bits, 8) + refined * dim * 2;
  c.dram_bytes = CeilDiv(payload, hw.burst_bytes) * hw.burst_bytes;
  const double dram_s = hw.dram_bandwidth_bytes_per_s > 0
                            ? c.dram_bytes / hw.dram_bandwidth_bytes_per_s
                            : 0;
  c.seconds = std::max(compute_s, dram_s);
  c.joules = (c.dram_bytes * hw.dram_pj_per_byte +
              (vectors * double(dim) + 4.0 * refined * dim) * hw.mac_pj) *
             1e-12;
  return c;
}

SimCost MoveCost(const SimHardware& hw, uint64_t bytes, uint64_t offset,
                 bool layer_major, uint32_t rows) {
  SimCost c;
  if (bytes == 0 || hw.burst_bytes == 0) return c;
  const uint64_t misalign = offset % hw.burst_bytes;
  uint64_t bursts = 0, transactions = 0;
  if (layer_major || rows <= 1) {
    bursts = CeilDiv(misalign + bytes, hw.burst_bytes);
    transactions = 1;
  } else {
    const uint64_t row = CeilDiv(bytes, rows);
    bursts = rows * CeilDiv(misalign + row, hw.burst_bytes);
    transactions = rows;
  }
  c.dram_bytes = bursts * hw.burst_bytes;
  const double transfer_s = hw.dram_bandwidth_bytes_per_s > 0
                                ? c.dram_bytes / hw.dram_bandwidth_bytes_per_s
                                : 0;
  const double setup_s =
      hw.clock_hz > 0
          ? transactions * double(hw.transaction_setup_cycles) / hw.clock_hz
          : 0;
  c.seconds = transfer_s + setup_s;
  c.joules = c.dram_bytes * hw.dram_pj_per_byte * 1e-12;
  return c;
}

SimCost InjectionCost(const SimHardware& hw, const StageItem* items, size_t n,
                      uint64_t buffer_bytes) {
  SimCost total;
  const uint64_t half = std::max<uint64_t>(
      1, hw.double_buffering ? buffer_bytes / 2 : buffer_bytes);
  double pipeline = 0, prev_consume = 0;
  bool first = true;
  auto chunk = [&](uint64_t bytes, uint64_t offset, bool layer_major,
                   uint32_t rows) {
    const SimCost m = MoveCost(hw, bytes, offset, layer_major, rows);
    const double consume =
        hw.sram_read_bytes_per_s > 0 ? bytes / hw.sram_read_bytes_per_s : 0;
    if (!hw.double_buffering) {
      pipeline += m.seconds + consume;
    } else if (first) {
      pipeline += m.seconds;
    } else {
      pipeline += std::max(m.seconds, prev_consume);
    }
    first = false;
    prev_consume = consume;
    total.dram_bytes += m.dram_bytes;
    total.joules += m.joules;
  };
  for (size_t i = 0; i < n; ++i) {
    const StageItem& it = items[i];
    if (it.bytes == 0) continue;
    if (it.layer_major || it.rows <= 1) {
      for (uint64_t done = 0; done < it.bytes;) {
        const uint64_t b = std::min(half, it.bytes - done);
        chunk(b, it.offset + done, true, 1);
        done += b;
      }
    } else {
      const uint64_t row = CeilDiv(it.bytes, it.rows);
      const uint64_t per_chunk = std::max<uint64_t>(1, half / row);
      for (uint64_t r = 0; r < it.rows; r += per_chunk) {
        const uint64_t rows = std::min<uint64_t>(per_chunk, it.rows - r);
        const uint64_t b = std::min(rows * row, it.bytes - r * row);
        chunk(b, it.offset, false, static_cast<uint32_t>(rows));
      }
    }
  }
  if (hw.double_buffering && !first) pipeline += prev_consume;
  total.seconds = pipeline;
  return total;
}

uint64_t StagingBytesFor(const SimHardware& hw, const StageItem* items,
                         size_t n) {
  const uint64_t g = std::max<uint64_t>(1, hw.sram_granule_bytes);
  uint64_t largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, items[i].bytes);
  const uint64_t want = CeilDiv(largest * (hw.double_buffering ? 2 : 1), g) * g;
  const uint64_t most = hw.sram_bytes > g ? (hw.sram_bytes / g - 1) * g : g;
  return std::clamp(want, g, std::max(g, most));
}

}  // namespace kvmem
