// Maps absl::Status onto grpc::Status one-to-one (the canonical codes share
// their numeric values).
#ifndef KVMEM_SERVER_SERVICE_STATUS_UTIL_H_
#define KVMEM_SERVER_SERVICE_STATUS_UTIL_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvmem {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace kvmem

#endif  // KVMEM_SERVER_SERVICE_STATUS_UTIL_H_
