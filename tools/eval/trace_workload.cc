#include "tools/eval/trace_workload.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvmem/v1/trace.pb.h"

namespace kvmem {
namespace {

constexpr char kHeaderFile[] = "trace.json";
constexpr char kFramesFile[] = "frames.bin";
// A record larger than this is refused (a damaged length, not a frame).
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 31;

class TraceWorkload final : public WorkloadSource {
 public:
  TraceWorkload(v1::TraceHeader header, std::vector<v1::TraceFrame> frames)
      : header_(std::move(header)), frames_(std::move(frames)) {
    const v1::StreamGeometry& g = header_.geometry();
    o_.cameras = 1;
    o_.seed = 0;  // A trace's seed, if any, is in its header's labels.
    o_.frames = static_cast<uint32_t>(header_.frames());
    o_.fps = header_.fps();
    o_.tokens_per_frame = g.max_tokens_per_frame();
    o_.sink_tokens = header_.sink_tokens();
    o_.layers = g.layers();
    o_.kv_heads = g.kv_heads();
    o_.head_dim = g.head_dim();
    o_.query_heads_per_kv = header_.query_heads_per_kv();
    o_.frame_query_tokens = header_.query_tokens();
    // The synthetic video's knobs: values its checks accept.
    o_.places = o_.places_per_camera = 1;
    o_.objects = 0;
    o_.object_tokens = 1;
    o_.max_objects_per_frame = 0;
  }

  const VideoWorkloadOptions& options() const override { return o_; }

  WorkloadFrame Frame(uint32_t, uint64_t f) const override {
    const v1::TraceFrame& tf = frames_[f];
    WorkloadFrame out;
    out.frame.header = tf.header();
    out.frame.header.clear_payload();
    out.frame.header.set_payload_bytes(tf.payload().size());
    out.frame.payload = tf.payload();
    const uint32_t n = tf.header().token_count();
    out.token_object.assign(n, -1);
    for (uint32_t t = 0; t < n && t < uint32_t(tf.track_ids_size()); ++t) {
      out.token_object[t] = tf.track_ids(t);
    }
    out.token_visit.assign(n, 0);
    out.token_texture.assign(n, -1);
    return out;
  }

  std::vector<WorkloadQuery> Queries(uint32_t, uint64_t f,
                                     const WorkloadFrame&) const override {
    const size_t dim = size_t{o_.layers} * o_.kv_heads * o_.head_dim;
    std::vector<WorkloadQuery> out;
    for (const v1::TraceQuery& tq : frames_[f].queries()) {
      WorkloadQuery q;
      q.kind = tq.kind() == v1::TraceQuery::KIND_PROBE ? QueryKind::kProbe
                                                       : QueryKind::kFrame;
      q.frame = f;
      q.position = tq.position();
      q.object = static_cast<int>(tq.object());
      for (int i = 0; i + 1 < tq.earlier_size(); i += 2) {
        q.earlier.emplace_back(tq.earlier(i), tq.earlier(i + 1));
      }
      const size_t vectors = tq.q_heads_size() / dim;
      for (size_t v = 0; v < vectors; ++v) {
        q.q_heads.emplace_back(tq.q_heads().begin() + v * dim,
                               tq.q_heads().begin() + (v + 1) * dim);
      }
      q.q = MeanQueryVector(q.q_heads, dim);
      q.signals = tq.signals();
      out.push_back(std::move(q));
    }
    return out;
  }

  uint64_t shots(uint32_t) const override { return 0; }
  uint64_t walks() const override { return 0; }
  bool has_values() const override { return header_.has_values(); }

 private:
  const v1::TraceHeader header_;
  const std::vector<v1::TraceFrame> frames_;
  VideoWorkloadOptions o_;
};

absl::Status CheckHeader(const v1::TraceHeader& h, const std::string& path) {
  const v1::StreamGeometry& g = h.geometry();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (h.format() != kTraceFormat) {
    return bad(absl::StrCat("format is \"", h.format(), "\"; want \"",
                            kTraceFormat, "\""));
  }
  if (h.version() != kTraceVersion) {
    return bad(absl::StrCat("version ", h.version(),
                            " is not one this reader knows (", kTraceVersion,
                            ")"));
  }
  if (g.layers() < 1 || g.layers() > 1024 || g.kv_heads() < 1 ||
      g.kv_heads() > 1024 || g.head_dim() < 2 || g.head_dim() % 2 != 0 ||
      g.head_dim() > 1024) {
    return bad(absl::StrCat("geometry ", g.layers(), " layers x ", g.kv_heads(),
                            " kv_heads x ", g.head_dim(),
                            " head_dim is out of range (layers and kv_heads "
                            "in [1, 1024], head_dim even in [2, 1024])"));
  }
  if (g.dtype() != v1::DTYPE_FP16) {
    return bad("geometry.dtype must be DTYPE_FP16");
  }
  if (g.max_tokens_per_frame() < 1 || g.max_tokens_per_frame() > 4096) {
    return bad(absl::StrCat("geometry.max_tokens_per_frame is ",
                            g.max_tokens_per_frame(),
                            "; must be in [1, 4096]"));
  }
  if (h.query_heads_per_kv() < 1 || h.query_heads_per_kv() > 64) {
    return bad(absl::StrCat("query_heads_per_kv is ", h.query_heads_per_kv(),
                            "; must be in [1, 64]"));
  }
  if (uint64_t{h.query_heads_per_kv()} *
              std::max<uint32_t>(1, h.query_tokens()) >
          1024 ||
      h.query_tokens() > g.max_tokens_per_frame()) {
    return bad(
        absl::StrCat("query_tokens is ", h.query_tokens(), "; at most ",
                     "geometry.max_tokens_per_frame, and query_heads_per_kv x "
                     "max(1, query_tokens) at most 1024"));
  }
  if (h.frames() < 2 || h.frames() > (uint64_t{1} << 31)) {
    return bad(absl::StrCat("frames is ", h.frames(), "; at least 2"));
  }
  if (!(h.fps() > 0)) return bad(absl::StrCat("fps is ", h.fps()));
  if (h.sink_tokens() > g.max_tokens_per_frame()) {
    return bad(absl::StrCat("sink_tokens ", h.sink_tokens(),
                            " is more than geometry.max_tokens_per_frame"));
  }
  return absl::OkStatus();
}

absl::Status CheckFrame(const v1::TraceHeader& h, const v1::TraceFrame& tf,
                        uint64_t f, uint64_t* next_position,
                        const std::string& path) {
  const v1::StreamGeometry& g = h.geometry();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": frame ", f, ": ", what));
  };
  const uint32_t n = tf.header().token_count();
  if (tf.header().frame_index() != f) {
    return bad(
        absl::StrCat("header.frame_index is ", tf.header().frame_index()));
  }
  if (n < 1 || n > g.max_tokens_per_frame()) {
    return bad(absl::StrCat("header.token_count is ", n, "; must be in [1, ",
                            g.max_tokens_per_frame(), "]"));
  }
  // Version 1: frames back to back from position 0 (the evaluation's
  // oracle indexes tokens by position).
  if (tf.header().first_token_position() != *next_position) {
    return bad(absl::StrCat(
        "header.first_token_position is ", tf.header().first_token_position(),
        "; ", *next_position, " expected (frames back to back from 0)"));
  }
  *next_position = tf.header().first_token_position() + n;
  const uint64_t want =
      uint64_t{n} * g.layers() * 2 * g.kv_heads() * g.head_dim() * 2;
  if (tf.payload().size() != want) {
    return bad(absl::StrCat("payload is ", tf.payload().size(), " bytes; ",
                            want, " expected"));
  }
  if (h.has_labels() && uint32_t(tf.track_ids_size()) != n) {
    return bad(
        absl::StrCat(tf.track_ids_size(), " track_ids for ", n, " tokens"));
  }
  const uint64_t dim = uint64_t{g.layers()} * g.kv_heads() * g.head_dim();
  const uint64_t vectors = uint64_t{h.query_heads_per_kv()} *
                           std::max<uint32_t>(1, h.query_tokens());
  for (int i = 0; i < tf.queries_size(); ++i) {
    const v1::TraceQuery& q = tf.queries(i);
    if (uint64_t(q.q_heads_size()) != vectors * dim) {
      return bad(absl::StrCat("query ", i, ": ", q.q_heads_size(),
                              " q_heads floats; ", vectors * dim, " expected (",
                              vectors, " vectors of ", dim, ")"));
    }
    if (q.earlier_size() % 2 != 0) {
      return bad(absl::StrCat("query ", i, ": earlier holds ", q.earlier_size(),
                              " positions, not pairs"));
    }
    for (int k = 0; k < q.earlier_size(); k += 2) {
      const uint64_t b = q.earlier(k), e = q.earlier(k + 1);
      const uint64_t prev = k == 0 ? 0 : q.earlier(k - 1);
      if (b >= e || b < prev || e > *next_position) {
        return bad(absl::StrCat("query ", i, ": earlier pair ", k / 2, " [", b,
                                ", ", e,
                                ") is empty, out of order or past the frame"));
      }
    }
    if (q.position() < *next_position) {
      return bad(absl::StrCat("query ", i, ": position ", q.position(),
                              " is inside the frame (it ends at ",
                              *next_position, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFile(const std::filesystem::path& path,
                       const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f)
    return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkloadSource>> OpenTraceWorkload(
    const std::string& dir) {
  const std::filesystem::path root(dir);
  const std::string header_path = (root / kHeaderFile).string();
  std::ifstream hf(header_path);
  if (!hf)
    return absl::NotFoundError(absl::StrCat("no trace at ", header_path));
  std::stringstream text;
  text << hf.rdbuf();
  v1::TraceHeader header;
  google::protobuf::util::JsonParseOptions jo;
  jo.ignore_unknown_fields = false;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(text.str(), &header, jo);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        header_path, ": not a TraceHeader in JSON: ", parsed.ToString()));
  }
  if (absl::Status s = CheckHeader(header, header_path); !s.ok()) return s;
  const std::string frames_path = (root / kFramesFile).string();
  std::ifstream ff(frames_path, std::ios::binary);
  if (!ff) return absl::NotFoundError(absl::StrCat("no ", frames_path));
  std::vector<v1::TraceFrame> frames;
  std::error_code size_ec;
  const uint64_t file_bytes = std::filesystem::file_size(frames_path, size_ec);
  uint64_t offset = 0;
  std::string buf;
  uint64_t next_position = 0;
  for (uint64_t f = 0; f < header.frames(); ++f) {
    unsigned char len_bytes[8];
    if (!ff.read(reinterpret_cast<char*>(len_bytes), 8)) {
      return absl::InvalidArgumentError(
          absl::StrCat(frames_path, ": ends after ", f,
                       " frames; the header says ", header.frames()));
    }
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
    offset += 8;
    if (len > kMaxRecordBytes || (!size_ec && len > file_bytes - offset)) {
      return absl::InvalidArgumentError(absl::StrCat(
          frames_path, ": frame ", f, " is truncated (record length ", len,
          "; the limit is ", kMaxRecordBytes, " and the file holds ",
          size_ec ? 0 : file_bytes - offset, " more bytes)"));
    }
    offset += len;
    buf.resize(len);
    if (!ff.read(buf.data(), static_cast<std::streamsize>(len))) {
      return absl::InvalidArgumentError(absl::StrCat(
          frames_path, ": frame ", f, " is truncated (", len, " bytes)"));
    }
    v1::TraceFrame tf;
    if (!tf.ParseFromString(buf)) {
      return absl::InvalidArgumentError(
          absl::StrCat(frames_path, ": frame ", f, " is not a TraceFrame"));
    }
    if (absl::Status s = CheckFrame(header, tf, f, &next_position, frames_path);
        !s.ok()) {
      return s;
    }
    frames.push_back(std::move(tf));
  }
  if (ff.peek() != std::char_traits<char>::eof()) {
    return absl::InvalidArgumentError(
        absl::StrCat(frames_path, ": bytes after the header's ",
                     header.frames(), " frames"));
  }
  return std::unique_ptr<WorkloadSource>(
      new TraceWorkload(std::move(header), std::move(frames)));
}

absl::Status WriteTrace(const WorkloadSource& source, uint32_t camera,
                        const std::string& dir,
                        const std::map<std::string, std::string>& labels) {
  const VideoWorkloadOptions& o = source.options();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  v1::TraceHeader h;
  h.set_format(kTraceFormat);
  h.set_version(kTraceVersion);
  v1::StreamGeometry* g = h.mutable_geometry();
  g->set_layers(o.layers);
  g->set_kv_heads(o.kv_heads);
  g->set_head_dim(o.head_dim);
  g->set_dtype(v1::DTYPE_FP16);
  g->set_max_tokens_per_frame(o.tokens_per_frame);
  h.set_query_heads_per_kv(o.query_heads_per_kv);
  h.set_query_tokens(o.frame_query_tokens);
  h.set_sink_tokens(o.sink_tokens);
  h.set_fps(o.fps);
  h.set_frames(o.frames);
  h.set_has_values(true);
  h.set_has_labels(true);
  for (const auto& [k, v] : labels) (*h.mutable_labels())[k] = v;
  const std::filesystem::path root(dir);
  std::ofstream out(root / kFramesFile, std::ios::binary | std::ios::trunc);
  for (uint64_t f = 0; f < o.frames && out; ++f) {
    const WorkloadFrame wf = source.Frame(camera, f);
    v1::TraceFrame tf;
    *tf.mutable_header() = wf.frame.header;
    tf.mutable_header()->clear_payload();
    tf.mutable_header()->clear_payload_bytes();
    tf.set_payload(wf.frame.payload);
    for (int t : wf.token_object) tf.add_track_ids(t);
    for (const WorkloadQuery& q : source.Queries(camera, f, wf)) {
      v1::TraceQuery* tq = tf.add_queries();
      tq->set_kind(q.kind == QueryKind::kProbe ? v1::TraceQuery::KIND_PROBE
                                               : v1::TraceQuery::KIND_FRAME);
      tq->set_object(q.object);
      tq->set_position(q.position);
      *tq->mutable_signals() = q.signals;
      for (const auto& [b, e] : q.earlier) {
        tq->add_earlier(b);
        tq->add_earlier(e);
      }
      for (const auto& v : q.q_heads) {
        tq->mutable_q_heads()->Add(v.begin(), v.end());
      }
    }
    const std::string rec = tf.SerializeAsString();
    char len[8];
    uint64_t n = rec.size();
    for (int i = 0; i < 8; ++i, n >>= 8) len[i] = static_cast<char>(n & 0xff);
    out.write(len, 8);
    out.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  }
  out.close();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("cannot write ", (root / kFramesFile).string()));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions jo;
  jo.add_whitespace = true;
  jo.preserve_proto_field_names = true;
  jo.always_print_primitive_fields = true;
  const auto printed =
      google::protobuf::util::MessageToJsonString(h, &json, jo);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  return WriteFile(root / kHeaderFile, json);
}

}  // namespace kvmem
