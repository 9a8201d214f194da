#include "storage/rados_io.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace kvmem::rados_io {
namespace {

constexpr absl::string_view kTrailerPrefix = "t:";

}  // namespace

absl::Status FromRc(int rc, absl::string_view what) {
  if (rc >= 0) return absl::OkStatus();
  const std::string msg =
      absl::StrCat(what, ": ", std::strerror(-rc), " (rados ", rc, ")");
  switch (-rc) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case ECANCELED:
      return absl::AbortedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case ETIMEDOUT:
      return absl::UnavailableError(
          absl::StrCat(msg, "; the cluster did not answer in time"));
    case ENOTCONN:
    case ESHUTDOWN:  // Also Ceph's EBLOCKLISTED.
    case ECONNREFUSED:
      return absl::UnavailableError(msg);
    case EIO:
      return absl::DataLossError(msg);
    case EINVAL:
    case ERANGE:
      return absl::InternalError(msg);
    default:
      return absl::UnknownError(msg);
  }
}

AioBatch::~AioBatch() {
  if (!waited_) (void)Wait();
  for (Op& op : ops_) op.c->release();
}

librados::AioCompletion* AioBatch::Add(std::string what) {
  librados::AioCompletion* c = librados::Rados::aio_create_completion();
  ops_.push_back({c, std::move(what), 0});
  return c;
}

void AioBatch::NotStarted(int rc) { ops_.back().start_rc = rc < 0 ? rc : -EIO; }

absl::Status AioBatch::Wait() {
  absl::Status first;
  rcs_.assign(ops_.size(), 0);
  for (size_t i = 0; i < ops_.size(); ++i) {
    Op& op = ops_[i];
    if (op.start_rc == 0) {
      op.c->wait_for_complete();
      rcs_[i] = op.c->get_return_value();
    } else {
      rcs_[i] = op.start_rc;
    }
    if (rcs_[i] < 0 && first.ok()) first = FromRc(rcs_[i], op.what);
  }
  waited_ = true;
  return first;
}

std::string EncodeRef(const Ref& ref) {
  return absl::StrCat(ref.trailer ? kTrailerPrefix : "", ref.offset, ",",
                      ref.length, ",", ref.object);
}

bool DecodeRef(absl::string_view bytes, Ref* ref) {
  ref->trailer = absl::ConsumePrefix(&bytes, kTrailerPrefix);
  const size_t a = bytes.find(',');
  if (a == absl::string_view::npos) return false;
  const size_t b = bytes.find(',', a + 1);
  if (b == absl::string_view::npos) return false;
  if (!absl::SimpleAtoi(bytes.substr(0, a), &ref->offset) ||
      !absl::SimpleAtoi(bytes.substr(a + 1, b - a - 1), &ref->length)) {
    return false;
  }
  ref->object = std::string(bytes.substr(b + 1));
  return !ref->object.empty();
}

std::string FrameKey(uint64_t frame) {
  return absl::StrFormat("f/%016x", frame);
}
std::string MetaKey(uint64_t frame) {
  return absl::StrFormat("m/%016x", frame);
}
std::string BlockKey(uint64_t block) {
  return absl::StrFormat("b/%016x", block);
}
std::string LayerKey(uint64_t block, uint32_t layer) {
  return absl::StrFormat("l/%016x/%08x", block, layer);
}

bool ParseKey(absl::string_view key, uint64_t* a, uint32_t* b) {
  if (key.size() < 18 || key[1] != '/') return false;
  if (!absl::SimpleHexAtoi(key.substr(2, 16), a)) return false;
  if (b == nullptr) return key.size() == 18;
  return key.size() == 27 && key[18] == '/' &&
         absl::SimpleHexAtoi(key.substr(19, 8), b);
}

std::string U64(uint64_t v) { return absl::StrCat(v); }

bool ParseU64(absl::string_view text, uint64_t* v) {
  return absl::SimpleAtoi(text, v);
}

absl::Status ScanOmap(
    librados::IoCtx& io, const std::string& oid, const std::string& prefix,
    const std::function<bool(const std::string&, librados::bufferlist&)>& fn) {
  constexpr uint64_t kPage = 512;
  std::string after;
  for (;;) {
    std::map<std::string, librados::bufferlist> vals;
    bool more = false;
    int rval = 0;
    librados::ObjectReadOperation op;
    op.omap_get_vals2(after, prefix, kPage, &vals, &more, &rval);
    const int rc = io.operate(oid, &op, nullptr);
    if (rc == -ENOENT) return absl::OkStatus();  // No object: no keys.
    if (rc < 0 || rval < 0) {
      return FromRc(rc < 0 ? rc : rval,
                    absl::StrCat("reading the omap of ", oid));
    }
    for (auto& [k, v] : vals) {
      if (!fn(k, v)) return absl::OkStatus();
    }
    if (!more || vals.empty()) return absl::OkStatus();
    after = vals.rbegin()->first;
  }
}

librados::bufferlist Text(absl::string_view s) {
  librados::bufferlist bl;
  bl.append(s.data(), static_cast<unsigned>(s.size()));
  return bl;
}

std::string StripedName(const std::string& base, uint64_t bytes) {
  return absl::StrCat(base, ".", bytes);
}

std::vector<std::string> Stripes(const std::string& logical) {
  const size_t dot = logical.rfind('.');
  uint64_t bytes = 0;
  if (dot == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(logical).substr(dot + 1), &bytes)) {
    return {};
  }
  const uint64_t n =
      std::max<uint64_t>(1, (bytes + kStripeBytes - 1) / kStripeBytes);
  std::vector<std::string> out;
  for (uint64_t k = 0; k < n; ++k) out.push_back(absl::StrCat(logical, "/", k));
  return out;
}

absl::Status WriteObjects(
    librados::IoCtx& io,
    const std::vector<std::pair<std::string, librados::bufferlist>>& objects) {
  std::vector<librados::bufferlist> pieces;
  std::vector<std::string> names;
  for (const auto& [logical, bl] : objects) {
    const std::vector<std::string> stripes = Stripes(logical);
    for (size_t k = 0; k < stripes.size(); ++k) {
      const uint64_t off = k * kStripeBytes;
      const uint64_t len = std::min<uint64_t>(kStripeBytes, bl.length() - off);
      librados::bufferlist piece;
      if (len > 0) {
        piece.substr_of(bl, static_cast<unsigned>(off),
                        static_cast<unsigned>(len));
      }
      pieces.push_back(std::move(piece));
      names.push_back(stripes[k]);
    }
  }
  AioBatch batch;
  for (size_t i = 0; i < names.size(); ++i) {
    librados::AioCompletion* c = batch.Add(absl::StrCat("writing ", names[i]));
    const int rc = io.aio_write_full(names[i], c, pieces[i]);
    if (rc < 0) batch.NotStarted(rc);
  }
  return batch.Wait();
}

absl::StatusOr<std::vector<std::string>> ReadRefs(
    librados::IoCtx& io, const std::vector<Ref>& refs) {
  // Each ref's bytes as pieces of stripes: (ref, offset in it) per piece.
  struct Piece {
    size_t ref;
    uint64_t at;
    librados::bufferlist bl;
    int rval = 0;
  };
  std::vector<std::string> out(refs.size());
  std::vector<Piece> pieces;
  std::map<std::string, librados::ObjectReadOperation> ops;
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::vector<std::string> stripes = Stripes(refs[i].object);
    if (stripes.empty()) {
      return absl::DataLossError(
          absl::StrCat("object name ", refs[i].object, " has no size"));
    }
    out[i].resize(refs[i].length);
    for (uint64_t at = 0; at < refs[i].length;) {
      const uint64_t off = refs[i].offset + at;
      const uint64_t k = off / kStripeBytes;
      const uint64_t len =
          std::min(refs[i].length - at, (k + 1) * kStripeBytes - off);
      if (k >= stripes.size()) {
        return absl::DataLossError(absl::StrCat(
            "a record of ", refs[i].length, " bytes at ", refs[i].offset,
            " lies past the end of object ", refs[i].object));
      }
      pieces.push_back({i, at, {}, 0});
      at += len;
    }
  }
  // The pieces' addresses are stable now; queue their reads.
  size_t p = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::vector<std::string> stripes = Stripes(refs[i].object);
    for (; p < pieces.size() && pieces[p].ref == i; ++p) {
      const uint64_t off = refs[i].offset + pieces[p].at;
      const uint64_t k = off / kStripeBytes;
      const uint64_t len =
          std::min(refs[i].length - pieces[p].at, (k + 1) * kStripeBytes - off);
      ops[stripes[k]].read(off - k * kStripeBytes, len, &pieces[p].bl,
                           &pieces[p].rval);
    }
  }
  AioBatch batch;
  for (auto& [object, op] : ops) {
    librados::AioCompletion* c = batch.Add(absl::StrCat("reading ", object));
    const int rc = io.aio_operate(object, c, &op, nullptr);
    if (rc < 0) batch.NotStarted(rc);
  }
  KVMEM_RETURN_IF_ERROR(batch.Wait());
  for (Piece& piece : pieces) {
    const Ref& ref = refs[piece.ref];
    if (piece.rval < 0) return FromRc(piece.rval, ref.object);
    const uint64_t want = std::min<uint64_t>(
        ref.length - piece.at,
        kStripeBytes - (ref.offset + piece.at) % kStripeBytes);
    if (piece.bl.length() != want) {
      return absl::DataLossError(absl::StrCat(
          "object ", ref.object, " holds ", piece.bl.length(), " bytes at ",
          ref.offset + piece.at, " where its record has ", want));
    }
    piece.bl.begin().copy(static_cast<unsigned>(want),
                          out[piece.ref].data() + piece.at);
  }
  return out;
}

void RemoveObjects(librados::IoCtx& io, const std::vector<std::string>& names,
                   bool striped) {
  if (names.empty()) return;
  AioBatch batch;
  for (const std::string& logical : names) {
    for (const std::string& name :
         striped ? Stripes(logical) : std::vector<std::string>{logical}) {
      librados::AioCompletion* c = batch.Add(name);
      if (io.aio_remove(name, c) < 0) batch.NotStarted(-EIO);
    }
  }
  (void)batch.Wait();
}

}  // namespace kvmem::rados_io
