// The evaluation workload's types: the knobs of the synthetic video
// (VideoWorkloadOptions; a trace fills the geometry part from its header),
// and a frame and a query as the evaluation replays them.
#ifndef KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_TYPES_H_
#define KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_TYPES_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "client/cpp/kvmem_client.h"

namespace kvmem {

struct VideoWorkloadOptions {
  uint64_t seed = 7;
  uint32_t cameras = 2;
  uint32_t frames = 900;  // Per camera (5 minutes at 3 fps).
  double fps = 3;
  uint32_t tokens_per_frame = 32;
  uint32_t sink_tokens = 4;  // Replace the first tokens of frame 0.
  uint32_t layers = 2;
  uint32_t kv_heads = 4;
  uint32_t head_dim = 64;
  uint32_t latent_dim = 0;  // 0: max(head_dim, the entities' directions).
  uint32_t places = 10;
  uint32_t places_per_camera = 5;
  uint32_t objects = 24;
  uint32_t object_tokens = 4;  // Tokens an object covers in a frame.
  uint32_t max_objects_per_frame = 4;
  double shot_min_s = 3, shot_max_s = 25;
  double visit_min_s = 3, visit_max_s = 25;
  double gap_min_s = 5, gap_max_s = 240;
  double walk_probability = 0.5;        // Next visit on another camera.
  double occlusion_probability = 0.03;  // Per visible object and frame.
  double rope_base = 1e6;               // Qwen2/Qwen2-VL's rope_theta.
  float low_freq_bias = 2.0f;
  float query_scale = 24.0f;  // Logit of a token with its own key, ~.
  float sink_pull = 0.35f;    // Share of the query latent toward the sinks.
  float frame_noise = 0.08f;  // Frame-to-frame change of a token's latent.
  uint32_t query_every = 1;   // Frames between frame queries.
  uint32_t scene_dim = 32;
  // --- Properties the generalisation matrix varies one at a time ---
  // Grouped-query attention: query heads per KV head. Query head j of every
  // KV head looks at its own token of the frame (frame queries), so the
  // heads of a group attend to different things; the oracle attends with
  // each query head.
  uint32_t query_heads_per_kv = 1;
  // Share of the latent each KV head's projection sees (a random subspace
  // per layer and head, rescaled to keep key norms): 1 = every head sees
  // everything (heads alike); lower = heads match on different features.
  float head_subspace = 1.0f;
  // Share of query heads that are sharp (logit scale query_scale); the rest
  // are diffuse, at diffuse_scale * query_scale.
  float sharp_head_fraction = 1.0f;
  float diffuse_scale = 1.0f;
  // Look-alike identities: cosine between objects of one class (object o is
  // in class o % object_classes); 0 = orthogonal identities.
  float lookalike = 0.0f;
  uint32_t object_classes = 3;
  // Re-entry gaps: log-uniform (default), uniform, or Pareto (heavy tail,
  // scale gap_min_s, shape gap_pareto_alpha, capped at gap_max_s) in
  // [gap_min_s, gap_max_s].
  enum class Gaps { kLogUniform, kUniform, kPareto } gaps = Gaps::kLogUniform;
  double gap_pareto_alpha = 1.1;
  // Whole-frame queries: each frame query reads this many of the frame's
  // tokens (every query head of each: frame_query_tokens x
  // query_heads_per_kv vectors, what a front end that sends its frame's
  // query tokens sends), and a frame where an object re-enters this camera
  // is that query, labelled as the object's probe (its tokens among those
  // read). 0: one random token per query head, and probes of their own
  // (the object's identity as the query).
  uint32_t frame_query_tokens = 0;
  // Appearance change: each visit of an object adds, to each of its parts,
  // a random direction of this weight (pose, light, scale): its tokens on
  // one visit match those of another less, and a look-alike's tokens can
  // match one of them better by chance, while what its tokens share (the
  // identity) stays. 0: an object looks the same on every visit.
  float appearance_change = 0.0f;
  // Recurring textures: `textures` patterns (signs, floor tiles, logos)
  // each shown by one patch here and there: `texture_tokens` patches of
  // every frame show a random one of them, and half of the frame queries
  // read a texture patch, so their attention is spread over many frames
  // but peaked on one token in each. 0: none.
  uint32_t textures = 0;
  uint32_t texture_tokens = 0;
};

enum class QueryKind { kFrame = 0, kProbe = 1 };

// One query of the workload.
struct WorkloadQuery {
  QueryKind kind = QueryKind::kFrame;
  uint64_t frame = 0;     // Issued after this frame was appended.
  uint64_t position = 0;  // Absolute position of the query token.
  int object = -1;        // Probe: the object asked about.
  // Probe: positions [begin, end) of the object's tokens in earlier visits
  // to this camera (re-identification targets), oldest first.
  // With whole-frame queries a probe is the frame's query (its kind is
  // kProbe, every vector of the frame's tokens in q_heads).
  std::vector<std::pair<uint64_t, uint64_t>> earlier;
  // What a front end sends (the kvmem.v1 convention for grouped-query
  // attention): per KV head the mean of its group's query heads,
  // [layer][kv_head][head_dim], RoPE'd and scaled.
  std::vector<float> q;
  // The query heads themselves, [query_head][layer][kv_head][head_dim]:
  // what the oracle attends with; query_vectors() of them
  // (query_heads_per_kv, times frame_query_tokens with whole-frame
  // queries: token t's query head j is vector t * query_heads_per_kv + j).
  std::vector<std::vector<float>> q_heads;
  v1::FrameSignals signals;
};

struct WorkloadFrame {
  OutgoingFrame frame;  // fp16 payload, layer-major.
  std::vector<int>
      token_object;  // Per token: object id, -1 background, -2 sink.
  // Per token: the visit serial of its object (appearance change), and its
  // texture (-1: none).
  std::vector<uint32_t> token_visit;
  std::vector<int> token_texture;
  uint32_t place = 0;
  uint64_t shot = 0;
};

}  // namespace kvmem

#endif  // KVMEM_TOOLS_EVAL_VIDEO_WORKLOAD_TYPES_H_
