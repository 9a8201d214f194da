// The helpers behind kvmem-server --huge_pages (server/ops/huge_pages.h);
// tests/integration/config_test.cc checks the started-again server.
#include "server/ops/huge_pages.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvmem {
namespace {

TEST(HugePagesTest, ModeIsTheBracketedWord) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/enabled";
  std::ofstream(path) << "always [madvise] never\n";
  EXPECT_EQ(TransparentHugePageMode(path.c_str()), "madvise");
  std::ofstream(path) << "[always] madvise never\n";
  EXPECT_EQ(TransparentHugePageMode(path.c_str()), "always");
  std::ofstream(path) << "always madvise [never]\n";
  EXPECT_EQ(TransparentHugePageMode(path.c_str()), "never");
  std::ofstream(path) << "garbage\n";
  EXPECT_EQ(TransparentHugePageMode(path.c_str()), "");
  EXPECT_EQ(TransparentHugePageMode((dir.path() + "/absent").c_str()), "");
}

TEST(HugePagesTest, TunablesAreAddedOnceAndTheCallersChoiceStands) {
  EXPECT_EQ(TunablesWithHugePages(nullptr), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(TunablesWithHugePages(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(TunablesWithHugePages("glibc.malloc.arena_max=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  // Set already (by us before the restart, or by the operator): unchanged.
  EXPECT_EQ(TunablesWithHugePages("glibc.malloc.hugetlb=1"), "");
  EXPECT_EQ(TunablesWithHugePages("a=1:glibc.malloc.hugetlb=0"), "");
}

}  // namespace
}  // namespace kvmem
