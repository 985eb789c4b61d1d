#include "engine/json.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"

namespace dpe::json {
namespace {

std::string parse_error(std::string_view text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonTest, ParsesWhatSafetensorsHeadersUse) {
  Value v = parse(R"( {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                       "__metadata__": {"format": "pt"}, "flags": [true, false, null], "neg": -7} )");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.members()[0].first, "w");  // file order kept
  const Value* w = v.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->find("dtype")->as_string(), "F32");
  EXPECT_EQ(w->find("shape")->items()[1].as_int(), 3);
  EXPECT_EQ(v.find("__metadata__")->find("format")->as_string(), "pt");
  EXPECT_TRUE(v.find("flags")->items()[0].as_bool());
  EXPECT_EQ(v.find("flags")->items()[2].kind(), Value::Kind::Null);
  EXPECT_EQ(v.find("neg")->as_int(), -7);
  EXPECT_EQ(v.find("absent"), nullptr);
  EXPECT_THROW(v.find("neg")->as_string(), Error);
}

TEST(JsonTest, StringEscapes) {
  EXPECT_EQ(parse(R"("a\"b\\c\/d\b\f\n\r\t")").as_string(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(parse(R"("\u00e9\u20ac")").as_string(), "\xc3\xa9\xe2\x82\xac");    // é €
  EXPECT_EQ(parse(R"("\ud83d\ude00")").as_string(), "\xf0\x9f\x98\x80");         // U+1F600, surrogate pair
  EXPECT_EQ(parse("\"\xc3\xa9\"").as_string(), "\xc3\xa9");                       // raw UTF-8 passes
}

TEST(JsonTest, IntegerRange) {
  EXPECT_EQ(parse("9223372036854775807").as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse("-9223372036854775808").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_NE(parse_error("9223372036854775808").find("out of the int64 range"), std::string::npos);
  EXPECT_NE(parse_error("1.5").find("non-integer number"), std::string::npos);
  EXPECT_NE(parse_error("01").find("leading zero"), std::string::npos);
}

TEST(JsonTest, MalformedInputNamesTheOffset) {
  EXPECT_NE(parse_error(R"({"a": 1,})").find("expected a string key at byte 8"), std::string::npos);
  EXPECT_NE(parse_error(R"({"a" 1})").find("expected ':'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"a": 1} x)").find("trailing characters"), std::string::npos);
  EXPECT_NE(parse_error(R"("abc)").find("unterminated string"), std::string::npos);
  EXPECT_NE(parse_error(R"("\x")").find("invalid escape"), std::string::npos);
  EXPECT_NE(parse_error(R"("\ud83d")").find("unpaired surrogate"), std::string::npos);
  EXPECT_NE(parse_error(R"({"a": 1, "a": 2})").find("duplicate key \"a\""), std::string::npos);
  EXPECT_NE(parse_error("[1, 2").find("unexpected end of input"), std::string::npos);
  EXPECT_NE(parse_error(std::string(100, '[')).find("nesting deeper than 64"), std::string::npos);
  EXPECT_NE(parse_error("").find("unexpected end of input"), std::string::npos);
}

TEST(JsonTest, DumpRoundTrips) {
  Value obj = Value::object();
  obj.set("s", Value::string("quote \" backslash \\ newline \n ctrl \x01 utf8 \xc3\xa9"));
  obj.set("n", Value::integer(-42));
  obj.set("a", Value::array({Value::integer(1), Value::boolean(true), Value()}));
  const std::string text = dump(obj);
  EXPECT_EQ(dump(parse(text)), text);
  EXPECT_EQ(parse(text).find("s")->as_string(), obj.find("s")->as_string());
  EXPECT_EQ(dump(Value::array()), "[]");
}

}  // namespace
}  // namespace dpe::json
