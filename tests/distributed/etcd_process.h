// A throw-away etcd for tests: one member on loopback ports, its data and
// log under a directory the test owns; started and stopped by the test
// (restartable on the same data and ports), alone or as a member of a
// cluster the test launches. KVMEM_ETCD names the binary.
#ifndef KVMEM_TESTS_DISTRIBUTED_ETCD_PROCESS_H_
#define KVMEM_TESTS_DISTRIBUTED_ETCD_PROCESS_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/ownership/etcd_client.h"
#include "tests/test_util.h"

namespace kvmem::testing {

class EtcdProcess {
 public:
  explicit EtcdProcess(std::string dir, std::string name = "test")
      : dir_(std::move(dir)),
        name_(std::move(name)),
        client_port_(FreeLoopbackPort()),
        peer_port_(FreeLoopbackPort()) {
    std::filesystem::create_directories(dir_);
  }
  ~EtcdProcess() { Stop(); }

  static bool Installed() { return std::filesystem::exists(KVMEM_ETCD); }
  // Why a test that needs etcd skips when it is not Installed().
  static std::string Missing() {
    return std::string(KVMEM_ETCD) +
           " missing: run deploy/bootstrap.sh (installs etcd-server)";
  }
  std::string endpoint() const {
    return absl::StrCat("127.0.0.1:", client_port_);
  }
  // name=peer URL, for --initial-cluster.
  std::string peer() const {
    return absl::StrCat(name_, "=http://127.0.0.1:", peer_port_);
  }

  // Starts etcd and waits until it answers; false when it does not.
  bool Start() {
    Launch();
    return WaitReady();
  }

  // Starts the process (a member of `initial_cluster`, the members' peer()
  // joined by commas; empty: a cluster of this one) without waiting.
  void Launch(const std::string& initial_cluster = "") {
    const std::string client = absl::StrCat("http://", endpoint());
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> args = {
        KVMEM_ETCD,
        "--name=" + name_,
        "--data-dir=" + dir_ + "/data",
        "--listen-client-urls=" + client,
        "--advertise-client-urls=" + client,
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=" +
            (initial_cluster.empty() ? this->peer() : initial_cluster),
        "--logger=zap"};
    pid_ = ::fork();
    if (pid_ == 0) {
      const int out = ::open((dir_ + "/etcd.out").c_str(),
                             O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }

  // Waits (30 s at most) until this member answers a read.
  bool WaitReady() {
    EtcdOptions o;
    o.endpoint = endpoint();
    o.call_timeout = absl::Seconds(1);
    auto c = EtcdClient::Connect(o);
    if (!c.ok()) return false;
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
      if ((*c)->Get("kvmem-probe").ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // SIGKILL: the member dies as a machine would.
  void Kill() { End(SIGKILL); }
  void Stop() { End(SIGTERM); }

 private:
  void End(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string dir_;
  std::string name_;
  int client_port_;
  int peer_port_;
  pid_t pid_ = -1;
};

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_DISTRIBUTED_ETCD_PROCESS_H_
