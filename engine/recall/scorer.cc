#include "engine/recall/scorer.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sync.h"
#include "engine/recall/mass_scorer.h"
#include "engine/recall/summed_scorer.h"

namespace kvmem {
namespace {

class Registry {
 public:
  Registry() {
    // The built-in scorers: one line each.
    Add(NewMassScorer(/*token_stage=*/true));
    Add(NewMassScorer(/*token_stage=*/false));
    Add(NewSummedScorer());
  }

  absl::Status Register(std::unique_ptr<RecallScorer> scorer)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const std::string& name = scorer->name();
    const bool valid =
        !name.empty() && name.size() <= 32 &&
        std::all_of(name.begin(), name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
        });
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("scorer name \"", name, "\" must be 1-32 of [a-z0-9_]"));
    }
    kvmem::MutexLock lock(&mu_);
    if (scorers_.count(name) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("a scorer named \"", name, "\" is registered"));
    }
    scorers_.emplace(name, std::move(scorer));
    return absl::OkStatus();
  }

  const RecallScorer* Find(absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    auto it = scorers_.find(std::string(name));
    return it == scorers_.end() ? nullptr : it->second.get();
  }

  std::vector<std::string> Names() const ABSL_LOCKS_EXCLUDED(mu_) {
    kvmem::MutexLock lock(&mu_);
    std::vector<std::string> names;
    for (const auto& [name, s] : scorers_) names.push_back(name);
    return names;  // A std::map's keys: sorted.
  }

 private:
  void Add(std::unique_ptr<RecallScorer> s) ABSL_LOCKS_EXCLUDED(mu_) {
    const std::string name = s->name();
    kvmem::MutexLock lock(&mu_);
    scorers_.emplace(name, std::move(s));
  }

  mutable kvmem::Mutex mu_;
  // Entries are never removed: the pointers Find returns stay valid.
  std::map<std::string, std::unique_ptr<RecallScorer>> scorers_
      ABSL_GUARDED_BY(mu_);
};

Registry& TheRegistry() {
  static Registry* const registry = new Registry();  // Never destroyed.
  return *registry;
}

}  // namespace

absl::Status RegisterRecallScorer(std::unique_ptr<RecallScorer> scorer) {
  if (scorer == nullptr) {
    return absl::InvalidArgumentError("RegisterRecallScorer: null scorer");
  }
  return TheRegistry().Register(std::move(scorer));
}

const RecallScorer* FindRecallScorer(absl::string_view name) {
  return TheRegistry().Find(name);
}

std::vector<std::string> RecallScorerNames() { return TheRegistry().Names(); }

}  // namespace kvmem
