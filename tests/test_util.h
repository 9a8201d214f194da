// Helpers shared by kvmem tests: temporary directories and synthetic KV
// frames whose values are exact in fp16, so oracles can work from the floats
// the test generated rather than from the server's decoder.
#ifndef KVMEM_TESTS_TEST_UTIL_H_
#define KVMEM_TESTS_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

// ASan's quarantine holds freed memory: heap and RSS figures mean nothing
// there (GCC says __SANITIZE_ADDRESS__, clang __has_feature); the servers a
// test starts are built the same way as the test.
#if defined(__SANITIZE_ADDRESS__)
#define KVMEM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVMEM_TEST_ASAN 1
#endif
#endif
#ifndef KVMEM_TEST_ASAN
#define KVMEM_TEST_ASAN 0
#endif

#include "engine/codec/dtype.h"

namespace kvmem::testing {

// A field of /proc/<pid>/status in KiB ("VmRSS:", "VmHWM:"); 0 when it
// cannot be read.
inline double StatusKib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(field.size()));
  }
  return 0;
}

// A process's resident set (VmRSS) in KiB; 0 when it cannot be read.
inline double RssKib(pid_t pid) { return StatusKib(pid, "VmRSS:"); }

// A process's peak resident set (VmHWM) in KiB; 0 when it cannot be read.
inline double PeakRssKib(pid_t pid) { return StatusKib(pid, "VmHWM:"); }

// A loopback port nothing listens on right now (bound, read, closed).
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The whole file; empty when it cannot be read.
// The non-empty RocksDB write-ahead logs (*.log) in dir, oldest first.
inline std::vector<std::string> Wals(const std::string& dir) {
  std::vector<std::string> wals;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string p = entry.path().string();
    if (p.size() > 4 && p.compare(p.size() - 4, 4, ".log") == 0 &&
        std::filesystem::file_size(p) > 0) {
      wals.push_back(p);
    }
  }
  std::sort(wals.begin(), wals.end());
  return wals;
}

// The newest non-empty RocksDB write-ahead log (*.log) in dir; "" if none.
inline std::string NewestWal(const std::string& dir) {
  const std::vector<std::string> wals = Wals(dir);
  return wals.empty() ? std::string() : wals.back();
}

// Overwrites 16 bytes in the middle of a file (a corrupted record).
inline void FlipMiddleBytes(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(path) / 2));
  const std::string junk(16, '\x5a');
  f.write(junk.data(), junk.size());
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "kvmem-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct TestGeometry {
  uint32_t layers = 3;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 16;
  DType dtype = DType::kFp16;
};

// One frame's KV as floats, layer-major: [layer][K|V][head][token][dim].
struct FloatFrame {
  uint32_t tokens = 0;
  std::vector<float> values;

  float Key(const TestGeometry& g, uint32_t layer, uint32_t head, uint32_t tok,
            uint32_t d) const {
    const size_t slice = static_cast<size_t>(g.kv_heads) * tokens * g.head_dim;
    return values[2 * slice * layer +
                  (static_cast<size_t>(head) * tokens + tok) * g.head_dim + d];
  }
};

// Values are multiples of 1/64 in [-2, 2]: exact in fp16, bf16 and fp32.
inline FloatFrame RandomFrame(std::mt19937_64& rng, const TestGeometry& g,
                              uint32_t tokens) {
  std::uniform_int_distribution<int> q(-128, 128);
  FloatFrame f;
  f.tokens = tokens;
  f.values.resize(static_cast<size_t>(g.layers) * 2 * g.kv_heads * tokens *
                  g.head_dim);
  for (auto& v : f.values) v = q(rng) / 64.0f;
  return f;
}

inline std::string Encode(const FloatFrame& f, DType dtype) {
  std::string out(f.values.size() * DTypeBytes(dtype), '\0');
  EncodeFromFloat(f.values.data(), f.values.size(), dtype,
                  reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// Mean key over the frames' tokens for the given layers:
// [layer][head][dim] in double, the oracle of a block summary.
inline std::vector<double> MeanKey(const TestGeometry& g,
                                   const std::vector<const FloatFrame*>& frames,
                                   const std::vector<uint32_t>& layers) {
  std::vector<double> sum(layers.size() * g.kv_heads * g.head_dim, 0.0);
  uint64_t tokens = 0;
  for (const FloatFrame* f : frames) {
    for (size_t li = 0; li < layers.size(); ++li) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t t = 0; t < f->tokens; ++t) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            sum[(li * g.kv_heads + h) * g.head_dim + d] +=
                f->Key(g, layers[li], h, t, d);
          }
        }
      }
    }
    tokens += f->tokens;
  }
  for (auto& s : sum) s /= static_cast<double>(tokens);
  return sum;
}

// n draws of N(0, sd^2).
inline std::vector<float> RandomNormal(std::mt19937_64& rng, size_t n,
                                       float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> RandomQuery(std::mt19937_64& rng, size_t dim) {
  return RandomNormal(rng, dim, 1.0f);
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_TEST_UTIL_H_
