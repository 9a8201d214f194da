#include "engine/recall/spherical_kmeans.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/thread_scratch.h"
#include "engine/index/dot.h"

namespace kvmem {
namespace {

// A scratch past this many bytes is not kept for the thread's next call.
constexpr size_t kKeptScratchBytes = size_t{8} << 20;

void NormalizeRow(float* v, size_t n) {
  const float norm = std::sqrt(Dot(v, v, n));
  if (norm > 0) {
    for (size_t i = 0; i < n; ++i) v[i] /= norm;
  }
}

// What each row knows of the centres: its centre, a lower bound on its
// cosine with it, and an upper bound on its best cosine with any other.
struct RowBounds {
  std::vector<uint8_t> centre;
  std::vector<float> own;
  std::vector<float> other;

  // Row i's cosines with every centre (s[0..k)), scored exactly: the first
  // centre of the highest cosine (the plain pass's choice), and the bounds
  // become the two best cosines. Returns whether its centre changed.
  bool Score(size_t i, const float* s, size_t k) {
    size_t arg = 0;
    float top = -INFINITY, second = -INFINITY;
    for (size_t c = 0; c < k; ++c) {
      if (s[c] > top) {
        second = top;
        top = s[c];
        arg = c;
      } else if (s[c] > second) {
        second = s[c];
      }
    }
    const bool moved = centre[i] != arg;
    centre[i] = static_cast<uint8_t>(arg);
    own[i] = top;
    other[i] = second;
    return moved;
  }
};

// Farthest-point seeds: row 0, then repeatedly the row least similar to
// every seed so far. Fills the bounds exactly (every row's best and second
// best cosine with the seeds): the first Lloyd pass's assignment.
std::vector<float> Seeds(const float* rows, const std::vector<float>& norms,
                         size_t n, size_t dim, size_t k, RowBounds* b) {
  std::vector<float> centres(k * dim);
  std::vector<float> dots(n);
  b->centre.assign(n, 0);
  b->own.assign(n, -INFINITY);
  b->other.assign(n, -INFINITY);
  size_t next = 0;
  for (size_t c = 0; c < k; ++c) {
    float* centre = centres.data() + c * dim;
    std::copy_n(rows + next * dim, dim, centre);
    NormalizeRow(centre, dim);
    float lowest = INFINITY;
    // Every row's dot with the new seed (DotMany: Dot's floats, four rows'
    // sums in flight).
    DotMany(rows, n, centre, 1, dim, dots.data());
    for (size_t i = 0; i < n; ++i) {
      const float cosine = norms[i] > 0 ? dots[i] / norms[i] : 0.0f;
      if (cosine > b->own[i]) {
        b->other[i] = b->own[i];
        b->own[i] = cosine;
        b->centre[i] = static_cast<uint8_t>(c);
      } else if (cosine > b->other[i]) {
        b->other[i] = cosine;
      }
      if (b->own[i] < lowest) {
        lowest = b->own[i];
        next = i;
      }
    }
  }
  return centres;
}

// Each centre the unit mean direction of its rows (zero for none); drift[c]:
// how far centre c moved, rounded up.
void MoveCentres(const float* rows, const std::vector<float>& norms, size_t n,
                 size_t dim, size_t k, const std::vector<uint8_t>& centre,
                 std::vector<float>* centres, std::vector<float>* previous,
                 std::vector<float>* drift) {
  previous->swap(*centres);
  centres->assign(k * dim, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    if (norms[i] <= 0) continue;
    AddDivided(rows + i * dim, norms[i], centres->data() + centre[i] * dim,
               dim);
  }
  drift->resize(k);
  for (size_t c = 0; c < k; ++c) {
    float* now = centres->data() + c * dim;
    NormalizeRow(now, dim);
    const float* was = previous->data() + c * dim;
    double squares = 0;
    for (size_t d = 0; d < dim; ++d) {
      const double step = double{now[d]} - double{was[d]};
      squares += step * step;
    }
    (*drift)[c] = static_cast<float>(std::sqrt(squares) * (1 + 1e-6));
  }
}

struct Scratch {
  std::vector<float> previous, drift, batch, dots, cosines;
  std::vector<uint32_t> pending;
};

// The pending rows scored against every centre: all rows in place when they
// are most of them, else a copy of just those rows (Dot's floats either
// way). Returns whether any row changed centre.
bool ScorePending(const float* rows, const std::vector<float>& norms, size_t n,
                  size_t dim, size_t k, const std::vector<float>& centres,
                  Scratch* s, RowBounds* b) {
  const size_t m = s->pending.size();
  const bool all = 2 * m > n;
  const float* scored = rows;
  if (!all) {
    s->batch.resize(m * dim);
    for (size_t j = 0; j < m; ++j) {
      std::memcpy(s->batch.data() + j * dim, rows + s->pending[j] * dim,
                  dim * sizeof(float));
    }
    scored = s->batch.data();
  }
  const size_t scored_rows = all ? n : m;
  s->dots.resize(scored_rows * k);
  DotMany(scored, scored_rows, centres.data(), k, dim, s->dots.data());
  bool changed = false;
  s->cosines.resize(k);
  for (size_t j = 0; j < m; ++j) {
    const size_t i = s->pending[j];
    const float* dot = s->dots.data() + (all ? i : j) * k;
    for (size_t c = 0; c < k; ++c) s->cosines[c] = dot[c] / norms[i];
    changed |= b->Score(i, s->cosines.data(), k);
  }
  return changed;
}

}  // namespace

std::vector<uint8_t> SphericalKMeans(const float* rows, size_t n, size_t dim,
                                     size_t k, int passes,
                                     KMeansCounts* counts) {
  KMeansCounts local;
  KMeansCounts& count = counts != nullptr ? *counts : local;
  count = KMeansCounts();
  std::vector<float> norms(n);
  for (size_t i = 0; i < n; ++i) {
    norms[i] = std::sqrt(Dot(rows + i * dim, rows + i * dim, dim));
  }
  RowBounds b;
  std::vector<float> centres = Seeds(rows, norms, n, dim, k, &b);
  count.passes = 1;
  // A computed cosine (a float dot over dim terms, over a computed norm) is
  // within err of the exact one with room to spare (8 partial sums of
  // dim / 8 terms: about (dim / 8 + 4) units of 2^-24); a row keeps its
  // centre when its bounds are apart by four of them, so the plain pass,
  // scoring both cosines with that error, picks the same centre.
  const float err = static_cast<float>(dim + 64) * 0x1p-22f;
  const float apart = 4 * err;
  // Rows this short lose squares to underflow in their computed norm (a
  // cosine then is off by a factor, not by err): scored every pass. At
  // norm^2 >= dim * 2^-100 what underflow drops is below 2^-26 of it.
  const float tiny = std::sqrt(static_cast<float>(dim)) * 0x1p-50f;
  Scratch& s = ThreadScratch<Scratch>();
  for (int pass = 1; pass < passes; ++pass) {
    MoveCentres(rows, norms, n, dim, k, b.centre, &centres, &s.previous,
                &s.drift);
    // The two largest moves: a row's other centres moved by at most the
    // largest of the others'.
    size_t far = 0;
    for (size_t c = 1; c < k; ++c) far = s.drift[c] > s.drift[far] ? c : far;
    float second = 0;
    for (size_t c = 0; c < k; ++c) {
      if (c != far) second = std::max(second, s.drift[c]);
    }
    s.pending.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!(norms[i] > 0)) continue;  // Every cosine 0: centre 0 throughout.
      const uint8_t c = b.centre[i];
      b.own[i] -= s.drift[c];
      b.other[i] += c == far ? second : s.drift[far];
      if (b.own[i] - b.other[i] > apart && norms[i] >= tiny) {
        ++count.rows_kept;
        continue;
      }
      s.pending.push_back(static_cast<uint32_t>(i));
    }
    if (s.pending.empty()) break;  // No row can move: the pass is a no-op.
    ++count.passes;
    count.rows_scored += s.pending.size();
    if (!ScorePending(rows, norms, n, dim, k, centres, &s, &b)) break;
  }
  const size_t kept_floats = s.previous.capacity() + s.drift.capacity() +
                             s.batch.capacity() + s.dots.capacity() +
                             s.cosines.capacity() + s.pending.capacity();
  if (kept_floats * sizeof(float) > kKeptScratchBytes) {
    ReleaseThreadScratch<Scratch>();
  }
  return std::move(b.centre);
}

}  // namespace kvmem
