#include "io/safetensors_header.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "core/error.h"

namespace dpe::io::safetensors {
namespace {

std::string parse_error(std::string_view text) {
  try {
    parse_header(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsHeaderTest, ParsesWhatSafetensorsHeadersUse) {
  Json v = parse_header(R"( {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                            "__metadata__": {"format": "pt"}, "flags": [true, false, null], "neg": -7} )");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.begin().key(), "w");  // file order kept
  const Json& w = v.at("w");
  EXPECT_EQ(w.at("dtype").get<std::string>(), "F32");
  EXPECT_EQ(w.at("shape")[1].get<int64_t>(), 3);
  EXPECT_EQ(v.at("__metadata__").at("format").get<std::string>(), "pt");
  EXPECT_TRUE(v.at("flags")[0].get<bool>());
  EXPECT_TRUE(v.at("flags")[2].is_null());
  EXPECT_EQ(v.at("neg").get<int64_t>(), -7);
  EXPECT_FALSE(v.contains("absent"));
  EXPECT_STREQ(kind_name(v.at("neg")), "integer");
  EXPECT_STREQ(kind_name(v.at("w")), "object");
}

TEST(SafetensorsHeaderTest, StringEscapes) {
  EXPECT_EQ(parse_header(R"("a\"b\\c\/d\b\f\n\r\t")").get<std::string>(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(parse_header(R"("\u00e9\u20ac")").get<std::string>(), "\xc3\xa9\xe2\x82\xac");  // é €
  EXPECT_EQ(parse_header(R"("\ud83d\ude00")").get<std::string>(), "\xf0\x9f\x98\x80");       // U+1F600, surrogate pair
  EXPECT_EQ(parse_header("\"\xc3\xa9\"").get<std::string>(), "\xc3\xa9");                     // raw UTF-8 passes
}

// Numbers stay exact: integers in [-2^63, 2^64) (safetensors offsets are u64), nothing else.
TEST(SafetensorsHeaderTest, IntegerRange) {
  EXPECT_EQ(parse_header("9223372036854775807").get<int64_t>(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse_header("-9223372036854775808").get<int64_t>(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parse_header("18446744073709551615").get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_NE(parse_error("18446744073709551616").find("integer 18446744073709551616 out of the range"),
            std::string::npos);
  EXPECT_NE(parse_error("-9223372036854775809").find("out of the range"), std::string::npos);
  // The offset is where the parser stopped: the lexer reads one byte past a number.
  EXPECT_NE(parse_error("[1.5]").find("non-integer number 1.5 (only integers are supported) at byte 5"),
            std::string::npos) << parse_error("[1.5]");
  EXPECT_NE(parse_error("1e3").find("non-integer number"), std::string::npos);
  EXPECT_NE(parse_error("01").find("at byte"), std::string::npos);  // leading zero: nlohmann's syntax error
}

TEST(SafetensorsHeaderTest, MalformedInputNamesTheOffset) {
  EXPECT_NE(parse_error(R"({"a": 1,})").find("expected string literal at byte 9"), std::string::npos)
      << parse_error(R"({"a": 1,})");
  EXPECT_NE(parse_error(R"({"a" 1})").find("expected ':'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"a": 1} x)").find("expected end of input"), std::string::npos);
  EXPECT_NE(parse_error(R"("abc)").find("missing closing quote"), std::string::npos);
  EXPECT_NE(parse_error(R"("\x")").find("forbidden character after backslash"), std::string::npos)
      << parse_error(R"("\x")");
  EXPECT_NE(parse_error(R"("\ud83d")").find("surrogate"), std::string::npos);
  EXPECT_NE(parse_error("\"\xff\"").find("ill-formed UTF-8"), std::string::npos);
  EXPECT_NE(parse_error("[1, 2").find("unexpected end of input"), std::string::npos);
  EXPECT_NE(parse_error("").find("unexpected end of input"), std::string::npos);
  for (const std::string& e : {parse_error(R"({"a": 1, "a": 2})"), parse_error("[1.5]"), parse_error("")}) {
    EXPECT_EQ(e.rfind("JSON: ", 0), 0u) << e;
  }
}

// nlohmann keeps the last of two equal keys; a header must not have them.
TEST(SafetensorsHeaderTest, DuplicateKeysAreErrors) {
  EXPECT_NE(parse_error(R"({"a": 1, "a": 2})").find("duplicate key \"a\" at byte 12"), std::string::npos);
  EXPECT_NE(parse_error(R"({"w": {"x": 1}, "v": {"x": 2, "y": [{"k": 1, "k": 1}]}})").find("duplicate key \"k\""),
            std::string::npos);
  // Equal keys in different objects are fine.
  EXPECT_NO_THROW(parse_header(R"({"a": {"a": 1}, "b": {"a": 2}})"));
}

// Deep input is stopped before nlohmann's recursive descent could exhaust the stack: 64 levels pass, 65 do not.
TEST(SafetensorsHeaderTest, NestingLimit) {
  EXPECT_NO_THROW(parse_header(std::string(kMaxDepth + 1, '[') + std::string(kMaxDepth + 1, ']')));
  const std::string too_deep = std::string(kMaxDepth + 2, '[') + std::string(kMaxDepth + 2, ']');
  EXPECT_NE(parse_error(too_deep).find("nesting deeper than 64"), std::string::npos);
  EXPECT_NE(parse_error(std::string(100, '[')).find("nesting deeper than 64 at byte 66"), std::string::npos);
  EXPECT_NE(parse_error(std::string(1000000, '[')).find("nesting deeper than 64"), std::string::npos);
  std::string objects;
  for (int i = 0; i < 100; ++i) objects += "{\"k\":";
  EXPECT_NE(parse_error(objects).find("nesting deeper than 64"), std::string::npos);
}

TEST(SafetensorsHeaderTest, DumpRoundTrips) {
  Json obj = Json::object();
  obj["s"] = "quote \" backslash \\ newline \n ctrl \x01 utf8 \xc3\xa9";
  obj["n"] = -42;
  obj["u"] = std::numeric_limits<uint64_t>::max();
  obj["a"] = Json::array({1, true, nullptr});
  const std::string text = dump_header(obj);
  EXPECT_EQ(text, R"({"s":"quote \" backslash \\ newline \n ctrl \u0001 utf8 )" "\xc3\xa9" R"(","n":-42,)"
                  R"("u":18446744073709551615,"a":[1,true,null]})");
  EXPECT_EQ(dump_header(parse_header(text)), text);
  EXPECT_EQ(parse_header(text).at("s"), obj.at("s"));
  EXPECT_EQ(dump_header(Json::array()), "[]");
  EXPECT_THROW(dump_header(Json("\xff")), Error);  // not UTF-8: not JSON
}

// Regression: tensors sharing bytes were accepted. Both are named with their
// ranges; touching and empty ranges are fine, in any order.
TEST(SafetensorsHeaderTest, OverlappingRangesAreRefused) {
  auto error = [](std::vector<TensorRange> ranges) {
    try {
      check_disjoint_ranges(std::move(ranges));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({{"a", 0, 8}, {"b", 8, 16}, {"c", 16, 16}, {"d", 4, 4}, {"e", 16, 20}}), "");
  EXPECT_EQ(error({}), "");
  EXPECT_NE(error({{"w", 0, 48}, {"v", 0, 48}}).find("entries 'v' (data_offsets [0, 48]) and 'w' (data_offsets [0, "
                                                      "48]) are the same bytes of the data section"),
            std::string::npos)
      << error({{"w", 0, 48}, {"v", 0, 48}});
  EXPECT_NE(error({{"late", 40, 52}, {"early", 0, 48}}).find("entries 'early' (data_offsets [0, 48]) and 'late' "
                                                             "(data_offsets [40, 52]) overlap in bytes [40, 48)"),
            std::string::npos);
  // Nested in a long range that began before a range in between.
  EXPECT_NE(error({{"outer", 0, 100}, {"x", 0, 10}, {"inner", 50, 60}}).find("overlap"), std::string::npos);
  EXPECT_NE(error({{"big", 0, 100}, {"a", 10, 20}, {"b", 100, 110}}).find("'big' (data_offsets [0, 100]) and "
                                                                          "'a' (data_offsets [10, 20])"),
            std::string::npos);
  EXPECT_NE(error({{"u", 0, UINT64_MAX}, {"v", UINT64_MAX - 1, UINT64_MAX}}).find("overlap in bytes ["),
            std::string::npos);
}

}  // namespace
}  // namespace dpe::io::safetensors
