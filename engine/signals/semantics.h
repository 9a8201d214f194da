// Semantic signals of blocks and queries: which tracks a block shows, where,
// and its scene; a track's life in the stream; how a query's signals match a
// block. Pure functions and a value-type builder (owned by one Stream's
// append path).
#ifndef KVMEM_ENGINE_SIGNALS_SEMANTICS_H_
#define KVMEM_ENGINE_SIGNALS_SEMANTICS_H_

#include <map>
#include <vector>

#include "engine/codec/record_codec.h"
#include "engine/types.h"

namespace kvmem {

// A track's life in the stream so far.
struct TrackHistory {
  uint64_t first_frame = 0;
  uint64_t last_frame = 0;
  uint32_t blocks = 0;  // Sealed blocks that show it.
};

// Accumulates the detections and scene embeddings of a block's frames.
class BlockSemanticsBuilder {
 public:
  void AddFrame(uint64_t frame_index, const FrameSignals& signals);
  // Tracks sorted by id, and the mean scene embedding (empty when no frame
  // sent one, or when their dimensions differ).
  std::vector<TrackPresence> Tracks() const;
  std::vector<float> SceneMean() const;
  void Reset();
  // RAM it holds: its tracks' map nodes (glibc's chunks, rounded up) and
  // the scene sum.
  uint64_t RamBytes() const {
    return tracks_.size() * 112 + scene_sum_.size() * sizeof(double);
  }

 private:
  std::map<uint64_t, TrackPresence> tracks_;
  std::vector<double> scene_sum_;
  uint32_t scene_frames_ = 0;
  bool scene_mismatch_ = false;
};

float BoxIoU(const float a[4], const float b[4]);
// Cosine similarity; 0 when either is empty, zero or the sizes differ.
float Cosine(const std::vector<float>& a, const std::vector<float>& b);

struct SemanticMatch {
  float tracks = 0;  // Fraction of the query's track ids the block shows.
  float iou = 0;     // Best IoU of a query box with the same track's box.
  float scene = 0;   // Cosine of the scene embeddings (0 if either is missing).
};

SemanticMatch MatchSignals(const BlockRecord& block, const FrameSignals& query);

// weights.track * tracks + weights.iou * iou + weights.scene * scene.
float SemanticScore(const SemanticMatch& m, const RecallWeights& weights);

}  // namespace kvmem

#endif  // KVMEM_ENGINE_SIGNALS_SEMANTICS_H_
