#include "storage/cold_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvmem {

absl::StatusOr<std::vector<std::string>> ColdStore::GetBlockLayers(
    absl::string_view stream_id, uint64_t block_id,
    const std::vector<uint32_t>& layers) {
  std::vector<std::string> out;
  out.reserve(layers.size());
  for (uint32_t l : layers) {
    absl::StatusOr<std::string> v = GetBlockLayer(stream_id, block_id, l);
    if (!v.ok()) return v.status();
    out.push_back(*std::move(v));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ColdStore::GetFrames(
    absl::string_view stream_id, uint64_t first, uint64_t last) {
  std::vector<std::string> out;
  for (uint64_t f = first; f <= last; ++f) {
    absl::StatusOr<std::string> v = GetFrame(stream_id, f);
    if (!v.ok()) return v.status();
    out.push_back(*std::move(v));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ColdStore::GetFrameParts(
    absl::string_view stream_id, uint64_t part_bytes,
    const std::vector<FramePart>& parts) {
  KVMEM_RETURN_IF_ERROR(CheckFramePartBytes(part_bytes));
  WholeFrameSlicer slicer(stream_id, part_bytes, [&](uint64_t frame) {
    return GetFrame(stream_id, frame);
  });
  std::vector<std::string> out;
  out.reserve(parts.size());
  for (const FramePart& p : parts) {
    KVMEM_ASSIGN_OR_RETURN(std::string part, slicer.Part(p));
    out.push_back(std::move(part));
  }
  return out;
}

absl::Status CheckFramePartBytes(uint64_t part_bytes) {
  if (part_bytes == 0) {
    return absl::InvalidArgumentError("frame parts of 0 bytes");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WholeFrameSlicer::Part(
    const ColdStore::FramePart& p) {
  if (held_ != p.frame) {
    absl::StatusOr<std::string> v = read_(p.frame);
    if (!v.ok()) return v.status();
    whole_ = *std::move(v);
    held_ = p.frame;
  }
  const uint64_t at = uint64_t{p.part} * part_bytes_;
  if (at >= whole_.size()) {
    return absl::DataLossError(
        absl::StrCat("part ", p.part, " of frame ", p.frame, " of stream ",
                     stream_id_, " (parts of ", part_bytes_,
                     " bytes) is past its ", whole_.size(), " stored bytes"));
  }
  return whole_.substr(at, part_bytes_);
}

absl::Status ColdStore::ClaimStream(absl::string_view, uint64_t) {
  return absl::OkStatus();
}

void ColdStore::ReleaseStream(absl::string_view) {}

absl::StatusOr<StreamRecord> ColdStore::ReadStream(absl::string_view stream_id,
                                                   uint64_t* acknowledged) {
  absl::StatusOr<std::vector<StreamRecord>> all = ListStreams();
  if (!all.ok()) return all.status();
  for (StreamRecord& r : *all) {
    if (r.stream_id != stream_id) continue;
    absl::StatusOr<std::map<std::string, uint64_t>> acked = Acknowledged();
    if (!acked.ok()) return acked.status();
    auto it = acked->find(r.stream_id);
    *acknowledged = it == acked->end() ? 0 : it->second;
    return std::move(r);
  }
  return absl::NotFoundError(
      absl::StrCat("stream \"", stream_id, "\" has no records"));
}

}  // namespace kvmem
