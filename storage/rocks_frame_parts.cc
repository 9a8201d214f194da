// RocksColdStore's reads of frames written in parts (StreamWrite::
// frame_part_bytes): part p of frame f is the record LayerKey(stream, f, p)
// of the payload column family, beside (after) where the frame's whole
// record NumberedKey(stream, f) would be, so a frame's range deletion
// removes its parts too.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  if (part_bytes == 0) {
    return absl::InvalidArgumentError("frame parts of 0 bytes");
  }
  std::vector<std::string> out;
  out.reserve(parts.size());
  // A frame written whole (before parts, or by a writer that did not ask
  // for them) is read once and sliced.
  std::string whole;
  uint64_t whole_frame = 0;
  bool have_whole = false;
  for (const FramePart& p : parts) {
    absl::StatusOr<std::string> v = GetChecked(
        &RocksColdStore::payloads_, LayerKey(stream_id, p.frame, p.part), [&] {
          return absl::StrCat("part ", p.part, " of frame ", p.frame,
                              " of stream ", stream_id);
        });
    if (v.ok()) {
      out.push_back(*std::move(v));
      continue;
    }
    if (!absl::IsNotFound(v.status())) return v.status();
    if (!have_whole || whole_frame != p.frame) {
      absl::StatusOr<std::string> w = GetChecked(
          &RocksColdStore::payloads_, NumberedKey(stream_id, p.frame), [&] {
            return absl::StrCat("frame ", p.frame, " of stream ", stream_id);
          });
      if (absl::IsNotFound(w.status()) && p.part > 0) {
        // Stored in parts, but fewer than the caller knows it has.
        absl::StatusOr<std::string> first = GetChecked(
            &RocksColdStore::payloads_, LayerKey(stream_id, p.frame, 0),
            [&] { return std::string("part 0"); });
        if (first.ok()) {
          return absl::DataLossError(absl::StrCat(
              "part ", p.part, " of frame ", p.frame, " of stream ", stream_id,
              " is not stored, though part 0 is"));
        }
      }
      if (!w.ok()) return w.status();
      whole = *std::move(w);
      whole_frame = p.frame;
      have_whole = true;
    }
    absl::StatusOr<absl::string_view> slice =
        FramePartOf(whole, part_bytes, p, stream_id);
    if (!slice.ok()) return slice.status();
    out.emplace_back(*slice);
  }
  return out;
}

}  // namespace kvmem
