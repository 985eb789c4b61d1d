// A small JSON reader/writer: exactly what safetensors headers need (engine/checkpoint.h), nothing more.
//
// Supported: objects (keys kept in file order; a duplicate key is an error), arrays, strings with every JSON
// escape (\uXXXX incl. surrogate pairs, written out as UTF-8), integers in the int64 range, true, false,
// null. Not supported (an error naming the byte offset): fractions and exponents, nesting deeper than 64.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpe::json {

class Value {
 public:
  enum class Kind { Null, Bool, Int, String, Array, Object };

  Value() = default;  // null
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value string(std::string s);
  static Value array(std::vector<Value> items = {});
  static Value object(std::vector<std::pair<std::string, Value>> members = {});

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_int() const { return kind_ == Kind::Int; }

  // Accessors check the kind (dpe::Error otherwise).
  bool as_bool() const;
  int64_t as_int() const;
  const std::string& as_string() const;
  const std::vector<Value>& items() const;
  const std::vector<std::pair<std::string, Value>>& members() const;
  // Object member by key, or nullptr.
  const Value* find(std::string_view key) const;

  // Appends to an array / object (kind checked; object keys are not checked for duplicates here).
  void push_back(Value v);
  void set(std::string key, Value v);

 private:
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  int64_t int_ = 0;
  std::string string_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

// Parses one JSON value (surrounding whitespace allowed). Throws dpe::Error "<what> at byte <offset>".
Value parse(std::string_view text);

// Compact JSON text (no whitespace); strings escaped so that parse(dump(v)) == v.
std::string dump(const Value& v);

const char* kind_name(Value::Kind kind);

}  // namespace dpe::json
