#include "storage/store_factory.h"

#include "absl/strings/str_cat.h"

namespace kvmem {
namespace {

constexpr absl::string_view kSchemes = "rocksdb:DIR, rados:POOL or memory:";

}  // namespace

std::string StoreSpec::ToString() const {
  switch (kind) {
    case Kind::kRocksDb:
      return absl::StrCat("rocksdb:", location);
    case Kind::kMemory:
      return "memory:";
    case Kind::kRados:
      return absl::StrCat("rados:", location);
  }
  return "";
}

absl::StatusOr<StoreSpec> ParseStoreSpec(absl::string_view text) {
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store \"", text, "\" has no scheme: expected ", kSchemes));
  }
  const absl::string_view scheme = text.substr(0, colon);
  const absl::string_view rest = text.substr(colon + 1);
  StoreSpec spec;
  if (scheme == "rocksdb") {
    if (rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store \"", text, "\": rocksdb needs a directory (rocksdb:DIR)"));
    }
    spec.kind = StoreSpec::Kind::kRocksDb;
    spec.location = std::string(rest);
    return spec;
  }
  if (scheme == "rados") {
    if (rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store \"", text, "\": rados needs a pool (rados:POOL)"));
    }
    spec.kind = StoreSpec::Kind::kRados;
    spec.location = std::string(rest);
    return spec;
  }
  if (scheme == "memory") {
    if (!rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store \"", text, "\": memory takes nothing after the ':'"));
    }
    spec.kind = StoreSpec::Kind::kMemory;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("store \"", text, "\": unknown scheme \"", scheme,
                   "\"; this build has ", kSchemes));
}

absl::StatusOr<std::unique_ptr<ColdStore>> OpenColdStore(
    const StoreSpec& spec, const RocksColdStoreOptions& rocks,
    const RadosColdStoreOptions& rados) {
  switch (spec.kind) {
    case StoreSpec::Kind::kRocksDb: {
      RocksColdStoreOptions o = rocks;
      o.path = spec.location;
      return OpenRocksColdStore(o);
    }
    case StoreSpec::Kind::kMemory:
      return NewMemColdStore();
    case StoreSpec::Kind::kRados: {
      RadosColdStoreOptions o = rados;
      o.pool = spec.location;
      return OpenRadosColdStore(o);
    }
  }
  return absl::InvalidArgumentError("unknown store kind");
}

}  // namespace kvmem
