// Scraping a real kvmem-server's /metrics in tests (the server started
// with --metrics_listen): the body, and its samples by name.
#ifndef KVMEM_TESTS_METRICS_SCRAPE_H_
#define KVMEM_TESTS_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace kvmem::testing {

// GET /metrics over HTTP/1.0; the body.
inline std::string Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (::write(fd, req.data(), req.size()) ==
        static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  EXPECT_EQ(response.rfind("HTTP/1.", 0), 0u) << response.substr(0, 200);
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// "name{labels} value" lines -> value, keyed by "name{labels}" as printed
// (prometheus-cpp sorts labels by name).
inline std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_METRICS_SCRAPE_H_
