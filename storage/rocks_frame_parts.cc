// RocksColdStore's reads of frames written in parts (StreamWrite::
// frame_part_bytes): part p of frame f is the record LayerKey(stream, f, p)
// of the payload column family, beside (after) where the frame's whole
// record NumberedKey(stream, f) would be, so a frame's range deletion
// removes its parts too.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/rocks_keys.h"
#include "storage/rocks_store.h"

namespace kvmem {

absl::StatusOr<std::string> RocksColdStore::GetPartedFrame(
    absl::string_view stream_id, uint64_t frame_index) {
  // Part after part until the first that is not stored (one lookup past
  // the last: the store does not keep a count).
  std::vector<std::string> parts;
  uint64_t bytes = 0;
  for (uint32_t p = 0;; ++p) {
    absl::StatusOr<std::string> v = GetChecked(
        &RocksColdStore::payloads_, LayerKey(stream_id, frame_index, p), [&] {
          return absl::StrCat("part ", p, " of frame ", frame_index,
                              " of stream ", stream_id);
        });
    if (absl::IsNotFound(v.status())) break;
    if (!v.ok()) return v.status();
    bytes += v->size();
    parts.push_back(*std::move(v));
  }
  if (parts.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "frame ", frame_index, " of stream ", stream_id, " is not stored"));
  }
  if (parts.size() == 1) return std::move(parts[0]);
  std::string whole;
  whole.reserve(bytes);
  for (const std::string& p : parts) whole += p;
  return whole;
}

absl::StatusOr<std::vector<std::string>> RocksColdStore::GetFrameParts(
    absl::string_view stream_id, uint64_t part_bytes,
    const std::vector<FramePart>& parts) {
  KVMEM_RETURN_IF_ERROR(CheckFramePartBytes(part_bytes));
  // A frame written whole (before parts, or by a writer that did not ask
  // for them) is read once and sliced.
  const FramePart* asked = nullptr;  // The part the slicer reads for.
  WholeFrameSlicer slicer(
      stream_id, part_bytes,
      [&](uint64_t frame) -> absl::StatusOr<std::string> {
        absl::StatusOr<std::string> w = GetChecked(
            &RocksColdStore::payloads_, NumberedKey(stream_id, frame), [&] {
              return absl::StrCat("frame ", frame, " of stream ", stream_id);
            });
        if (absl::IsNotFound(w.status()) && asked->part > 0 &&
            GetChecked(&RocksColdStore::payloads_,
                       LayerKey(stream_id, frame, 0),
                       [&] { return std::string("part 0"); })
                .ok()) {
          // Stored in parts, but fewer than the caller knows it has.
          return absl::DataLossError(absl::StrCat(
              "part ", asked->part, " of frame ", frame, " of stream ",
              stream_id, " is not stored, though part 0 is"));
        }
        return w;
      });
  std::vector<std::string> out;
  out.reserve(parts.size());
  for (const FramePart& p : parts) {
    absl::StatusOr<std::string> v = GetChecked(
        &RocksColdStore::payloads_, LayerKey(stream_id, p.frame, p.part), [&] {
          return absl::StrCat("part ", p.part, " of frame ", p.frame,
                              " of stream ", stream_id);
        });
    if (absl::IsNotFound(v.status())) {
      asked = &p;
      v = slicer.Part(p);
    }
    if (!v.ok()) return v.status();
    out.push_back(*std::move(v));
  }
  return out;
}

}  // namespace kvmem
