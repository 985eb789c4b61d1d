#include "io/safetensors_header.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <unordered_set>
#include <vector>

#include "core/error.h"

namespace dpe::io::safetensors {

namespace {

// A pointer into the text that records, in *read, how far nlohmann's lexer has read: the SAX callbacks get
// no position of their own, and errors must name the byte offset.
class CountingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator(const char* p, const char** read) : p_(p), read_(read) {}
  reference operator*() const { return *p_; }
  CountingIterator& operator++() {
    ++p_;
    if (p_ > *read_) *read_ = p_;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p_ == o.p_; }
  bool operator!=(const CountingIterator& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char** read_;
};

// Builds the value like nlohmann's own DOM parser, with the checks of the header comment. Returning false
// is never used: every problem throws dpe::Error, which propagates out of nlohmann::json::sax_parse.
class Handler final : public nlohmann::json_sax<Json> {
 public:
  Handler(const char* begin, const char** read) : begin_(begin), read_(read) {}

  Json take() { return std::move(root_); }

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool b) override { return put(Json(b)); }
  bool number_integer(number_integer_t i) override { return put(Json(i)); }
  bool number_unsigned(number_unsigned_t u) override { return put(Json(u)); }
  bool number_float(number_float_t, const string_t& s) override {
    // nlohmann reads an integer beyond 64 bits as a double: that is a range error, not a fraction.
    DPE_CHECK(s.find_first_of(".eE") != string_t::npos, "JSON: integer ", s, " out of the range [-2^63, 2^64) at byte ",
              offset());
    DPE_CHECK(false, "JSON: non-integer number ", s, " (only integers are supported) at byte ", offset());
    return false;
  }
  bool string(string_t& s) override { return put(Json(std::move(s))); }
  bool binary(binary_t&) override {
    DPE_INTERNAL_ASSERT(false, "nlohmann's JSON parser reported a binary value");
    return false;
  }
  bool start_object(std::size_t) override {
    open(Json::object());
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    DPE_CHECK(keys_.back().insert(k).second, "JSON: duplicate key \"", k, "\" at byte ", offset());
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    open(Json::array());
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error while parsing ..."
    // becomes "syntax error while parsing ...": the position is given as a byte offset instead.
    std::string what = ex.what();
    const size_t column = what.find("column ");
    if (column != std::string::npos) {
      const size_t colon = what.find(": ", column);
      if (colon != std::string::npos) what = what.substr(colon + 2);
    }
    DPE_CHECK(false, "JSON: ", what, " at byte ", position);
    return false;
  }

 private:
  size_t offset() const { return static_cast<size_t>(*read_ - begin_); }

  void check_depth() const {
    // A value inside more than kMaxDepth open containers (the old reader's limit, kept).
    DPE_CHECK(stack_.size() <= static_cast<size_t>(kMaxDepth), "JSON: nesting deeper than ", kMaxDepth, " at byte ",
              offset());
  }

  // Stores v where the next value goes and returns a pointer to it.
  Json* place(Json v) {
    check_depth();
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    append_member(top, std::move(key_), std::move(v));
    return &top.get_ref<Json::object_t&>().back().second;
  }
  bool put(Json v) {
    place(std::move(v));
    return true;
  }
  // A container's element stays put while it is open: its parent only grows after it is closed.
  void open(Json v) { stack_.push_back(place(std::move(v))); }

  const char* begin_;
  const char** read_;
  Json root_;
  std::vector<Json*> stack_;
  std::vector<std::unordered_set<std::string>> keys_;
  std::string key_;
};

}  // namespace

void append_member(Json& object, std::string key, Json value) {
  DPE_INTERNAL_ASSERT(object.is_object(), "append_member on a ", kind_name(object));
  // ordered_map is a std::vector of pairs underneath: emplace_back is what operator[] does for a new key.
  static_cast<Json::object_t::Container&>(object.get_ref<Json::object_t&>()).emplace_back(std::move(key),
                                                                                            std::move(value));
}

Json parse_header(std::string_view text) {
  const char* read = text.data();
  Handler handler(text.data(), &read);
  nlohmann::json_sax<Json>* sax = &handler;
  Json::sax_parse(CountingIterator(text.data(), &read), CountingIterator(text.data() + text.size(), &read), sax);
  return handler.take();
}

std::string dump_header(const Json& v) {
  try {
    return v.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::strict);
  } catch (const nlohmann::json::type_error& e) {
    DPE_CHECK(false, "JSON: cannot write a string that is not valid UTF-8 (", e.what(), ")");
  }
  __builtin_unreachable();
}

void check_disjoint_ranges(std::vector<TensorRange> ranges) {
  std::erase_if(ranges, [](const TensorRange& r) { return r.end <= r.begin; });  // empty: no bytes to share
  std::sort(ranges.begin(), ranges.end(), [](const TensorRange& a, const TensorRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : (a.end != b.end ? a.end < b.end : a.name < b.name);
  });
  // Sorted by begin, a range shares bytes with an earlier one exactly when it begins before the largest end
  // so far; the range holding that end is the one named.
  const TensorRange* reach = nullptr;
  for (const TensorRange& r : ranges) {
    if (reach != nullptr && r.begin < reach->end) {
      const uint64_t shared_end = std::min(reach->end, r.end);
      const bool same = r.begin == reach->begin && r.end == reach->end;
      DPE_CHECK(false, "entries '", reach->name, "' (data_offsets [", reach->begin, ", ", reach->end, "]) and '",
                r.name, "' (data_offsets [", r.begin, ", ", r.end, "]) ",
                same ? "are the same bytes" : "overlap in bytes [", same ? "" : std::to_string(r.begin),
                same ? "" : ", ", same ? "" : std::to_string(shared_end), same ? "" : ")",
                " of the data section; expected every tensor to have bytes of its own");
    }
    if (reach == nullptr || r.end > reach->end) reach = &r;
  }
}

const char* kind_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "object";
    case Json::value_t::array: return "array";
    case Json::value_t::string: return "string";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::binary: return "binary";
    case Json::value_t::discarded: return "discarded";
  }
  return "?";
}

}  // namespace dpe::io::safetensors
