// A throw-away etcd for tests: one member on loopback ports, its data and
// log under a directory the test owns; started and stopped by the test
// (restartable on the same data and ports). KVMEM_ETCD names the binary.
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
  explicit EtcdProcess(std::string dir)
      : dir_(std::move(dir)),
        client_port_(FreeLoopbackPort()),
        peer_port_(FreeLoopbackPort()) {
    std::filesystem::create_directories(dir_);
  }
  ~EtcdProcess() { Stop(); }

  static bool Installed() { return std::filesystem::exists(KVMEM_ETCD); }
  std::string endpoint() const {
    return absl::StrCat("127.0.0.1:", client_port_);
  }

  // Starts etcd and waits until it answers; false when it does not.
  bool Start() {
    const std::string client = absl::StrCat("http://", endpoint());
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> args = {KVMEM_ETCD,
                                     "--name=test",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=test=" + peer,
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

  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  std::string dir_;
  int client_port_;
  int peer_port_;
  pid_t pid_ = -1;
};

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_DISTRIBUTED_ETCD_PROCESS_H_
