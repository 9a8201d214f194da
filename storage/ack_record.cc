#include "storage/ack_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvmem {
namespace {

constexpr char kAckMagic[] = "KVMEM-ACKED-1\n";

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetU64(const std::string& in, size_t* pos) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[*pos + i])) << (8 * i);
  }
  *pos += 8;
  return v;
}

uint64_t Fnv64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string EncodeAckRecord(const std::map<std::string, uint64_t>& frames) {
  std::string out(kAckMagic);
  PutU64(&out, frames.size());
  for (const auto& [id, n] : frames) {
    PutU64(&out, id.size());
    out += id;
    PutU64(&out, n);
  }
  PutU64(&out, Fnv64(out));
  return out;
}

absl::StatusOr<std::map<std::string, uint64_t>> DecodeAckRecord(
    const std::string& data, const std::string& file) {
  std::map<std::string, uint64_t> frames;
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("acknowledgement record ", file, " is unreadable (", why,
                     "): acknowledged frames cannot be verified"));
  };
  const size_t magic = sizeof(kAckMagic) - 1;
  if (data.size() < magic + 16 || data.compare(0, magic, kAckMagic) != 0) {
    return bad("no header");
  }
  absl::string_view body(data.data(), data.size() - 8);
  size_t pos = data.size() - 8;
  if (GetU64(data, &pos) != Fnv64(body)) return bad("checksum mismatch");
  pos = magic;
  const uint64_t count = GetU64(data, &pos);
  for (uint64_t i = 0; i < count; ++i) {
    if (pos + 8 > body.size()) return bad("truncated");
    const uint64_t len = GetU64(data, &pos);
    if (len > body.size() || pos + len + 8 > body.size()) {
      return bad("truncated");
    }
    std::string id = data.substr(pos, len);
    pos += len;
    frames[std::move(id)] = GetU64(data, &pos);
  }
  if (pos != body.size()) return bad("trailing bytes");
  return frames;
}

absl::Status WriteFileDurably(const std::string& dir, const std::string& name,
                              absl::string_view data) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = path + ".tmp";
  auto fail = [&](absl::string_view what) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(what, " ", tmp, ": ", std::strerror(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(msg)
                                          : absl::InternalError(msg);
  };
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("open");
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status st = fail("write");
      ::close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status st = fail("fsync");
    ::close(fd);
    return st;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace kvmem
