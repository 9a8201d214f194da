#include "server/proto_convert.h"

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
  c.default_top_k = p.recall_defaults().top_k();
  c.default_max_tokens = p.recall_defaults().max_tokens();
  c.gate_temperature = p.recall_defaults().gate_temperature();
  c.labels.insert(p.labels().begin(), p.labels().end());
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
  q.top_k = p.budget().top_k();
  q.max_tokens = p.budget().max_tokens();
  q.current_token_position = p.current_token_position();
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
  p->mutable_recall_defaults()->set_top_k(c.default_top_k);
  p->mutable_recall_defaults()->set_max_tokens(c.default_max_tokens);
  p->mutable_recall_defaults()->set_gate_temperature(c.gate_temperature);
  p->mutable_labels()->insert(c.labels.begin(), c.labels.end());
}

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
  p->set_summary_dim(s.summary_dim);
  p->set_recalls(s.recalls);
  p->set_recalled_blocks(s.recalled_blocks);
  p->set_recalled_tokens(s.recalled_tokens);
  p->set_warm_bytes(s.warm_bytes);
  p->set_cold_bytes(s.cold_bytes);
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
}

void ToProto(const RecallResult& r, v1::RecallResponse* p) {
  for (const RecalledBlock& b : r.blocks) {
    v1::RecalledBlock* out = p->add_blocks();
    ToProto(b.block, out);
    out->set_score(b.score);
    out->set_gate_weight(b.gate_weight);
  }
  p->set_total_tokens(r.total_tokens);
  p->set_candidates(r.candidates);
  p->set_budget_tokens(r.budget_tokens);
  p->set_top_k(r.top_k);
  p->mutable_timing()->set_search_us(r.search_us);
  p->mutable_timing()->set_plan_us(r.plan_us);
  p->mutable_timing()->set_total_us(r.total_us);
}

}  // namespace kvmem
