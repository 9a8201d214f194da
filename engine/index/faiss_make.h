// FAISS indexes as kvmem builds them: the FAISS kinds of block_index.cc and
// the factory check of block_index_factory.cc.
#ifndef KVMEM_ENGINE_INDEX_FAISS_MAKE_H_
#define KVMEM_ENGINE_INDEX_FAISS_MAKE_H_

#include <faiss/Index.h>

#include <cstdint>
#include <memory>
#include <string>

namespace kvmem {

// Vectors before an approximate index is first built (exact search until).
inline constexpr uint64_t kMinBuild = 64;

// faiss::index_factory over inner products, without PQ's polysemous
// training (kvmem never filters by Hamming distance). Throws what FAISS
// throws for a description it cannot build.
std::unique_ptr<faiss::Index> MakeFaiss(const std::string& factory,
                                        uint32_t dim);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_INDEX_FAISS_MAKE_H_
