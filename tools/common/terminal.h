// Terminal output of the `kvmem` CLI: progress bars for long runs and small
// text plots (bars, histograms) where a picture reads faster than numbers.
//
// Progress bars are drawn on stderr only when it is a terminal, so logs,
// pipes, CI output and --json stay clean; KVMEM_PROGRESS=1 forces them on,
// KVMEM_PROGRESS=0 off.
//
// Thread safety: ProgressBar::Add may be called from any thread; the rest
// are pure functions.
#ifndef KVMEM_TOOLS_COMMON_TERMINAL_H_
#define KVMEM_TOOLS_COMMON_TERMINAL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvmem {

// `width` cells: '#' for the done fraction (clamped to [0, 1]), '.' for the
// rest.
std::string Bar(double fraction, int width);

// One line: "label [####......]  45%  108/240 frames  12 s, eta 15 s"; the
// bar shrinks so the line fits `width` columns (at least 10 cells).
std::string RenderProgress(const std::string& label, uint64_t done,
                           uint64_t total, const std::string& unit,
                           double elapsed_s, int width);

// A text histogram of values over `rows` log-spaced buckets from the
// smallest to the largest value, one line per bucket:
//   "   120 -    240 us |##########          38"
// The longest bar is `width` cells. Empty for no values.
std::string Histogram(std::vector<double> values, int rows, int width,
                      const std::string& unit);

// Whether progress bars are drawn (stderr is a terminal, or KVMEM_PROGRESS).
bool ProgressEnabled();

class ProgressBar {
 public:
  // Starts redrawing every 200 ms when ProgressEnabled().
  ProgressBar(std::string label, uint64_t total, std::string unit);
  ~ProgressBar();  // Draws the final state and ends the line.
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Add(uint64_t n = 1) { done_.fetch_add(n, std::memory_order_relaxed); }
  void Set(uint64_t done) { done_.store(done, std::memory_order_relaxed); }
  bool enabled() const { return enabled_; }

 private:
  void Draw();

  const std::string label_, unit_;
  const uint64_t total_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvmem

#endif  // KVMEM_TOOLS_COMMON_TERMINAL_H_
