// Copies into memory another process (or a later reader) will read, not
// this core: large destination writes with non-temporal stores, which skip
// the read-for-ownership of each destination line and keep the caches for
// the source. What shared-memory deliveries gather (engine/tiers/
// block_reader.cc). StreamFence() must follow the last StreamCopy before
// the bytes are handed over (streaming stores are weakly ordered).
//
// SSE2 (every x86-64): bytes up to the destination's 16-byte boundary and
// the tail are copied plainly; elsewhere, or below 64 bytes, memcpy.
#ifndef KVMEM_BASE_STREAM_COPY_H_
#define KVMEM_BASE_STREAM_COPY_H_

#include <cstddef>
#include <cstdint>

namespace kvmem {

void StreamCopy(void* dst, const void* src, size_t n);
void StreamFence();

}  // namespace kvmem

#endif  // KVMEM_BASE_STREAM_COPY_H_
