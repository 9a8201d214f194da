#include "engine/stream/open_block.h"

#include "engine/recall/token_groups.h"

namespace kvmem {

OpenBlock::OpenBlock(const StreamConfig& config)
    : config_(config), summary_(config), segmenter_(config) {}

std::vector<float> OpenBlock::Signature(const Frame& frame) const {
  if (!frame.signals.scene_embedding.empty()) {
    return frame.signals.scene_embedding;
  }
  SummaryBuilder one(config_);
  one.AddFrame(frame.payload, frame.token_count);
  return one.Mean();
}

void OpenBlock::Add(Frame* frame, const std::vector<float>& signature) {
  summary_.AddFrame(frame->payload, frame->token_count);
  semantics_.AddFrame(frame->index, frame->signals);
  signal_bytes_.store(semantics_.RamBytes(), std::memory_order_relaxed);
  segmenter_.Add(signature);
  tokens_.push_back(frame->token_count);
  payloads_.push_back(std::move(frame->payload));
}

std::unique_ptr<WarmBlock> OpenBlock::Seal(BlockRecord* rec,
                                           StageClock* clock) const {
  StageClock none(nullptr);
  StageClock& c = clock != nullptr ? *clock : none;
  const std::vector<absl::string_view> views(payloads_.begin(),
                                             payloads_.end());
  rec->frame_tokens = tokens_;
  rec->summary = summary_.Mean();
  c.Mark(IngestStage::kSealRest);
  if (config_.groups_per_block > 1) {
    TokenGroups groups =
        BuildTokenGroups(config_, views, tokens_, config_.groups_per_block);
    rec->group_summaries = std::move(groups.summaries);
    rec->token_group = std::move(groups.token_group);
    rec->token_codes = std::move(groups.codes);
    c.Mark(IngestStage::kTokenGroups);
  }
  rec->tracks = semantics_.Tracks();
  rec->scene = semantics_.SceneMean();
  c.Mark(IngestStage::kSealRest);
  std::unique_ptr<WarmBlock> warm =
      WarmBlock::FromFrames(config_.geometry, views, tokens_);
  c.Mark(IngestStage::kWarmCopy);
  return warm;
}

void OpenBlock::Reset() {
  summary_.Reset();
  segmenter_.Reset();
  semantics_.Reset();
  signal_bytes_.store(0, std::memory_order_relaxed);
  payloads_.clear();
  tokens_.clear();
}

}  // namespace kvmem
