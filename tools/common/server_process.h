// ServerProcess: starts kvmem-server as a child process on a unix socket and
// stops it with SIGTERM (or SIGKILL, for crash tests). Used by `kvmem demo`
// and by integration tests that need the real server binary.
//
// Thread safety: none; owned by one thread.
#ifndef KVMEM_TOOLS_COMMON_SERVER_PROCESS_H_
#define KVMEM_TOOLS_COMMON_SERVER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kvmem {

struct ServerProcessOptions {
  std::string binary;  // Path of kvmem-server.
  std::string data_dir;
  std::string unix_socket;  // Empty: none.
  std::string listen;       // TCP host:port, e.g. "127.0.0.1:0"; empty: none.
  std::vector<std::string> extra_args;
  std::string log_file;  // Empty: inherit stderr.
};

class ServerProcess {
 public:
  explicit ServerProcess(ServerProcessOptions options);
  ~ServerProcess();  // Stops the server if running.

  // Starts the server and waits until it reports SERVING over the unix
  // socket (or TCP when no socket is set). Returns false with *error set.
  bool Start(std::chrono::milliseconds timeout, std::string* error);
  // SIGTERM and wait; returns the exit status (-1 when not running).
  int Stop();
  // SIGKILL and wait, as a crash would.
  void Kill();

  // "unix:<path>" when a socket is set, else "127.0.0.1:<port>".
  std::string target() const;
  std::string tcp_target() const;  // Empty when TCP is off.
  pid_t pid() const { return pid_; }

 private:
  ServerProcessOptions options_;
  pid_t pid_ = -1;
  int tcp_port_ = 0;
};

// The kvmem-server binary next to the running executable, or in build/bin.
std::string FindServerBinary();

// A kvmem-server a command starts for itself on a unix socket, with its data
// in a scratch directory: stopped and the directory (with its socket and
// log) removed when this goes away, on every way out.
class ScratchServer {
 public:
  // Starts it with data in `dir` (must not exist yet or be disposable).
  // nullptr with *error set on failure.
  static std::unique_ptr<ScratchServer> Start(
      const std::string& dir, const std::vector<std::string>& extra_args,
      std::string* error);
  ~ScratchServer();

  ServerProcess& process() { return *process_; }
  std::string target() const { return process_->target(); }

 private:
  ScratchServer(std::string dir, std::unique_ptr<ServerProcess> process)
      : dir_(std::move(dir)), process_(std::move(process)) {}
  std::string dir_;
  std::unique_ptr<ServerProcess> process_;
};

}  // namespace kvmem

#endif  // KVMEM_TOOLS_COMMON_SERVER_PROCESS_H_
