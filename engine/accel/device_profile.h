// Hardware profiles of edge devices (deploy/profiles/*.toml), read by
// `kvmem roofline` and the simulated accelerator backend (kvmem-server
// --accelerator_profile).
//
// Format: TOML, read with toml++ like the server's config file: top-level
// `key = number` pairs, `#` comments (each number's source or "assumption"
// is written there), and `name = "..."` naming the device. Unknown keys are
// kept (other tools read them); a file that is not TOML, or a value that is
// not a number, is an error naming the file and line.
#ifndef KVMEM_ENGINE_ACCEL_DEVICE_PROFILE_H_
#define KVMEM_ENGINE_ACCEL_DEVICE_PROFILE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/accel/sim_model.h"

namespace kvmem {

struct DeviceProfile {
  std::string name;
  std::map<std::string, double> values;

  // The value of key, or fallback when absent.
  double Get(const std::string& key, double fallback) const;
};

absl::StatusOr<DeviceProfile> ParseDeviceProfile(const std::string& text,
                                                 const std::string& origin);
absl::StatusOr<DeviceProfile> LoadDeviceProfile(const std::string& path);

// The simulated accelerator's hardware from a profile: sim_lanes,
// sim_clock_mhz, sim_precision_bits, sim_pipeline_fill_cycles,
// dram_bandwidth_gbs, dram_burst_bytes, dma_setup_cycles, dram_pj_per_byte,
// sim_mac_pj, sim_sram_kib, sim_sram_granule_kib, sim_sram_read_gbs,
// sim_double_buffering (0/1), sim_max_blocks_per_injection,
// sim_arbitration_cycles, sim_recall_floor; SimHardware's defaults where a
// key is absent. INVALID_ARGUMENT naming the key for a value out of range
// (or an SRAM smaller than two granules).
absl::StatusOr<SimHardware> SimHardwareFromProfile(const DeviceProfile& p);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_ACCEL_DEVICE_PROFILE_H_
