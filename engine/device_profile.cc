#include "engine/device_profile.h"

#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvmem {

double DeviceProfile::Get(const std::string& key, double fallback) const {
  auto it = values.find(key);
  return it == values.end() ? fallback : it->second;
}

absl::StatusOr<DeviceProfile> ParseDeviceProfile(const std::string& text,
                                                 const std::string& origin) {
  DeviceProfile p;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    absl::string_view s = line;
    bool quoted = false;
    for (size_t i = 0; i < s.size(); ++i) {  // Cut the comment.
      if (s[i] == '"') quoted = !quoted;
      if (s[i] == '#' && !quoted) {
        s = s.substr(0, i);
        break;
      }
    }
    s = absl::StripAsciiWhitespace(s);
    if (s.empty()) continue;
    const size_t eq = s.find('=');
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ":", n, ": ", why, ": \"", line, "\""));
    };
    if (eq == absl::string_view::npos) return bad("expected key = value");
    const std::string key(absl::StripAsciiWhitespace(s.substr(0, eq)));
    absl::string_view value = absl::StripAsciiWhitespace(s.substr(eq + 1));
    if (key.empty()) return bad("empty key");
    if (key == "name") {
      if (value.size() < 2 || value.front() != '"' || value.back() != '"') {
        return bad("name must be a quoted string");
      }
      p.name = std::string(value.substr(1, value.size() - 2));
      continue;
    }
    double v;
    if (!absl::SimpleAtod(value, &v)) return bad("value is not a number");
    p.values[key] = v;
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
  struct Key {
    const char* name;
    double scale, lo, hi;
  };
  auto get = [&](const Key& k, double fallback, double* out) -> absl::Status {
    const double v = p.Get(k.name, fallback / k.scale) * k.scale;
    if (!(v >= k.lo && v <= k.hi)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "profile ", p.name, ": ", k.name, " is ", v / k.scale,
          "; must be in [", k.lo / k.scale, ", ", k.hi / k.scale, "]"));
    }
    *out = v;
    return absl::OkStatus();
  };
  double lanes, clock, bits, fill, bw, burst, setup, pj_byte, pj_mac;
  for (auto [key, fallback, out] :
       std::initializer_list<std::tuple<Key, double, double*>>{
           {{"sim_lanes", 1, 1, 65536}, double(hw.lanes), &lanes},
           {{"sim_clock_mhz", 1e6, 1e6, 1e11}, hw.clock_hz, &clock},
           {{"sim_precision_bits", 1, 1, 8}, double(hw.precision_bits), &bits},
           {{"sim_pipeline_fill_cycles", 1, 0, 1e6},
            double(hw.pipeline_fill_cycles),
            &fill},
           {{"dram_bandwidth_gbs", 1e9, 1e6, 1e14},
            hw.dram_bandwidth_bytes_per_s,
            &bw},
           {{"dram_burst_bytes", 1, 1, 1 << 20},
            double(hw.burst_bytes),
            &burst},
           {{"dma_setup_cycles", 1, 0, 1e6},
            double(hw.transaction_setup_cycles),
            &setup},
           {{"dram_pj_per_byte", 1, 0, 1e6}, hw.dram_pj_per_byte, &pj_byte},
           {{"sim_mac_pj", 1, 0, 1e6}, hw.mac_pj, &pj_mac}}) {
    if (absl::Status s = get(key, fallback, out); !s.ok()) return s;
  }
  hw.lanes = static_cast<uint32_t>(lanes);
  hw.clock_hz = clock;
  hw.precision_bits = static_cast<uint32_t>(bits);
  hw.pipeline_fill_cycles = static_cast<uint32_t>(fill);
  hw.dram_bandwidth_bytes_per_s = bw;
  hw.burst_bytes = static_cast<uint32_t>(burst);
  hw.transaction_setup_cycles = static_cast<uint32_t>(setup);
  hw.dram_pj_per_byte = pj_byte;
  hw.mac_pj = pj_mac;
  return hw;
}

}  // namespace kvmem
