#include "tools/bench/bench_util.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/codec/dtype.h"

namespace kvmem {

double SelfCpuSeconds() {
  timespec t{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

ProcSample SampleProcess(int pid) {
  ProcSample s;
  if (pid < 0) return s;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  // Fields after the command (which may hold spaces) start after ')'.
  const size_t close = line.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    s.cpu_s = static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      s.rss_mib = std::stod(line.substr(6)) / 1024.0;  // kB.
    }
  }
  std::ifstream io(absl::StrCat("/proc/", pid, "/io"));
  while (std::getline(io, line)) {
    if (line.rfind("write_bytes:", 0) == 0) {
      s.disk_write_bytes = std::stod(line.substr(12));
    }
  }
  return s;
}

std::string RandomFp16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = u(rng);
  std::string out(2 * n, '\0');
  EncodeFromFloat(f.data(), n, DType::kFp16,
                  reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// The response's sets' tokens per block (all of a block's tokens where a
// set takes it whole), sorted by block.
std::vector<v1::BlockTokens> RecalledTokens(const v1::RecallResponse& resp) {
  std::map<uint64_t, std::set<uint32_t>> tokens;
  auto add = [&](const v1::RecalledBlock& b) {
    std::set<uint32_t>& t = tokens[b.block_id()];
    if (b.token_offsets().empty()) {
      for (uint32_t j = 0; j < b.token_count(); ++j) t.insert(j);
    }
    t.insert(b.token_offsets().begin(), b.token_offsets().end());
  };
  for (const v1::RecalledBlock& b : resp.blocks()) add(b);
  for (const v1::LayerRecallSet& set : resp.layer_sets()) {
    for (const v1::RecalledBlock& b : set.blocks()) add(b);
  }
  std::vector<v1::BlockTokens> out;
  for (const auto& [id, t] : tokens) {
    v1::BlockTokens& b = out.emplace_back();
    b.set_block_id(id);
    b.mutable_token_offsets()->Assign(t.begin(), t.end());
  }
  return out;
}

uint64_t TokenCount(const std::vector<v1::BlockTokens>& tokens) {
  uint64_t n = 0;
  for (const v1::BlockTokens& b : tokens) n += b.token_offsets_size();
  return n;
}

}  // namespace kvmem
