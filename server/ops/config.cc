#include "server/ops/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "engine/stream_config.h"

namespace kvmem {
namespace {

// Flags a config file may set: kvmem-server's own, not the file itself.
bool IsServerFlag(const absl::CommandLineFlag& f) {
  return absl::StrContains(f.Filename(), "server/") && f.Name() != "config" &&
         f.Name() != "print_config";
}

std::vector<absl::CommandLineFlag*> ServerFlags() {
  std::vector<absl::CommandLineFlag*> out;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsServerFlag(*flag)) out.push_back(flag);
  }
  std::sort(out.begin(), out.end(),
            [](auto* a, auto* b) { return a->Name() < b->Name(); });
  return out;
}

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\u%04X", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Where(const std::string& origin, const toml::source_region& r) {
  return absl::StrCat(origin, ":", static_cast<uint32_t>(r.begin.line));
}

// A TOML scalar as the text a flag parses; false for tables and arrays.
bool ScalarText(const toml::node& v, std::string* out) {
  if (auto s = v.value_exact<std::string>()) {
    *out = *s;
  } else if (auto i = v.value_exact<int64_t>()) {
    *out = std::to_string(*i);
  } else if (auto b = v.value_exact<bool>()) {
    *out = *b ? "true" : "false";
  } else if (auto d = v.value_exact<double>()) {
    *out = absl::StrCat(*d);
  } else {
    return false;
  }
  return true;
}

// [stream_defaults] keys: the policy fields of StreamConfig.
enum class Kind {
  kU32,
  kU64,
  kF32,
  kStr,
  kSegment,
  kReplacement,
  kColdPrecision,
  kScore,
  kShare
};
struct DefaultKey {
  const char* name;
  Kind kind;
  void* (*field)(StreamConfig*);
};

#define KVMEM_FIELD(expr) [](StreamConfig* c) -> void* { return &c->expr; }
const DefaultKey kDefaultKeys[] = {
    {"hot_window_tokens", Kind::kU32, KVMEM_FIELD(hot_window_tokens)},
    {"frames_per_block", Kind::kU32, KVMEM_FIELD(frames_per_block)},
    {"segment_mode", Kind::kSegment, KVMEM_FIELD(segment_mode)},
    {"shot_similarity_threshold", Kind::kF32,
     KVMEM_FIELD(shot_similarity_threshold)},
    {"max_tokens_per_block", Kind::kU32, KVMEM_FIELD(max_tokens_per_block)},
    {"index_factory", Kind::kStr, KVMEM_FIELD(index_factory)},
    {"groups_per_block", Kind::kU32, KVMEM_FIELD(groups_per_block)},
    {"default_top_k", Kind::kU32, KVMEM_FIELD(default_top_k)},
    {"default_max_tokens", Kind::kU32, KVMEM_FIELD(default_max_tokens)},
    {"gate_temperature", Kind::kF32, KVMEM_FIELD(gate_temperature)},
    {"warm_budget_bytes", Kind::kU64, KVMEM_FIELD(tiers.warm_budget_bytes)},
    {"cold_budget_bytes", Kind::kU64, KVMEM_FIELD(tiers.cold_budget_bytes)},
    {"storage_cap_bytes", Kind::kU64, KVMEM_FIELD(tiers.storage_cap_bytes)},
    {"replacement", Kind::kReplacement, KVMEM_FIELD(tiers.replacement)},
    {"score", Kind::kScore, KVMEM_FIELD(weights.score)},
    {"scorer", Kind::kStr, KVMEM_FIELD(weights.scorer)},
    {"identity_share", Kind::kShare, KVMEM_FIELD(weights.identity_share)},
    {"heat_half_life_frames", Kind::kU32,
     KVMEM_FIELD(tiers.heat_half_life_frames)},
    {"prefetch_blocks", Kind::kU32, KVMEM_FIELD(tiers.prefetch_blocks)},
    {"stage_budget_bytes", Kind::kU64, KVMEM_FIELD(tiers.stage_budget_bytes)},
    {"rebuild_every_blocks", Kind::kU32,
     KVMEM_FIELD(tiers.rebuild_every_blocks)},
    {"rebuild_every_seconds", Kind::kU32,
     KVMEM_FIELD(tiers.rebuild_every_seconds)},
    {"cold_precision", Kind::kColdPrecision, KVMEM_FIELD(tiers.cold_precision)},
    {"ingest_precision", Kind::kColdPrecision,
     KVMEM_FIELD(tiers.ingest_precision)},
};
#undef KVMEM_FIELD

const char* SegmentName(SegmentMode m) {
  return m == SegmentMode::kShot    ? "shot"
         : m == SegmentMode::kFixed ? "fixed"
                                    : "";
}
const char* ReplacementName(Replacement r) {
  return r == Replacement::kLru ? "lru" : r == Replacement::kHeat ? "heat" : "";
}
const char* ColdPrecisionName(ColdPrecision p) {
  return p == ColdPrecision::kFull   ? "full"
         : p == ColdPrecision::kInt8 ? "int8"
         : p == ColdPrecision::kInt4 ? "int4"
                                     : "";
}
const char* ScoreName(ScoreMode m) {
  return m == ScoreMode::kMass     ? "mass"
         : m == ScoreMode::kSummed ? "summed"
                                   : "";
}

// The field's value as a TOML literal; "" when it is zero (unset).
std::string FieldToml(const DefaultKey& k, const StreamConfig& config) {
  StreamConfig copy = config;
  void* p = k.field(&copy);
  switch (k.kind) {
    case Kind::kU32: {
      const uint32_t v = *static_cast<uint32_t*>(p);
      return v == 0 ? "" : std::to_string(v);
    }
    case Kind::kU64: {
      const uint64_t v = *static_cast<uint64_t*>(p);
      return v == 0 ? "" : std::to_string(v);
    }
    case Kind::kF32: {
      const float v = *static_cast<float*>(p);
      return v == 0 ? "" : absl::StrCat(v);
    }
    case Kind::kShare: {
      const auto& v = *static_cast<std::optional<float>*>(p);
      return v ? absl::StrCat(*v) : "";
    }
    case Kind::kStr: {
      const std::string& v = *static_cast<std::string*>(p);
      return v.empty() ? "" : Quote(v);
    }
    case Kind::kSegment: {
      const char* n = SegmentName(*static_cast<SegmentMode*>(p));
      return *n ? Quote(n) : "";
    }
    case Kind::kReplacement: {
      const char* n = ReplacementName(*static_cast<Replacement*>(p));
      return *n ? Quote(n) : "";
    }
    case Kind::kColdPrecision: {
      const char* n = ColdPrecisionName(*static_cast<ColdPrecision*>(p));
      return *n ? Quote(n) : "";
    }
    case Kind::kScore: {
      const char* n = ScoreName(*static_cast<ScoreMode*>(p));
      return *n ? Quote(n) : "";
    }
  }
  return "";
}

// Sets *p to the value `v` names among `names`; false when it names none.
template <typename T>
bool Named(const toml::node& v,
           std::initializer_list<std::pair<const char*, T>> names, void* p) {
  const auto s = v.value_exact<std::string>();
  if (!s) return false;
  for (const auto& [name, value] : names) {
    if (*s == name) {
      *static_cast<T*>(p) = value;
      return true;
    }
  }
  return false;
}

absl::Status SetField(const DefaultKey& k, const toml::node& v,
                      const std::string& where, StreamConfig* config) {
  void* p = k.field(config);
  auto bad = [&](absl::string_view want) {
    std::string text;
    if (!ScalarText(v, &text)) text = "a table or array";
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": [stream_defaults] ", k.name, " is ", text,
                     "; must be ", want));
  };
  switch (k.kind) {
    case Kind::kU32:
    case Kind::kU64: {
      const auto i = v.value_exact<int64_t>();
      const uint64_t max = k.kind == Kind::kU32
                               ? std::numeric_limits<uint32_t>::max()
                               : std::numeric_limits<int64_t>::max();
      if (!i || *i < 0 || static_cast<uint64_t>(*i) > max) {
        return bad(absl::StrCat("an integer in [0, ", max, "]"));
      }
      if (k.kind == Kind::kU32) {
        *static_cast<uint32_t*>(p) = static_cast<uint32_t>(*i);
      } else {
        *static_cast<uint64_t*>(p) = static_cast<uint64_t>(*i);
      }
      return absl::OkStatus();
    }
    case Kind::kF32:
    case Kind::kShare: {
      const auto d = v.value<double>();  // Integers convert too.
      const double max = k.kind == Kind::kShare ? 1 : 1e6;
      if (!d || !(*d >= 0) || *d > max) {
        return bad(absl::StrCat("a number in [0, ", max, "]"));
      }
      if (k.kind == Kind::kShare) {
        *static_cast<std::optional<float>*>(p) = static_cast<float>(*d);
      } else {
        *static_cast<float*>(p) = static_cast<float>(*d);
      }
      return absl::OkStatus();
    }
    case Kind::kStr: {
      const auto s = v.value_exact<std::string>();
      if (!s) return bad("a string");
      *static_cast<std::string*>(p) = *s;
      return absl::OkStatus();
    }
    case Kind::kSegment:
      return Named<SegmentMode>(
                 v,
                 {{"fixed", SegmentMode::kFixed}, {"shot", SegmentMode::kShot}},
                 p)
                 ? absl::OkStatus()
                 : bad("\"fixed\" or \"shot\"");
    case Kind::kReplacement:
      return Named<Replacement>(
                 v, {{"lru", Replacement::kLru}, {"heat", Replacement::kHeat}},
                 p)
                 ? absl::OkStatus()
                 : bad("\"lru\" or \"heat\"");
    case Kind::kColdPrecision:
      return Named<ColdPrecision>(v,
                                  {{"full", ColdPrecision::kFull},
                                   {"int8", ColdPrecision::kInt8},
                                   {"int4", ColdPrecision::kInt4}},
                                  p)
                 ? absl::OkStatus()
                 : bad("\"full\", \"int8\" or \"int4\"");
    case Kind::kScore:
      return Named<ScoreMode>(
                 v,
                 {{"mass", ScoreMode::kMass}, {"summed", ScoreMode::kSummed}},
                 p)
                 ? absl::OkStatus()
                 : bad("\"mass\" or \"summed\"");
  }
  return absl::OkStatus();
}

absl::Status ApplyServerTable(const toml::table& t, const std::string& origin) {
  for (auto&& [key, value] : t) {
    const std::string where = Where(origin, key.source());
    const std::string name(key.str());
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || !IsServerFlag(*flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": [server] ", name,
          " is not a kvmem-server flag (kvmem-server --help lists them)"));
    }
    std::string text, error;
    if (!ScalarText(value, &text)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": [server] ", name, " must be a string, number or bool"));
    }
    if (!flag->ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": [server] ", name, " = ", text, ": ", error));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyDefaultsTable(const toml::table& t, const std::string& origin,
                                StreamConfig* defaults) {
  for (auto&& [key, value] : t) {
    const std::string where = Where(origin, key.source());
    const DefaultKey* k = nullptr;
    for (const DefaultKey& d : kDefaultKeys) {
      if (key.str() == d.name) k = &d;
    }
    if (k == nullptr) {
      std::string names;
      for (const DefaultKey& d : kDefaultKeys) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", d.name);
      }
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": [stream_defaults] ", std::string(key.str()),
                       " is not a stream default; known: ", names));
    }
    if (absl::Status s = SetField(*k, value, where, defaults); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> FlagValuesFromArgs(int argc, char** argv,
                                            absl::string_view name) {
  std::vector<std::string> values;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (a == "--") break;
    if (!absl::ConsumePrefix(&a, "--")) absl::ConsumePrefix(&a, "-");
    if (!absl::ConsumePrefix(&a, name)) continue;
    if (absl::ConsumePrefix(&a, "=")) {
      values.emplace_back(a);
    } else if (a.empty() && i + 1 < argc) {
      values.emplace_back(argv[++i]);
    }
  }
  return values;
}

std::string ConfigPathFromArgs(int argc, char** argv) {
  const std::vector<std::string> values =
      FlagValuesFromArgs(argc, argv, "config");
  return values.empty() ? "" : values.back();
}

absl::Status ApplyConfigText(const std::string& text, const std::string& origin,
                             StreamConfig* stream_defaults) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(origin, e.source()), ":",
                     static_cast<uint32_t>(e.source().begin.column), ": ",
                     std::string(e.description())));
  }
  StreamConfig defaults = *stream_defaults;
  for (auto&& [key, value] : root) {
    const std::string where = Where(origin, key.source());
    const toml::table* t = value.as_table();
    if (t == nullptr ||
        (key.str() != "server" && key.str() != "stream_defaults")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", std::string(key.str()),
                       " is not a section of kvmem-server's config; use "
                       "[server] and [stream_defaults]"));
    }
    absl::Status s = key.str() == "server"
                         ? ApplyServerTable(*t, origin)
                         : ApplyDefaultsTable(*t, origin, &defaults);
    if (!s.ok()) return s;
  }
  *stream_defaults = defaults;
  return absl::OkStatus();
}

absl::Status ApplyConfigFile(const std::string& path,
                             StreamConfig* stream_defaults) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--config ", path, " cannot be read: ", std::strerror(errno)));
  }
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  return ApplyConfigText(text, path, stream_defaults);
}

absl::Status ValidateStreamDefaults(const StreamConfig& stream_defaults) {
  StreamConfig sample;
  sample.geometry.layers = 1;
  sample.geometry.kv_heads = 1;
  sample.geometry.head_dim = 64;
  sample.geometry.dtype = DType::kFp16;
  sample.geometry.max_tokens_per_frame = 64;
  if (stream_defaults.hot_window_tokens == 0) sample.hot_window_tokens = 512;
  absl::Status s = ValidateStreamConfig(
      WithDefaults(WithServerDefaults(sample, stream_defaults)));
  if (s.ok()) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("[stream_defaults]: ", s.message()));
}

std::string EffectiveConfigToml(const StreamConfig& stream_defaults) {
  std::ostringstream out;
  out << "# kvmem-server effective configuration (kvmem-server "
         "--print-config).\n# Use as --config=FILE; flags given on the "
         "command line override it.\n\n[server]\n";
  for (const absl::CommandLineFlag* f : ServerFlags()) {
    std::string help = absl::StrReplaceAll(f->Help(), {{"\n", " "}});
    out << "# " << help << "\n" << f->Name() << " = ";
    uint64_t big = 0;
    if (f->IsOfType<std::string>() ||
        // TOML integers are 64-bit signed: larger values go as strings
        // (a string value is parsed as the flag's type).
        (f->IsOfType<uint64_t>() && absl::SimpleAtoi(f->CurrentValue(), &big) &&
         big > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      out << Quote(f->CurrentValue());
    } else {
      out << f->CurrentValue();
    }
    out << "\n";
  }
  out << "\n# Policy of streams whose OpenStream leaves a field zero. "
         "Commented keys\n# are unset: the built-in default shown applies "
         "(0: none or unlimited).\n[stream_defaults]\n";
  const StreamConfig builtin = WithDefaults(StreamConfig());
  for (const DefaultKey& k : kDefaultKeys) {
    const std::string v = FieldToml(k, stream_defaults);
    if (!v.empty()) {
      out << k.name << " = " << v << "\n";
    } else if (std::strcmp(k.name, "default_max_tokens") == 0) {
      out << "# " << k.name << " = 0  (20 % of hot_window_tokens)\n";
    } else if (std::strcmp(k.name, "groups_per_block") == 0) {
      out << "# " << k.name << " = 0  (about one per " << kTokensPerGroup
          << " tokens of a full block, at most " << kMaxDefaultGroups << ")\n";
    } else if (std::strcmp(k.name, "identity_share") == 0) {
      out << "# " << k.name << " = " << kDefaultIdentityShare
          << "  (unset; 0 turns the identity channel off)\n";
    } else if (std::strcmp(k.name, "default_top_k") == 0) {
      out << "# " << k.name << " = 0  (no cap: the token budget limits)\n";
    } else {
      const std::string b = FieldToml(k, builtin);
      out << "# " << k.name << " = " << (b.empty() ? "0" : b) << "\n";
    }
  }
  return out.str();
}

}  // namespace kvmem
