// The JSON of safetensors headers (io/checkpoint.h), read and written with nlohmann-json, held to what a
// safetensors header may be.
//
// parse_header() accepts one JSON value (surrounding whitespace allowed) as nlohmann's strict parser does
// (strings must be valid UTF-8; every escape, \uXXXX surrogate pairs included, decoded to UTF-8), and also
// rejects, with a dpe::Error "JSON: <what> at byte <offset>" (offset: the bytes read when the problem was
// seen), what nlohmann would accept but a header must not hold:
//   - a duplicate key in an object (nlohmann would silently keep the last one), named in the message;
//   - nesting deeper than kMaxDepth (a value inside more than 64 open arrays/objects): nlohmann's parser
//     recurses, so deep input is stopped from the SAX callbacks before it can exhaust the stack;
//   - a fraction or an exponent ("non-integer number"), and integers outside [-2^63, 2^64) (nlohmann would
//     turn them into inexact doubles): numbers stay exact, offsets up to 2^64 - 1 included.
// Objects keep their keys in file order (nlohmann::ordered_json), so dump_header(parse_header(t)) writes
// the members in the order they were read, and a checkpoint's header is written in the order it was built.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dpe::io::safetensors {

using Json = nlohmann::ordered_json;

inline constexpr int kMaxDepth = 64;

// Appends key: value to an object without looking for an equal key (nlohmann's operator[] searches the
// ordered map linearly, which makes building or parsing an n-key object O(n^2)). The caller guarantees the key
// is new: parse_header checks with a hash set, checkpoint writing by construction.
void append_member(Json& object, std::string key, Json value);

// Throws dpe::Error as described above; nlohmann's own syntax errors keep its wording.
Json parse_header(std::string_view text);

// Compact JSON text (no whitespace). A string that is not valid UTF-8 cannot be written as JSON: dpe::Error.
std::string dump_header(const Json& v);

// One tensor's data_offsets: bytes [begin, end) of the data section.
struct TensorRange {
  std::string name;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Refuses byte ranges that share a byte: two tensors with the same data_offsets (aliased) or partly
// overlapping ones, which safetensors' own reader refuses too (writing one tensor would change the other).
// Empty ranges share nothing. Throws dpe::Error naming both tensors, their ranges and the shared bytes
// ("entries 'a' (data_offsets [0, 48]) and 'b' (data_offsets [16, 64]) overlap in bytes [16, 48) ...").
// O(n log n) in the number of ranges.
void check_disjoint_ranges(std::vector<TensorRange> ranges);

// "object", "array", "string", "integer", "number" (a double: never in a parsed header), "boolean", "null".
const char* kind_name(const Json& v);

}  // namespace dpe::io::safetensors
