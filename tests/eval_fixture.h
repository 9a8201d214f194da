// A small evaluation workload for tests: one camera, short frames, a small
// model; runs in well under a second in process.
#ifndef KVMEM_TESTS_EVAL_FIXTURE_H_
#define KVMEM_TESTS_EVAL_FIXTURE_H_

#include <string>

#include "gtest/gtest.h"
#include "tools/eval/eval.h"

namespace kvmem::testing {

inline EvalOptions SmallEval() {
  EvalOptions o;
  VideoWorkloadOptions& w = o.workload;
  w.cameras = 1;
  w.frames = 240;
  w.tokens_per_frame = 16;
  w.layers = 1;
  w.kv_heads = 2;
  w.head_dim = 32;
  w.latent_dim = 32;
  w.places = 4;
  w.places_per_camera = 3;
  w.objects = 6;
  w.object_tokens = 2;
  w.max_objects_per_frame = 3;
  o.window = 256;
  o.recall_fractions = {0.3};
  o.kvmem.rebuild_every_blocks = 8;
  return o;
}

inline const PolicySummary& PolicyOf(const EvalResult& r,
                                     const std::string& name) {
  for (const auto& p : r.configs[r.primary].policies)
    if (p.name == name) return p;
  ADD_FAILURE() << "no policy " << name;
  static PolicySummary none;
  return none;
}

}  // namespace kvmem::testing

#endif  // KVMEM_TESTS_EVAL_FIXTURE_H_
