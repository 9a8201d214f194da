#include "client/device_profile.h"

#include <fstream>
#include <sstream>

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

}  // namespace kvmem
