// Status propagation helpers. Abseil 20220623 ships no status macros, so kvmem
// keeps these two. Both evaluate their expression exactly once.
#ifndef KVMEM_BASE_STATUS_MACROS_H_
#define KVMEM_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVMEM_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status kvmem_status_ = (expr);         \
    if (!kvmem_status_.ok()) return kvmem_status_; \
  } while (0)

#define KVMEM_CONCAT_INNER_(a, b) a##b
#define KVMEM_CONCAT_(a, b) KVMEM_CONCAT_INNER_(a, b)

// KVMEM_ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define KVMEM_ASSIGN_OR_RETURN(lhs, expr)                                     \
  KVMEM_ASSIGN_OR_RETURN_IMPL_(KVMEM_CONCAT_(kvmem_statusor_, __LINE__), lhs, \
                               expr)

#define KVMEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#endif  // KVMEM_BASE_STATUS_MACROS_H_
