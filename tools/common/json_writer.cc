#include "tools/common/json_writer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvmem {

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

void JsonWriter::Separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (levels_.empty()) return;
  Level& l = levels_.back();
  if (!l.empty) out_ += l.multiline ? "," : ", ";
  if (l.multiline) {
    out_ += "\n";
    out_.append(2 * levels_.size(), ' ');
  }
  l.empty = false;
}

JsonWriter& JsonWriter::Open(char c, bool multiline) {
  Separate();
  out_.push_back(c);
  levels_.push_back({multiline, true});
  return *this;
}

JsonWriter& JsonWriter::Close(char c) {
  const Level l = levels_.back();
  levels_.pop_back();
  if (l.multiline && !l.empty) {
    out_ += "\n";
    out_.append(2 * levels_.size(), ' ');
  }
  out_.push_back(c);
  return *this;
}

JsonWriter& JsonWriter::Object(bool multiline) { return Open('{', multiline); }
JsonWriter& JsonWriter::EndObject() { return Close('}'); }
JsonWriter& JsonWriter::Array(bool multiline) { return Open('[', multiline); }
JsonWriter& JsonWriter::EndArray() { return Close(']'); }

JsonWriter& JsonWriter::Key(absl::string_view key) {
  Separate();
  out_ += JsonQuote(key);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::Raw(absl::string_view json) {
  Separate();
  out_.append(json.data(), json.size());
  return *this;
}

JsonWriter& JsonWriter::Str(absl::string_view v) { return Raw(JsonQuote(v)); }
JsonWriter& JsonWriter::Int(int64_t v) { return Raw(absl::StrCat(v)); }
JsonWriter& JsonWriter::UInt(uint64_t v) { return Raw(absl::StrCat(v)); }
JsonWriter& JsonWriter::Bool(bool v) { return Raw(v ? "true" : "false"); }
JsonWriter& JsonWriter::Null() { return Raw("null"); }

JsonWriter& JsonWriter::Num(double v, int decimals) {
  if (!std::isfinite(v)) return Null();
  return Raw(absl::StrFormat("%.*f", decimals, v));
}

JsonWriter& JsonWriter::Num(double v) {
  if (!std::isfinite(v)) return Null();
  return Raw(absl::StrFormat("%g", v));
}

std::string JsonWriter::Take() {
  std::string out = std::move(out_);
  out.push_back('\n');
  out_.clear();
  levels_.clear();
  after_key_ = false;
  return out;
}

}  // namespace kvmem
