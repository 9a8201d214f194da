// Spherical k-means of a block's token keys (engine/recall/token_groups.h
// clusters with it): farthest-point seeds from row 0, then Lloyd passes that
// move each row to the centre of highest cosine, deterministic.
//
// The Lloyd passes skip the rows the centres' moves cannot have changed
// (Hamerly's bounds, "Making k-means even faster", SDM 2010, in cosines: a
// centre that moved by d changes a row's cosine with it by at most d). Each
// row keeps a lower bound on its cosine with its own centre and an upper
// bound on its best cosine with any other; when the first beats the second
// by more than the float error of a cosine, the row keeps its centre without
// a dot. The seeding has every row's cosine with every seed already, so the
// first Lloyd pass is read off it. The assignment is the plain algorithm's
// (every row against every centre each pass), bit for bit: the rows that
// are scored get Dot's floats, and a skipped row's centre is the one the
// plain pass would give it (tests/engine/recall/spherical_kmeans_test.cc).
//
// Pure functions, safe from any thread.
#ifndef KVMEM_ENGINE_RECALL_SPHERICAL_KMEANS_H_
#define KVMEM_ENGINE_RECALL_SPHERICAL_KMEANS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvmem {

// What one clustering did, for tests and benchmarks.
struct KMeansCounts {
  int passes = 0;            // Assignment passes, the seeding's included.
  uint64_t rows_scored = 0;  // Rows scored against every centre after it.
  uint64_t rows_kept = 0;    // Rows the bounds kept without a dot.
};

// REQUIRES: 1 <= k <= min(n, 256); passes >= 1. Rows are n x dim floats,
// row-major; a row of norm 0 (or not a number) goes to centre 0. Returns
// each row's centre after at most `passes` assignment passes (fewer once a
// pass changes nothing).
std::vector<uint8_t> SphericalKMeans(const float* rows, size_t n, size_t dim,
                                     size_t k, int passes,
                                     KMeansCounts* counts = nullptr);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_RECALL_SPHERICAL_KMEANS_H_
