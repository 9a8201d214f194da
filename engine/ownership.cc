#include "engine/ownership.h"

#include <utility>

#include "absl/strings/cord.h"

namespace kvmem {

absl::Status WithOwner(absl::Status s, absl::string_view owner) {
  if (!s.ok() && !owner.empty()) s.SetPayload(kOwnerPayload, absl::Cord(owner));
  return s;
}

std::optional<std::string> OwnerOf(const absl::Status& s) {
  auto owner = s.GetPayload(kOwnerPayload);
  if (!owner.has_value()) return std::nullopt;
  return std::string(*owner);
}

}  // namespace kvmem
