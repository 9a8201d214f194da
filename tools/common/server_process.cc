#include "tools/common/server_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "client/cpp/kvmem_client.h"

namespace kvmem {

ServerProcess::ServerProcess(ServerProcessOptions options)
    : options_(std::move(options)) {}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) Stop();
}

std::string ServerProcess::tcp_target() const {
  if (options_.listen.empty()) return "";
  return "127.0.0.1:" + std::to_string(tcp_port_);
}

std::string ServerProcess::target() const {
  if (!options_.unix_socket.empty()) return "unix:" + options_.unix_socket;
  return tcp_target();
}

bool ServerProcess::Start(std::chrono::milliseconds timeout,
                          std::string* error) {
  std::error_code ec;
  const std::filesystem::path parent =
      std::filesystem::path(options_.data_dir).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string port_file = options_.data_dir + ".port";
  ::unlink(port_file.c_str());
  std::vector<std::string> args = {
      options_.binary, "--data_dir=" + options_.data_dir,
      "--listen=" + options_.listen, "--unix_socket=" + options_.unix_socket,
      "--port_file=" + port_file};
  args.insert(args.end(), options_.extra_args.begin(),
              options_.extra_args.end());
  pid_ = ::fork();
  if (pid_ < 0) {
    *error = "fork failed";
    return false;
  }
  if (pid_ == 0) {
    if (!options_.log_file.empty()) {
      FILE* f = std::fopen(options_.log_file.c_str(), "a");
      if (f != nullptr) {
        ::dup2(fileno(f), STDERR_FILENO);
        ::dup2(fileno(f), STDOUT_FILENO);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s failed\n", argv[0]);
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      *error = "kvmem-server exited during start-up (see its log)";
      return false;
    }
    std::ifstream in(port_file);
    if (in >> tcp_port_) {
      auto client = KvmemClient::Connect(target());
      grpc::health::v1::HealthCheckResponse health;
      if (client->CheckHealth("kvmem.v1.KvMemory", &health).ok() &&
          health.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *error = "kvmem-server did not report SERVING in time";
  Kill();
  return false;
}

int ServerProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string FindServerBinary() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    std::string self(buf, static_cast<size_t>(n));
    const std::string dir = self.substr(0, self.rfind('/'));
    for (const std::string& candidate :
         {dir + "/kvmem-server", dir + "/../bin/kvmem-server"}) {
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "build/bin/kvmem-server";
}

std::unique_ptr<ScratchServer> ScratchServer::Start(
    const std::string& dir, const std::vector<std::string>& extra_args,
    std::string* error) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  ServerProcessOptions so;
  so.binary = FindServerBinary();
  so.data_dir = dir + "/data";
  so.unix_socket = dir + "/kvmem.sock";
  so.log_file = dir + "/server.log";
  so.extra_args = extra_args;
  auto process = std::make_unique<ServerProcess>(so);
  std::unique_ptr<ScratchServer> s(new ScratchServer(dir, std::move(process)));
  if (!s->process_->Start(std::chrono::seconds(60), error)) {
    std::ifstream log(so.log_file);
    std::string line, last;
    while (std::getline(log, line)) last = line;
    *error += " (" + so.binary + "; last log line: " + last + ")";
    return nullptr;
  }
  return s;
}

ScratchServer::~ScratchServer() {
  process_->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace kvmem
