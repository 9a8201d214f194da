#include "engine/recall/recall_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvmem {

RecallPlanner::RecallPlanner(const PlanPolicy& policy) : policy_(policy) {}

float RecallPlanner::RankValue(const PlanUnit& u) const {
  return policy_.mode == ScoreMode::kMass
             ? MassRankValue(u.score, u.semantic, policy_.model_weight)
             : policy_.model_scale * u.score + u.semantic;
}

float RecallPlanner::Priority(const PlanUnit& u) const {
  if (policy_.mode != ScoreMode::kMass) {
    return policy_.model_scale * u.score + u.semantic;
  }
  // A density that underflowed to 0 counts as the smallest float, so the
  // priority stays finite (ln: -103.3).
  return policy_.model_weight *
             std::log(
                 std::max(u.score, std::numeric_limits<float>::denorm_min())) +
         u.semantic;
}

namespace {

using Keyed = std::pair<float, size_t>;  // Rank value, index in the units.

std::vector<Keyed> KeyUnits(const RecallPlanner& planner,
                            const std::vector<PlanUnit>& units) {
  std::vector<Keyed> keyed;
  keyed.reserve(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    keyed.emplace_back(planner.RankValue(units[i]), i);
  }
  return keyed;
}

// Rank's order: value, then newer block, group and token first (a total
// order over distinct units, so a selection then a sort of a prefix gives
// the prefix of the full sort).
struct BestFirst {
  const std::vector<PlanUnit>& u;
  bool operator()(const Keyed& a, const Keyed& b) const {
    if (a.first != b.first) return a.first > b.first;
    const PlanUnit &x = u[a.second], &y = u[b.second];
    if (x.block != y.block) return x.block > y.block;
    return x.group != y.group ? x.group > y.group : x.token > y.token;
  }
};

}  // namespace

void RecallPlanner::Rank(std::vector<PlanUnit>* units) const {
  std::vector<Keyed> keyed = KeyUnits(*this, *units);
  const std::vector<PlanUnit>& u = *units;
  std::sort(keyed.begin(), keyed.end(), BestFirst{u});
  std::vector<PlanUnit> sorted;
  sorted.reserve(units->size());
  for (const auto& k : keyed) sorted.push_back(u[k.second]);
  *units = std::move(sorted);
}

void RecallPlanner::RankAndTake(std::vector<PlanUnit> units) {
  std::vector<Keyed> keyed = KeyUnits(*this, units);
  const BestFirst better{units};
  std::vector<PlanUnit> chunk;
  // A first chunk of about what the budget has room for, doubling after.
  size_t size = size_t{tokens_left()} + 64;
  for (size_t at = 0; at < keyed.size() && !full(); size *= 2) {
    const size_t end = std::min(keyed.size(), at + size);
    if (end < keyed.size()) {
      std::nth_element(keyed.begin() + at, keyed.begin() + end, keyed.end(),
                       better);
    }
    std::sort(keyed.begin() + at, keyed.begin() + end, better);
    chunk.clear();
    for (size_t i = at; i < end; ++i) chunk.push_back(units[keyed[i].second]);
    Take(chunk);
    at = end;
  }
}

bool RecallPlanner::Taken(size_t slot, uint32_t token) const {
  const auto& bits = taken_[slot];
  return token / 64 < bits.size() && (bits[token / 64] >> (token % 64) & 1);
}

void RecallPlanner::Take(const std::vector<PlanUnit>& ranked, uint32_t limit) {
  uint64_t added = 0;
  for (size_t i = 0; i < ranked.size() && !full() && added < limit; ++i) {
    const PlanUnit& u = ranked[i];
    if (u.tokens == 0) continue;
    if (u.channel != RecallChannel::kAttention) dedupe_ = true;
    const auto slot = slot_.find(u.block);
    // A whole group charges the tokens it adds: its tokens already taken
    // one by one are absorbed.
    uint32_t charge = u.tokens, absorbed = 0;
    if (slot != slot_.end()) {
      const PlannedBlock& have = blocks_[slot->second];
      if (have.group_mask >> (u.group & 63) & 1) continue;  // Taken whole.
      if (u.token == kWholeUnit) {
        for (uint32_t g : have.single_groups) absorbed += g == u.group;
        charge = u.tokens > absorbed ? u.tokens - absorbed : 0;
      } else if (dedupe_ && Taken(slot->second, u.token)) {
        continue;  // Taken before, by another channel.
      }
    }
    if (used_ + charge > policy_.max_tokens || added + charge > limit) {
      continue;
    }
    size_t at;
    if (slot == slot_.end()) {
      if (policy_.top_k > 0 && blocks_.size() >= policy_.top_k) continue;
      at = blocks_.size();
      slot_.emplace(u.block, at);
      PlannedBlock b;
      b.block = u.block;
      b.first_group = u.group;
      b.score = u.score;
      b.semantic = u.semantic;
      b.priority = Priority(u);
      blocks_.push_back(b);
      taken_.emplace_back();
    } else {
      at = slot->second;
    }
    PlannedBlock& b = blocks_[at];
    if (policy_.mode == ScoreMode::kMass) {
      b.mass += u.score * static_cast<float>(charge);
      mass_ += double(u.score) * charge;
    }
    b.tokens += charge;
    if (u.token == kWholeUnit) {
      b.group_mask |= uint64_t{1} << (u.group & 63);
      if (absorbed > 0) {
        size_t k = 0;
        for (size_t i = 0; i < b.single_tokens.size(); ++i) {
          if (b.single_groups[i] == u.group) continue;
          b.single_tokens[k] = b.single_tokens[i];
          b.single_groups[k++] = b.single_groups[i];
        }
        b.single_tokens.resize(k);
        b.single_groups.resize(k);
      }
    } else {
      b.single_tokens.push_back(u.token);
      b.single_groups.push_back(u.group);
      if (dedupe_) {
        auto& bits = taken_[at];
        if (bits.size() <= u.token / 64) bits.resize(u.token / 64 + 1, 0);
        bits[u.token / 64] |= uint64_t{1} << (u.token % 64);
      }
      if (u.channel == RecallChannel::kQuery) b.query_tokens.push_back(u.token);
      if (u.channel == RecallChannel::kTrack) b.track_tokens.push_back(u.token);
    }
    (u.channel == RecallChannel::kQuery   ? channels_.query
     : u.channel == RecallChannel::kTrack ? channels_.track
                                          : channels_.attention) += charge;
    used_ += charge;
    added += charge;
  }
}

RecallPlan RecallPlanner::Finish() {
  RecallPlan plan;
  plan.total_tokens = static_cast<uint32_t>(used_);
  plan.blocks = std::move(blocks_);
  plan.channels = channels_;
  AssignGateWeights(&plan.blocks, policy_.gate_temperature, policy_.mode);
  blocks_.clear();
  slot_.clear();
  taken_.clear();
  channels_ = {};
  dedupe_ = false;
  used_ = 0;
  mass_ = 0;
  return plan;
}

RecallPlan RecallPlanner::PlanBlocks(const PlanPolicy& policy,
                                     std::vector<PlanUnit> units) {
  RecallPlanner planner(policy);
  planner.Rank(&units);
  if (policy.top_k > 0 && units.size() > policy.top_k) {
    units.resize(policy.top_k);
  }
  planner.Take(units);
  return planner.Finish();
}

RecallPlan RecallPlanner::Plan(const PlanPolicy& policy,
                               std::vector<PlanUnit> units) {
  RecallPlanner planner(policy);
  planner.RankAndTake(std::move(units));
  return planner.Finish();
}

float MassRankValue(float density, float semantic, float model_weight) {
  if (semantic == 0 || !(density > 0)) return density;
  const double v =
      double(density) * std::exp(double(semantic) / double(model_weight));
  return static_cast<float>(
      std::min(v, double(std::numeric_limits<float>::max())));
}

void AssignGateWeights(std::vector<PlannedBlock>* blocks, float temperature,
                       ScoreMode mode) {
  if (blocks->empty()) return;
  std::vector<double> x;
  x.reserve(blocks->size());
  for (const auto& b : *blocks) {
    const double v = mode == ScoreMode::kMass
                         ? (b.mass > 0 ? std::log(double(b.mass)) : -INFINITY)
                         : double(b.priority);
    x.push_back(v / temperature);
  }
  const double top = *std::max_element(x.begin(), x.end());
  if (!std::isfinite(top)) {  // Every block has zero mass.
    for (auto& b : *blocks) b.gate_weight = 1.0f / blocks->size();
    return;
  }
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - top));
  for (size_t i = 0; i < blocks->size(); ++i) {
    (*blocks)[i].gate_weight = static_cast<float>(x[i] / sum);
  }
}

std::vector<uint32_t> TokenOffsets(const std::vector<uint8_t>& token_group,
                                   uint64_t group_mask,
                                   absl::Span<const uint32_t> single_tokens,
                                   uint32_t token_count) {
  std::vector<uint32_t> offsets;
  if (group_mask == 0) {  // Tokens alone: their offsets, ascending, once.
    for (uint32_t t : single_tokens) {
      if (t < token_group.size()) offsets.push_back(t);
    }
    std::sort(offsets.begin(), offsets.end());
    offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  } else if (single_tokens.empty()) {
    for (uint32_t t = 0; t < token_group.size(); ++t) {
      if (group_mask >> token_group[t] & 1) offsets.push_back(t);
    }
  } else {  // One pass over a mark per token: ascending, each once.
    thread_local std::vector<uint8_t> taken;
    taken.assign(token_group.size(), 0);
    for (uint32_t t : single_tokens) {
      if (t < taken.size()) taken[t] = 1;
    }
    for (uint32_t t = 0; t < token_group.size(); ++t) {
      if (taken[t] || (group_mask >> token_group[t] & 1)) offsets.push_back(t);
    }
  }
  if (offsets.size() == token_count) offsets.clear();
  return offsets;
}

}  // namespace kvmem
