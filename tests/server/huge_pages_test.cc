// The helpers behind kvmem-server --huge_pages (server/ops/huge_pages.h);
// tests/integration/config_test.cc checks the started-again server.
#include "server/ops/huge_pages.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/ops/config.h"
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

// The files a started-again server would read twice are found by the
// parser --config uses (server/ops/config.h).
TEST(HugePagesTest, FlagValuesAreFoundInEveryForm) {
  std::vector<std::string> args = {"kvmem-server",
                                   "--flagfile=/a.flags",
                                   "--listen=x",
                                   "--flagfile",
                                   "/b.flags",
                                   "-flagfile=/c.flags",
                                   "--flagfilex=/no",
                                   "--",
                                   "--flagfile=/not-a-flag"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  EXPECT_EQ(FlagValuesFromArgs(static_cast<int>(argv.size()), argv.data(),
                               "flagfile"),
            (std::vector<std::string>{"/a.flags", "/b.flags", "/c.flags"}));
  EXPECT_TRUE(
      FlagValuesFromArgs(static_cast<int>(argv.size()), argv.data(), "config")
          .empty());
  std::vector<std::string> configs = {"kvmem-server", "--config", "/a.toml",
                                      "-config=/b.toml"};
  std::vector<char*> cargv;
  for (std::string& a : configs) cargv.push_back(a.data());
  EXPECT_EQ(ConfigPathFromArgs(static_cast<int>(cargv.size()), cargv.data()),
            "/b.toml");
}

// Environment variables set for one test, restored after it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// The branches that return instead of starting again (an exec here would
// replace the test binary, so only those run).
TEST(HugePagesTest, AStartedAgainServerNeverStartsAgain) {
  ScopedEnv tunables("GLIBC_TUNABLES", nullptr);
  ScopedEnv marker(kHugePagesReexecMarker, "1");
  char arg0[] = "kvmem-server";
  char* argv[] = {arg0, nullptr};
  // The tunable did not arrive (as after a secure exec): no second exec.
  EXPECT_EQ(StartWithHugePages(argv, {}),
            "heap on 4 KiB pages: started again with glibc.malloc.hugetlb=1, "
            "which did not reach the new process (a secure exec drops "
            "glibc's tunables)");
  EXPECT_EQ(getenv(kHugePagesReexecMarker), nullptr);  // Not passed on.
}

TEST(HugePagesTest, AConfigThatCannotBeReadTwiceKeepsSmallPages) {
  ScopedEnv tunables("GLIBC_TUNABLES", nullptr);
  ScopedEnv marker(kHugePagesReexecMarker, nullptr);
  char arg0[] = "kvmem-server";
  char* argv[] = {arg0, nullptr};
  const std::string mode = TransparentHugePageMode();
  const std::string note = StartWithHugePages(argv, {"/dev/null"});
  if (mode == "always" || mode == "madvise") {
    EXPECT_EQ(note,
              "heap on 4 KiB pages: /dev/null is not a regular file, and "
              "starting again would read it twice");
  } else {
    EXPECT_EQ(note, "heap on 4 KiB pages: transparent huge pages are \"" +
                        (mode.empty() ? std::string("unknown") : mode) +
                        "\" here");
  }
  EXPECT_EQ(getenv("GLIBC_TUNABLES"), nullptr);
}

}  // namespace
}  // namespace kvmem
