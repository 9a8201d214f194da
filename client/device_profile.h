// Hardware profiles of edge devices (deploy/profiles/*.toml), read by
// `kvmem roofline` and the simulated accelerator backend.
//
// Format: a small TOML subset, one `key = number` per line; `#` starts a
// comment (each number's source or "assumption" is written there); a
// `name = "..."` line names the device. Unknown keys are kept (other tools
// read them); a malformed line is an error naming the file and line.
#ifndef KVMEM_CLIENT_DEVICE_PROFILE_H_
#define KVMEM_CLIENT_DEVICE_PROFILE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

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

}  // namespace kvmem

#endif  // KVMEM_CLIENT_DEVICE_PROFILE_H_
