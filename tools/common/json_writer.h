// JsonWriter: the one way the tools write JSON (kvmem bench, eval, demo,
// roofline, health --json): keys in the order written, strings escaped,
// numbers with the decimals the caller chooses (figures keep the precision
// they are measured to), non-finite numbers as null. A container is written
// on one line, or with `multiline` one member per line, indented.
//
//   JsonWriter w;
//   w.Object(/*multiline=*/true);
//   w.Key("seed").Int(7);
//   w.Key("mass").Num(0.72713, 4);          // 0.7271
//   w.Key("files").Array();
//   for (const std::string& f : files) w.Str(f);
//   w.EndArray();
//   w.EndObject();
//   std::string json = w.Take();            // With a final newline.
//
// Thread safety: none; one writer per document.
#ifndef KVMEM_TOOLS_COMMON_JSON_WRITER_H_
#define KVMEM_TOOLS_COMMON_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvmem {

class JsonWriter {
 public:
  JsonWriter& Object(bool multiline = false);
  JsonWriter& EndObject();
  JsonWriter& Array(bool multiline = false);
  JsonWriter& EndArray();
  // The next value's key. REQUIRES: inside an object.
  JsonWriter& Key(absl::string_view key);

  JsonWriter& Str(absl::string_view v);
  JsonWriter& Int(int64_t v);
  JsonWriter& UInt(uint64_t v);
  // Fixed, with `decimals` digits after the point.
  JsonWriter& Num(double v, int decimals);
  // As printf's %g (six significant digits).
  JsonWriter& Num(double v);
  JsonWriter& Bool(bool v);
  JsonWriter& Null();
  // An already serialised JSON value (e.g. protobuf's JSON of a message).
  JsonWriter& Raw(absl::string_view json);

  // The document, with a final newline. REQUIRES: every container closed.
  std::string Take();

 private:
  struct Level {
    bool multiline = false;
    bool empty = true;
  };
  // Before a value (or a key): the separator and indentation it needs.
  void Separate();
  JsonWriter& Open(char c, bool multiline);
  JsonWriter& Close(char c);

  std::string out_;
  std::vector<Level> levels_;
  bool after_key_ = false;
};

// s as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view s);

}  // namespace kvmem

#endif  // KVMEM_TOOLS_COMMON_JSON_WRITER_H_
