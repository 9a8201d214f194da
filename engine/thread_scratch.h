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
// name the same T share one object.
#ifndef KVMEM_ENGINE_THREAD_SCRATCH_H_
#define KVMEM_ENGINE_THREAD_SCRATCH_H_

#include <memory>

namespace kvmem {

template <typename T>
T& ThreadScratch() {
  thread_local std::unique_ptr<T> scratch;
  if (scratch == nullptr) scratch = std::make_unique<T>();
  return *scratch;
}

}  // namespace kvmem

#endif  // KVMEM_ENGINE_THREAD_SCRATCH_H_
