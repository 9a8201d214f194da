// Helpers shared by the fuzz targets (tests/fuzz/*_fuzz.cc): a byte reader
// and a check that aborts (a finding) instead of returning.
#ifndef KVMEM_TESTS_FUZZ_FUZZ_UTIL_H_
#define KVMEM_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define FUZZ_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, \
                   __LINE__, #cond);                                   \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

namespace kvmem::fuzz {

// Reads fixed-size values and byte strings off the input; past the end it
// yields zeros and empty strings.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  template <typename T>
  T Take() {
    T v{};
    const size_t k = n_ < sizeof(T) ? n_ : sizeof(T);
    std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  std::string Bytes(size_t k) {
    if (k > n_) k = n_;
    std::string s(reinterpret_cast<const char*>(p_), k);
    p_ += k;
    n_ -= k;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace kvmem::fuzz

#endif  // KVMEM_TESTS_FUZZ_FUZZ_UTIL_H_
