// JsonWriter: what the tools' --json outputs are made of.
#include "tools/common/json_writer.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(JsonWriterTest, NestsEscapesAndKeepsTheChosenPrecision) {
  JsonWriter w;
  w.Object(/*multiline=*/true);
  w.Key("name").Str("a \"quoted\"\\path\n\x01");
  w.Key("mass").Num(0.727149, 4);
  w.Key("fps").Num(3.0);
  w.Key("count").UInt(18446744073709551615ull);
  w.Key("delta").Int(-3);
  w.Key("ok").Bool(true);
  w.Key("nan").Num(std::nan(""), 2);
  w.Key("inf").Num(std::numeric_limits<double>::infinity());
  w.Key("list").Array();
  w.Str("x").Null().Raw("{\"k\": 1}");
  w.EndArray();
  w.Key("empty").Object().EndObject();
  w.Key("empty_lines").Array(/*multiline=*/true).EndArray();
  w.EndObject();
  EXPECT_EQ(w.Take(),
            "{\n"
            "  \"name\": \"a \\\"quoted\\\"\\\\path\\n\\u0001\",\n"
            "  \"mass\": 0.7271,\n"
            "  \"fps\": 3,\n"
            "  \"count\": 18446744073709551615,\n"
            "  \"delta\": -3,\n"
            "  \"ok\": true,\n"
            "  \"nan\": null,\n"
            "  \"inf\": null,\n"
            "  \"list\": [\"x\", null, {\"k\": 1}],\n"
            "  \"empty\": {},\n"
            "  \"empty_lines\": []\n"
            "}\n");
}

TEST(JsonWriterTest, MultilineContainersIndentByDepth) {
  JsonWriter w;
  w.Array(true);
  w.Object(true).Key("a").Int(1).Key("b").Object().Key("c").Int(2).EndObject();
  w.EndObject();
  w.Int(3);
  w.EndArray();
  EXPECT_EQ(w.Take(),
            "[\n"
            "  {\n"
            "    \"a\": 1,\n"
            "    \"b\": {\"c\": 2}\n"
            "  },\n"
            "  3\n"
            "]\n");
}

}  // namespace
}  // namespace kvmem
