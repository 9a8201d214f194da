// The CLI's progress line and text plots (tools/common/terminal.h).
#include "tools/common/terminal.h"

#include <cstdlib>
#include <sstream>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(TerminalTest, BarFillsItsShareAndClamps) {
  EXPECT_EQ(Bar(0.0, 10), "..........");
  EXPECT_EQ(Bar(0.5, 10), "#####.....");
  EXPECT_EQ(Bar(1.0, 4), "####");
  EXPECT_EQ(Bar(7.0, 4), "####");
  EXPECT_EQ(Bar(-1.0, 4), "....");
  EXPECT_EQ(Bar(0.0 / 0.0, 4), "....");
}

TEST(TerminalTest, ProgressLineFitsTheWidthAndEstimatesTheRest) {
  const std::string line =
      RenderProgress("kvmem demo", 60, 240, "frames", 10.0, 80);
  EXPECT_EQ(line.size(), 80u) << line;
  EXPECT_EQ(line.rfind("kvmem demo [", 0), 0u) << line;
  EXPECT_NE(line.find("]  25%  60/240 frames  10 s, eta 30 s"),
            std::string::npos)
      << line;
  // A quarter of the bar's cells are filled.
  const size_t open = line.find('['), close = line.find(']');
  const std::string bar = line.substr(open + 1, close - open - 1);
  EXPECT_EQ(std::count(bar.begin(), bar.end(), '#'),
            static_cast<long>(bar.size() + 2) / 4);
  // Done: no eta; minutes past 60 s; a narrow terminal keeps 10 cells.
  const std::string done = RenderProgress("x", 5, 5, "f", 75.0, 20);
  EXPECT_NE(done.find("100%  5/5 f  1m15s"), std::string::npos) << done;
  EXPECT_EQ(done.find("eta"), std::string::npos);
  EXPECT_NE(done.find("[##########]"), std::string::npos) << done;
}

TEST(TerminalTest, HistogramCountsEveryValueInLogBuckets) {
  std::vector<double> v;
  for (int i = 0; i < 90; ++i) v.push_back(100);  // Bucket 0.
  for (int i = 0; i < 9; ++i) v.push_back(1000);  // Middle.
  v.push_back(10000);                             // Last.
  const std::string h = Histogram(v, 4, 20, "us");
  std::istringstream in(h);
  std::string line;
  std::vector<int> counts;
  int full_bars = 0;
  while (std::getline(in, line)) {
    counts.push_back(std::atoi(line.substr(line.rfind(' ') + 1).c_str()));
    full_bars += line.find(std::string(20, '#')) != std::string::npos;
  }
  ASSERT_EQ(counts.size(), 4u) << h;
  EXPECT_EQ(counts[0] + counts[1] + counts[2] + counts[3], 100) << h;
  EXPECT_EQ(counts[0], 90) << h;
  EXPECT_EQ(counts[3], 1) << h;
  EXPECT_EQ(full_bars, 1) << h;  // Only the largest bucket is full width.
  EXPECT_NE(h.find("100 -"), std::string::npos) << h;
  EXPECT_NE(h.find("10000 us"), std::string::npos) << h;
  EXPECT_EQ(Histogram({}, 4, 20, "us"), "");
  EXPECT_EQ(Histogram({5, 5}, 3, 10, "ms"),
            "         5 -        5 ms |########## 2\n");
}

TEST(TerminalTest, ProgressFollowsTheEnvironment) {
  ::setenv("KVMEM_PROGRESS", "0", 1);
  EXPECT_FALSE(ProgressEnabled());
  ::setenv("KVMEM_PROGRESS", "1", 1);
  EXPECT_TRUE(ProgressEnabled());
  ::unsetenv("KVMEM_PROGRESS");
}

}  // namespace
}  // namespace kvmem
