#include "engine/accel/device_profile.h"

#include <toml++/toml.h>

#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kvmem {

double DeviceProfile::Get(const std::string& key, double fallback) const {
  auto it = values.find(key);
  return it == values.end() ? fallback : it->second;
}

absl::StatusOr<DeviceProfile> ParseDeviceProfile(const std::string& text,
                                                 const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", static_cast<uint32_t>(e.source().begin.line),
                     ":", static_cast<uint32_t>(e.source().begin.column), ": ",
                     std::string(e.description())));
  }
  DeviceProfile p;
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    // (A lambda may not capture a structured binding in C++17: copy.)
    const uint32_t line = static_cast<uint32_t>(k.source().begin.line);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", line, ": ", key, " ", why));
    };
    if (key == "name") {
      std::optional<std::string> name = v.value_exact<std::string>();
      if (!name) return bad("must be a string");
      p.name = *name;
      continue;
    }
    // Integers and floats alike (value<double> converts an integer).
    std::optional<double> number;
    if (v.is_integer() || v.is_floating_point()) number = v.value<double>();
    if (!number) return bad("must be a number");
    p.values[key] = *number;
  }
  return p;
}

absl::StatusOr<DeviceProfile> LoadDeviceProfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    return absl::NotFoundError(absl::StrCat("profile ", path, ": cannot open"));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseDeviceProfile(ss.str(), path);
}

absl::StatusOr<SimHardware> SimHardwareFromProfile(const DeviceProfile& p) {
  SimHardware hw;
  // Each key: its unit's scale to SimHardware's, its range (in the file's
  // unit), and where it goes.
  struct Key {
    const char* name;
    double scale, lo, hi;
    double current;
    std::function<void(double)> set;
  };
  auto u32 = [](uint32_t* f) { return [f](double v) { *f = uint32_t(v); }; };
  auto u64 = [](uint64_t* f) { return [f](double v) { *f = uint64_t(v); }; };
  auto dbl = [](double* f) { return [f](double v) { *f = v; }; };
  const Key keys[] = {
      {"sim_lanes", 1, 1, 65536, double(hw.lanes), u32(&hw.lanes)},
      {"sim_clock_mhz", 1e6, 1, 1e5, hw.clock_hz, dbl(&hw.clock_hz)},
      {"sim_precision_bits", 1, 1, 8, double(hw.precision_bits),
       u32(&hw.precision_bits)},
      {"sim_pipeline_fill_cycles", 1, 0, 1e6, double(hw.pipeline_fill_cycles),
       u32(&hw.pipeline_fill_cycles)},
      {"dram_bandwidth_gbs", 1e9, 1e-3, 1e5, hw.dram_bandwidth_bytes_per_s,
       dbl(&hw.dram_bandwidth_bytes_per_s)},
      {"dram_burst_bytes", 1, 1, 1 << 20, double(hw.burst_bytes),
       u32(&hw.burst_bytes)},
      {"dma_setup_cycles", 1, 0, 1e6, double(hw.transaction_setup_cycles),
       u32(&hw.transaction_setup_cycles)},
      {"dram_pj_per_byte", 1, 0, 1e6, hw.dram_pj_per_byte,
       dbl(&hw.dram_pj_per_byte)},
      {"sim_mac_pj", 1, 0, 1e6, hw.mac_pj, dbl(&hw.mac_pj)},
      {"sim_sram_kib", 1024, 16, 1 << 20, double(hw.sram_bytes),
       u64(&hw.sram_bytes)},
      {"sim_sram_granule_kib", 1024, 1, 1 << 16, double(hw.sram_granule_bytes),
       u64(&hw.sram_granule_bytes)},
      {"sim_sram_read_gbs", 1e9, 1e-3, 1e5, hw.sram_read_bytes_per_s,
       dbl(&hw.sram_read_bytes_per_s)},
      {"sim_double_buffering", 1, 0, 1, hw.double_buffering ? 1.0 : 0.0,
       [&hw](double v) { hw.double_buffering = v != 0; }},
      {"sim_max_blocks_per_injection", 1, 1, 4096,
       double(hw.max_blocks_per_injection), u32(&hw.max_blocks_per_injection)},
      {"sim_arbitration_cycles", 1, 0, 1e6, double(hw.arbitration_cycles),
       u32(&hw.arbitration_cycles)},
      {"sim_recall_floor", 1, 0, 1, hw.recall_floor, dbl(&hw.recall_floor)},
  };
  for (const Key& k : keys) {
    const double v = p.Get(k.name, k.current / k.scale);
    if (!(v >= k.lo && v <= k.hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat("profile ", p.name, ": ", k.name, " is ", v,
                       "; must be in [", k.lo, ", ", k.hi, "]"));
    }
    k.set(v * k.scale);
  }
  if (hw.sram_granule_bytes * 2 > hw.sram_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile ", p.name, ": sim_sram_granule_kib is ",
        hw.sram_granule_bytes / 1024, "; the SRAM (sim_sram_kib ",
        hw.sram_bytes / 1024, ") must hold at least two granules"));
  }
  return hw;
}

}  // namespace kvmem
