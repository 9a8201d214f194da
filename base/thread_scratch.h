// Per-thread scratch buffers that live on the heap.
//
// A function-local `thread_local std::vector<float> v;` costs 24 bytes of
// static TLS in every thread of the process, and glibc carves static TLS out
// of each thread's stack: threads with small stacks (the metrics HTTP
// server's, under ASan) overflowed once recall scratch grew. ThreadScratch
// keeps one pointer per type in TLS and the buffers on the heap, freed when
// the thread exits.
//
// Use a distinct type per call site (a local struct is fine): two sites that
// name the same T share one object. A site that may grow its buffers far
// beyond their usual size calls ReleaseThreadScratch<T>() afterwards, so a
// rare large call does not leave every thread holding its peak.
#ifndef KVMEM_BASE_THREAD_SCRATCH_H_
#define KVMEM_BASE_THREAD_SCRATCH_H_

#include <memory>

namespace kvmem {

template <typename T>
std::unique_ptr<T>& ThreadScratchSlot() {
  thread_local std::unique_ptr<T> slot;
  return slot;
}

template <typename T>
T& ThreadScratch() {
  std::unique_ptr<T>& slot = ThreadScratchSlot<T>();
  if (slot == nullptr) slot = std::make_unique<T>();
  return *slot;
}

template <typename T>
void ReleaseThreadScratch() {
  ThreadScratchSlot<T>().reset();
}

}  // namespace kvmem

#endif  // KVMEM_BASE_THREAD_SCRATCH_H_
