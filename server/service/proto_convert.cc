#include "server/service/proto_convert.h"

namespace kvmem {

StreamConfig FromProto(const v1::StreamConfig& p) {
  StreamConfig c;
  c.geometry.layers = p.geometry().layers();
  c.geometry.kv_heads = p.geometry().kv_heads();
  c.geometry.head_dim = p.geometry().head_dim();
  c.geometry.dtype = static_cast<DType>(p.geometry().dtype());
  c.geometry.max_tokens_per_frame = p.geometry().max_tokens_per_frame();
  c.hot_window_tokens = p.hot_window_tokens();
  c.frames_per_block = p.block_policy().frames_per_block();
  c.indexed_layers.assign(p.index_policy().indexed_layers().begin(),
                          p.index_policy().indexed_layers().end());
  c.index_factory = p.index_policy().index_factory();
  c.groups_per_block = p.index_policy().groups_per_block();
  c.default_top_k = p.recall_defaults().top_k();
  c.default_max_tokens = p.recall_defaults().max_tokens();
  c.gate_temperature = p.recall_defaults().gate_temperature();
  c.labels.insert(p.labels().begin(), p.labels().end());
  c.segment_mode = static_cast<SegmentMode>(p.block_policy().mode());
  c.shot_similarity_threshold = p.block_policy().shot_similarity_threshold();
  c.max_tokens_per_block = p.block_policy().max_tokens_per_block();
  const v1::TierPolicy& t = p.tier_policy();
  c.tiers.warm_budget_bytes = t.warm_budget_bytes();
  c.tiers.cold_budget_bytes = t.cold_budget_bytes();
  c.tiers.storage_cap_bytes = t.storage_cap_bytes();
  c.tiers.replacement = static_cast<Replacement>(t.replacement());
  c.tiers.heat_half_life_frames = t.heat_half_life_frames();
  c.tiers.prefetch_blocks = t.prefetch_blocks();
  c.tiers.stage_budget_bytes = t.stage_budget_bytes();
  c.tiers.rebuild_every_blocks = t.rebuild_every_blocks();
  c.tiers.rebuild_every_seconds = t.rebuild_every_seconds();
  c.tiers.cold_precision = static_cast<ColdPrecision>(t.cold_precision());
  c.tiers.ingest_precision = static_cast<ColdPrecision>(t.ingest_precision());
  c.weights.model = p.recall_policy().model_weight();
  c.weights.track = p.recall_policy().track_weight();
  c.weights.iou = p.recall_policy().iou_weight();
  c.weights.scene = p.recall_policy().scene_weight();
  c.weights.score = static_cast<ScoreMode>(p.recall_policy().score());
  c.weights.scorer = p.recall_policy().scorer();
  if (p.recall_policy().has_identity_share()) {
    c.weights.identity_share = p.recall_policy().identity_share();
  }
  return c;
}

FrameSignals FromProto(const v1::FrameSignals& p) {
  FrameSignals s;
  s.detections.reserve(p.detections_size());
  for (const auto& d : p.detections()) {
    s.detections.push_back({d.track_id(), d.class_id(), d.x_min(), d.y_min(),
                            d.x_max(), d.y_max(), d.score()});
  }
  s.scene_embedding.assign(p.scene_embedding().begin(),
                           p.scene_embedding().end());
  return s;
}

RecallQuery FromProto(const v1::RecallRequest& p) {
  RecallQuery q;
  q.query.assign(p.query().begin(), p.query().end());
  q.window_lse.assign(p.window_lse().begin(), p.window_lse().end());
  q.top_k = p.budget().top_k();
  q.max_tokens = p.budget().max_tokens();
  q.current_token_position = p.current_token_position();
  q.window_fraction = p.budget().window_fraction();
  q.per_layer = p.per_layer();
  q.per_head = p.per_head();
  if (p.budget().has_identity_share()) {
    q.identity_share = p.budget().identity_share();
  }
  q.mass_target = p.budget().mass_target();
  q.priority = p.priority();
  q.signals = FromProto(p.signals());
  return q;
}

Frame FrameFromHeader(const v1::FrameHeader& p) {
  Frame f;
  f.index = p.frame_index();
  f.timestamp_us = p.timestamp_us();
  f.first_token_position = p.first_token_position();
  f.token_count = p.token_count();
  f.signals = FromProto(p.signals());
  return f;
}

void ToProto(const StreamConfig& c, v1::StreamConfig* p) {
  auto* g = p->mutable_geometry();
  g->set_layers(c.geometry.layers);
  g->set_kv_heads(c.geometry.kv_heads);
  g->set_head_dim(c.geometry.head_dim);
  g->set_dtype(static_cast<v1::DType>(c.geometry.dtype));
  g->set_max_tokens_per_frame(c.geometry.max_tokens_per_frame);
  p->set_hot_window_tokens(c.hot_window_tokens);
  p->mutable_block_policy()->set_frames_per_block(c.frames_per_block);
  for (uint32_t l : c.indexed_layers) {
    p->mutable_index_policy()->add_indexed_layers(l);
  }
  p->mutable_index_policy()->set_index_factory(c.index_factory);
  p->mutable_index_policy()->set_groups_per_block(c.groups_per_block);
  p->mutable_recall_defaults()->set_top_k(c.default_top_k);
  p->mutable_recall_defaults()->set_max_tokens(c.default_max_tokens);
  p->mutable_recall_defaults()->set_gate_temperature(c.gate_temperature);
  p->mutable_labels()->insert(c.labels.begin(), c.labels.end());
  p->mutable_block_policy()->set_mode(
      static_cast<v1::SegmentMode>(c.segment_mode));
  p->mutable_block_policy()->set_shot_similarity_threshold(
      c.shot_similarity_threshold);
  p->mutable_block_policy()->set_max_tokens_per_block(c.max_tokens_per_block);
  v1::TierPolicy* t = p->mutable_tier_policy();
  t->set_warm_budget_bytes(c.tiers.warm_budget_bytes);
  t->set_cold_budget_bytes(c.tiers.cold_budget_bytes);
  t->set_storage_cap_bytes(c.tiers.storage_cap_bytes);
  t->set_replacement(static_cast<v1::ReplacementPolicy>(c.tiers.replacement));
  t->set_heat_half_life_frames(c.tiers.heat_half_life_frames);
  t->set_prefetch_blocks(c.tiers.prefetch_blocks);
  t->set_stage_budget_bytes(c.tiers.stage_budget_bytes);
  t->set_rebuild_every_blocks(c.tiers.rebuild_every_blocks);
  t->set_rebuild_every_seconds(c.tiers.rebuild_every_seconds);
  t->set_cold_precision(static_cast<v1::ColdPrecision>(c.tiers.cold_precision));
  t->set_ingest_precision(
      static_cast<v1::ColdPrecision>(c.tiers.ingest_precision));
  v1::RecallPolicy* r = p->mutable_recall_policy();
  r->set_model_weight(c.weights.model);
  r->set_track_weight(c.weights.track);
  r->set_iou_weight(c.weights.iou);
  r->set_scene_weight(c.weights.scene);
  r->set_score(static_cast<v1::ScoreMode>(c.weights.score));
  r->set_scorer(c.weights.scorer);
  if (c.weights.identity_share) {
    r->set_identity_share(*c.weights.identity_share);
  }
}

namespace {
void ToProto(const TierCount& t, v1::TierStats* p) {
  p->set_blocks(t.blocks);
  p->set_bytes(t.bytes);
}
}  // namespace

void ToProto(const StreamStats& s, v1::StreamStats* p) {
  p->set_stream_id(s.stream_id);
  ToProto(s.config, p->mutable_config());
  p->set_closed(s.closed);
  p->set_last_durable_frame(s.last_durable_frame);
  p->set_next_token_position(s.next_token_position);
  p->set_frames(s.frames);
  p->set_tokens(s.tokens);
  p->set_sealed_blocks(s.sealed_blocks);
  p->set_open_block_frames(s.open_block_frames);
  p->set_payload_bytes(s.payload_bytes);
  p->set_summary_bytes(s.summary_bytes);
  p->set_token_code_bytes(s.token_code_bytes);
  p->set_signal_bytes(s.signal_bytes);
  p->set_track_histories(s.track_histories);
  v1::IngestCpu* cpu = p->mutable_ingest_cpu();
  const auto& ns = s.ingest_cpu_ns;
  cpu->set_validate_ns(ns[static_cast<int>(IngestStage::kValidate)]);
  cpu->set_summarize_ns(ns[static_cast<int>(IngestStage::kSummarize)]);
  cpu->set_token_groups_ns(ns[static_cast<int>(IngestStage::kTokenGroups)]);
  cpu->set_warm_copy_ns(ns[static_cast<int>(IngestStage::kWarmCopy)]);
  cpu->set_seal_rest_ns(ns[static_cast<int>(IngestStage::kSealRest)]);
  cpu->set_encode_ns(ns[static_cast<int>(IngestStage::kEncode)]);
  cpu->set_commit_ns(ns[static_cast<int>(IngestStage::kCommit)]);
  cpu->set_install_ns(ns[static_cast<int>(IngestStage::kInstall)]);
  p->set_summary_dim(s.summary_dim);
  p->set_recalls(s.recalls);
  p->set_recalled_blocks(s.recalled_blocks);
  p->set_recalled_tokens(s.recalled_tokens);
  p->set_warm_bytes(s.warm_bytes);
  p->set_cold_bytes(s.cold_bytes);
  ToProto(s.warm, p->mutable_warm());
  ToProto(s.cold, p->mutable_cold());
  ToProto(s.degraded, p->mutable_degraded());
  ToProto(s.evicted, p->mutable_evicted());
  const PolicyCounters& c = s.policy;
  v1::PolicyStats* ps = p->mutable_policy();
  ps->set_demotions(c.demotions);
  ps->set_degradations(c.degradations);
  ps->set_evictions(c.evictions);
  ps->set_promotions(c.promotions);
  ps->set_promotions_declined(c.promotions_declined);
  ps->set_staged(c.staged);
  ps->set_stage_hits(c.stage_hits);
  ps->set_stage_misses(c.stage_misses);
  ps->set_stage_bytes(c.stage_bytes);
  ps->set_rebuilds(c.rebuilds);
  ps->set_shot_cuts(c.shot_cuts);
  ps->set_recall_us_p50(c.recall_us_p50);
  ps->set_recall_us_p99(c.recall_us_p99);
  ps->set_recall_us_max(c.recall_us_max);
  p->mutable_index()->set_factory(s.config.index_factory);
  p->mutable_index()->set_recall_samples(s.index_recall_samples);
  p->mutable_index()->set_recall_at_k(s.index_recall_at_k);
  p->mutable_index()->set_bytes(s.index_bytes);
  p->mutable_index()->set_copied_in_place(s.index_copied_in_place);
  v1::AcceleratorStats* a = p->mutable_accelerator();
  a->set_backend(s.accel.backend);
  a->set_searches(s.accel.cost.searches);
  a->set_injections(s.accel.cost.injections);
  a->set_measured_us(s.accel.cost.measured_us);
  a->set_modelled_us(s.accel.cost.modelled_us);
  a->set_modelled_queue_us(s.accel.cost.queue_us);
  a->set_modelled_dram_bytes(s.accel.cost.dram_bytes);
  a->set_modelled_energy_uj(s.accel.cost.energy_uj);
  a->set_sram_bytes(s.accel.sram_bytes);
  a->set_sram_hot_bytes(s.accel.sram_hot_bytes);
  a->set_sram_staging_bytes(s.accel.sram_staging_bytes);
  a->set_sram_repartitions(s.accel.sram_repartitions);
  a->set_recall_floor(s.accel.recall_floor);
  a->set_warning(s.accel.warning);
}

void ToProto(const BlockInfo& b, v1::RecalledBlock* p) {
  p->set_block_id(b.id);
  p->set_first_frame(b.first_frame);
  p->set_last_frame(b.last_frame);
  p->set_first_token_position(b.first_token_position);
  p->set_end_token_position(b.end_token_position);
  p->set_token_count(b.token_count);
  p->set_tier(static_cast<v1::Tier>(b.tier));
  p->set_payload_bytes(b.payload_bytes);
  p->set_degraded(b.degraded);
}

namespace {
void ToProto(const RecalledBlock& b, v1::RecalledBlock* out) {
  ToProto(b.block, out);
  out->set_score(b.score);
  out->set_priority(b.priority);
  out->set_semantic_score(b.semantic_score);
  out->set_gate_weight(b.gate_weight);
  out->set_was_staged(b.was_staged);
  out->set_mass(b.mass);
  out->mutable_token_offsets()->Assign(b.token_offsets.begin(),
                                       b.token_offsets.end());
  out->mutable_query_offsets()->Assign(b.query_offsets.begin(),
                                       b.query_offsets.end());
  out->mutable_track_offsets()->Assign(b.track_offsets.begin(),
                                       b.track_offsets.end());
}

void ToProto(const ChannelTokens& c, v1::RecallChannels* p) {
  p->set_attention_tokens(c.attention);
  p->set_query_tokens(c.query);
  p->set_track_tokens(c.track);
  p->set_identity_budget(c.identity_budget);
}
}  // namespace

void ToProto(const RecallResult& r, v1::RecallResponse* p) {
  for (const RecalledBlock& b : r.blocks) ToProto(b, p->add_blocks());
  for (const LayerRecallSet& set : r.layer_sets) {
    v1::LayerRecallSet* out = p->add_layer_sets();
    out->set_layer(set.layer);
    out->set_kv_head(set.kv_head);
    out->set_total_tokens(set.total_tokens);
    for (const RecalledBlock& b : set.blocks) ToProto(b, out->add_blocks());
    ToProto(set.channels, out->mutable_channels());
    out->set_cold_share(set.cold_share);
  }
  ToProto(r.channels, p->mutable_channels());
  p->set_total_tokens(r.total_tokens);
  p->set_candidates(r.candidates);
  p->set_budget_tokens(r.budget_tokens);
  p->set_top_k(r.top_k);
  p->set_recalled_mass(r.recalled_mass);
  p->set_cold_share(r.cold_share);
  p->set_window_estimated(r.window_estimated);
  p->set_query_vectors(r.query_vectors);
  p->set_scored_query_vectors(r.scored_vectors);
  p->mutable_timing()->set_search_us(r.search_us);
  p->mutable_timing()->set_plan_us(r.plan_us);
  p->mutable_timing()->set_total_us(r.total_us);
  v1::RecallTiming* t = p->mutable_timing();
  t->set_tokens_scored(r.tokens_scored);
  t->set_token_us(r.token_us);
  t->set_reduce_us(r.reduce_us);
  t->set_modelled_us(r.accel.modelled_us);
  t->set_modelled_dram_bytes(r.accel.dram_bytes);
  t->set_modelled_energy_uj(r.accel.energy_uj);
  t->set_modelled_queue_us(r.accel.queue_us);
  t->set_injections(r.accel.injections);
}

}  // namespace kvmem
