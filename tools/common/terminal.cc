#include "tools/common/terminal.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

namespace kvmem {
namespace {

int TerminalWidth() {
  winsize w{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 20) {
    return w.ws_col;
  }
  return 80;
}

std::string Seconds(double s) {
  if (s < 60) return absl::StrFormat("%.0f s", s);
  return absl::StrFormat("%dm%02ds", static_cast<int>(s) / 60,
                         static_cast<int>(s) % 60);
}

// A bucket bound with 3 significant digits.
std::string Bound(double v) {
  if (v >= 100 || v == std::floor(v)) return absl::StrFormat("%.0f", v);
  if (v >= 10) return absl::StrFormat("%.1f", v);
  return absl::StrFormat("%.2f", v);
}

}  // namespace

std::string Bar(double fraction, int width) {
  if (!(fraction >= 0)) fraction = 0;  // NaN too.
  fraction = std::min(fraction, 1.0);
  const int full = static_cast<int>(std::lround(fraction * width));
  return std::string(full, '#') + std::string(width - full, '.');
}

std::string RenderProgress(const std::string& label, uint64_t done,
                           uint64_t total, const std::string& unit,
                           double elapsed_s, int width) {
  const double f = total == 0 ? 1.0 : static_cast<double>(done) / total;
  std::string tail = absl::StrFormat(" %3d%%  %d/%d %s  %s",
                                     static_cast<int>(std::min(f, 1.0) * 100),
                                     done, total, unit, Seconds(elapsed_s));
  if (done > 0 && done < total) {
    tail += ", eta " + Seconds(elapsed_s / f - elapsed_s);
  }
  const int cells =
      std::max(10, width - static_cast<int>(label.size() + tail.size()) - 3);
  return label + " [" + Bar(f, cells) + "]" + tail;
}

std::string Histogram(std::vector<double> values, int rows, int width,
                      const std::string& unit) {
  values.erase(std::remove_if(values.begin(), values.end(),
                              [](double v) { return !(v > 0); }),
               values.end());
  if (values.empty() || rows < 1) return "";
  std::sort(values.begin(), values.end());
  const double lo = values.front(), hi = values.back();
  if (hi == lo) rows = 1;  // One value: one bucket.
  const double step = hi > lo ? std::log(hi / lo) / rows : 1.0;
  std::vector<uint64_t> counts(rows, 0);
  for (double v : values) {
    int b = hi > lo ? static_cast<int>(std::log(v / lo) / step) : 0;
    counts[std::clamp(b, 0, rows - 1)]++;
  }
  const uint64_t most = *std::max_element(counts.begin(), counts.end());
  std::string out;
  for (int b = 0; b < rows; ++b) {
    const double a = lo * std::exp(step * b);
    const double z = b + 1 == rows ? hi : lo * std::exp(step * (b + 1));
    const int cells = static_cast<int>(
        std::lround(static_cast<double>(counts[b]) / most * width));
    out += absl::StrFormat("  %8s - %8s %s |%-*s %d\n", Bound(a), Bound(z),
                           unit, width, std::string(cells, '#'), counts[b]);
  }
  return out;
}

bool ProgressEnabled() {
  if (const char* env = std::getenv("KVMEM_PROGRESS")) {
    return std::strcmp(env, "0") != 0;
  }
  return ::isatty(STDERR_FILENO) == 1;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(ProgressEnabled()),
      start_(std::chrono::steady_clock::now()) {
  if (!enabled_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200),
                         [this] { return stop_; })) {
      Draw();
    }
  });
}

ProgressBar::~ProgressBar() {
  if (!enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  Draw();
  std::fputc('\n', stderr);
}

void ProgressBar::Draw() {
  const double el =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  const std::string line =
      RenderProgress(label_, done_.load(std::memory_order_relaxed), total_,
                     unit_, el, TerminalWidth() - 1);
  std::fprintf(stderr, "\r%s\033[K", line.c_str());
  std::fflush(stderr);
}

}  // namespace kvmem
