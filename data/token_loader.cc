#include "data/token_loader.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.h"
#include "data/distributed_sampler.h"
#include "io/safetensors_header.h"

namespace dpe::data {
namespace {

using Json = io::safetensors::Json;

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// ---- TokenLoaderState's JSON ----

const Json& member(const Json& object, const char* key) {
  const auto it = object.find(key);
  DPE_CHECK(it != object.end(), "TokenLoaderState: key '", key, "' is missing");
  return *it;
}

int64_t int_member(const Json& object, const char* key) {
  const Json& v = member(object, key);
  DPE_CHECK(v.is_number_integer(), "TokenLoaderState: '", key, "' is ", io::safetensors::kind_name(v),
            "; expected an integer");
  DPE_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), "TokenLoaderState: '",
            key, "' is ", v.get<uint64_t>(), "; expected an integer below 2^63");
  return v.get<int64_t>();
}

uint64_t uint_member(const Json& object, const char* key) {
  const Json& v = member(object, key);
  DPE_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), "TokenLoaderState: '", key,
            "' is ", v.is_number_integer() ? std::to_string(v.get<int64_t>()) : io::safetensors::kind_name(v),
            "; expected an integer in [0, 2^64)");
  return v.get<uint64_t>();
}

// object[key], which must be of the kind `is` tests ("a string", "a boolean", "an array": `expected`).
const Json& typed_member(const Json& object, const char* key, bool (Json::*is)() const noexcept, const char* expected) {
  const Json& v = member(object, key);
  DPE_CHECK((v.*is)(), "TokenLoaderState: '", key, "' is ", io::safetensors::kind_name(v), "; expected ", expected);
  return v;
}

void check_keys(const Json& object, std::initializer_list<const char*> keys, const char* what) {
  for (const auto& [key, value] : object.items()) {
    DPE_CHECK(std::find_if(keys.begin(), keys.end(), [&](const char* k) { return key == k; }) != keys.end(),
              "TokenLoaderState: unknown key '", key, "' in ", what);
  }
}

Packing parse_packing(const std::string& name) {
  if (name == "packed") return Packing::Packed;
  DPE_CHECK(name == "document", "TokenLoaderState: 'packing' is \"", name, "\"; expected \"packed\" or \"document\"");
  return Packing::Document;
}

}  // namespace

const char* packing_name(Packing packing) { return packing == Packing::Packed ? "packed" : "document"; }

std::string TokenLoaderState::to_json() const {
  Json shard_list = Json::array();
  for (const ShardId& s : shards) {
    Json entry = Json::object();
    entry["name"] = s.name;
    entry["tokens"] = s.tokens;
    shard_list.push_back(std::move(entry));
  }
  Json j = Json::object();
  j["epoch"] = epoch;
  j["step_in_epoch"] = step_in_epoch;
  j["seed"] = seed;
  j["shards"] = std::move(shard_list);
  j["seq_len"] = seq_len;
  j["batch_size"] = batch_size;
  j["packing"] = packing_name(packing);
  j["shuffle"] = shuffle;
  j["bos"] = bos;
  j["pad"] = pad;
  j["ignore_index"] = ignore_index;
  return io::safetensors::dump_header(j);
}

TokenLoaderState TokenLoaderState::from_json(const std::string& text) {
  const Json j = io::safetensors::parse_header(text);
  DPE_CHECK(j.is_object(), "TokenLoaderState: the JSON is ", io::safetensors::kind_name(j), "; expected an object");
  check_keys(j,
             {"epoch", "step_in_epoch", "seed", "shards", "seq_len", "batch_size", "packing", "shuffle", "bos", "pad",
              "ignore_index"},
             "the state");
  TokenLoaderState s;
  s.epoch = int_member(j, "epoch");
  s.step_in_epoch = int_member(j, "step_in_epoch");
  s.seed = uint_member(j, "seed");
  s.seq_len = int_member(j, "seq_len");
  s.batch_size = int_member(j, "batch_size");
  s.packing = parse_packing(typed_member(j, "packing", &Json::is_string, "a string").get<std::string>());
  s.shuffle = typed_member(j, "shuffle", &Json::is_boolean, "a boolean").get<bool>();
  s.bos = int_member(j, "bos");
  s.pad = int_member(j, "pad");
  s.ignore_index = int_member(j, "ignore_index");
  for (const Json& entry : typed_member(j, "shards", &Json::is_array, "an array")) {
    DPE_CHECK(entry.is_object(), "TokenLoaderState: shard ", s.shards.size(), " is ",
              io::safetensors::kind_name(entry), "; expected an object {\"name\", \"tokens\"}");
    check_keys(entry, {"name", "tokens"}, "a shard");
    const Json& name = member(entry, "name");
    DPE_CHECK(name.is_string(), "TokenLoaderState: shard ", s.shards.size(), "'s 'name' is ",
              io::safetensors::kind_name(name), "; expected a string");
    s.shards.push_back({name.get<std::string>(), int_member(entry, "tokens")});
  }
  return s;
}

TokenLoader::TokenLoader(const std::vector<std::string>& shard_paths, TokenLoaderOptions options)
    : options_(std::move(options)) {
  const TokenLoaderOptions& o = options_;
  DPE_CHECK(!shard_paths.empty(), "TokenLoader: no shards given; expected at least one (data::list_shards)");
  DPE_CHECK(o.seq_len >= 1 && o.seq_len <= kMaxShardTokens - 1, "TokenLoader: seq_len ", o.seq_len,
            " is invalid; expected 1 <= seq_len <= ", kMaxShardTokens - 1, " (a window of seq_len + 1 tokens must fit "
            "in a shard)");
  DPE_CHECK(o.batch_size >= 1, "TokenLoader: batch_size ", o.batch_size, " is invalid; expected batch_size >= 1");
  DPE_CHECK(o.num_processes >= 1, "TokenLoader: num_processes ", o.num_processes,
            " is invalid; expected num_processes >= 1");
  DPE_CHECK(o.process_rank >= 0 && o.process_rank < o.num_processes, "TokenLoader: process_rank ", o.process_rank,
            " is out of range for num_processes ", o.num_processes, "; expected 0 <= process_rank < ",
            o.num_processes);
  if (o.batch_size % o.num_processes != 0) {
    const int64_t below = o.batch_size / o.num_processes * o.num_processes;
    DPE_CHECK(false, "TokenLoader: batch_size ", o.batch_size, " is not a multiple of num_processes ",
              o.num_processes, "; expected every process to take an equal slice of the global batch: batch_size ",
              below > 0 ? std::to_string(below) + " or " : std::string(), below + o.num_processes);
  }
  DPE_CHECK(o.vocab_size >= 0, "TokenLoader: vocab_size ", o.vocab_size,
            " is negative; expected 0 (tokens not checked) or the vocabulary size");
  if (o.packing == Packing::Document) {
    DPE_CHECK(o.bos >= 0, "TokenLoader: bos ", o.bos,
              " is invalid; Packing::Document needs the token id that starts each document (bos >= 0)");
    DPE_CHECK(o.pad >= 0, "TokenLoader: pad ", o.pad, " is invalid; expected a token id >= 0");
    if (o.vocab_size > 0) {
      DPE_CHECK(o.bos < o.vocab_size, "TokenLoader: bos ", o.bos, " is out of range; expected a token in [0, ",
                o.vocab_size, ") (vocab_size)");
      DPE_CHECK(o.pad < o.vocab_size, "TokenLoader: pad ", o.pad, " is out of range; expected a token in [0, ",
                o.vocab_size, ") (vocab_size)");
    }
  }

  shards_.reserve(shard_paths.size());
  for (const std::string& path : shard_paths) shards_.push_back(TokenShard::open(path, o.vocab_size));
  DPE_CHECK(shards_.size() <= INT32_MAX, "TokenLoader: ", shards_.size(), " shards; expected at most 2^31 - 1");

  const int64_t T = o.seq_len;
  if (o.packing == Packing::Packed) {
    // Shard s: floor((n - 1) / T) windows starting at 0, T, 2T, ... (each T + 1 tokens).
    windows_before_.assign(1, 0);
    for (const TokenShard& shard : shards_) {
      const int64_t n = shard.size();
      windows_before_.push_back(windows_before_.back() + (n >= T + 1 ? (n - 1) / T : 0));
    }
    num_windows_ = static_cast<size_t>(windows_before_.back());
  } else {
    // Documents [a, b): from a BOS (or the shard's start) to the next BOS (or the shard's end).
    std::vector<int64_t> block;
    for (size_t s = 0; s < shards_.size(); ++s) {
      const TokenShard& shard = shards_[s];
      auto emit = [&](int64_t a, int64_t b) {
        for (int64_t start = a; start < b - 1; start += T) {
          windows_.push_back({start, static_cast<int32_t>(s), static_cast<int32_t>(std::min(T + 1, b - start))});
        }
      };
      constexpr int64_t kBlock = int64_t{1} << 16;
      int64_t doc_start = 0;
      for (int64_t begin = 0; begin < shard.size(); begin += kBlock) {
        const int64_t count = std::min(kBlock, shard.size() - begin);
        block.resize(static_cast<size_t>(count));
        shard.read(begin, count, block.data());
        for (int64_t k = 0; k < count; ++k) {
          const int64_t i = begin + k;
          if (block[k] == o.bos && i > doc_start) {
            emit(doc_start, i);
            doc_start = i;
          }
        }
      }
      emit(doc_start, shard.size());
    }
    num_windows_ = windows_.size();
  }
  DPE_CHECK(num_windows() >= o.batch_size, "TokenLoader: the ", shards_.size(),
            shards_.size() == 1 ? " shard holds " : " shards hold ", num_windows(), " windows of seq_len + 1 = ", T + 1, " tokens (",
            packing_name(o.packing), " packing), fewer than one global batch of ", o.batch_size,
            " windows; expected at least ", o.batch_size, " windows (more data, a smaller batch_size or a shorter "
            "seq_len)");
}

TokenLoader::Window TokenLoader::window(int64_t w) const {
  if (options_.packing == Packing::Document) return windows_[static_cast<size_t>(w)];
  // The shard s with windows_before_[s] <= w < windows_before_[s + 1].
  const auto it = std::upper_bound(windows_before_.begin(), windows_before_.end(), w);
  const int64_t s = (it - windows_before_.begin()) - 1;
  return {(w - windows_before_[s]) * options_.seq_len, static_cast<int32_t>(s),
          static_cast<int32_t>(options_.seq_len + 1)};
}

const std::vector<int64_t>& TokenLoader::order() {
  if (order_epoch_ != epoch_) {
    DistributedSampler sampler(num_windows(), {.num_replicas = 1, .rank = 0, .shuffle = options_.shuffle,
                                                .seed = options_.seed, .drop_last = true});
    sampler.set_epoch(epoch_);
    order_ = sampler.indices();
    order_epoch_ = epoch_;
  }
  return order_;
}

TokenBatch TokenLoader::next_batch() {
  // inputs, targets, padding_mask: (rows, T) int64  <-  windows order[step*B + p*rows : step*B + (p+1)*rows]
  const int64_t T = options_.seq_len;
  const int64_t rows = rows_per_process();
  const bool document = options_.packing == Packing::Document;
  const std::vector<int64_t>& ord = order();
  TokenBatch batch;
  batch.epoch = epoch_;
  batch.step = step_;
  batch.inputs = Tensor::empty({rows, T}, DType::Int64);
  batch.targets = Tensor::empty({rows, T}, DType::Int64);
  if (document) batch.padding_mask = Tensor::empty({rows, T}, DType::Int64);
  int64_t* x = batch.inputs.data<int64_t>();
  int64_t* y = batch.targets.data<int64_t>();
  int64_t* m = document ? batch.padding_mask.data<int64_t>() : nullptr;
  std::vector<int64_t> tokens(static_cast<size_t>(T + 1));
  const int64_t first = step_ * options_.batch_size + options_.process_rank * rows;
  for (int64_t r = 0; r < rows; ++r) {
    const Window win = window(ord[static_cast<size_t>(first + r)]);
    const int64_t real = win.length;
    shards_[static_cast<size_t>(win.shard)].read(win.start, real, tokens.data());
    for (int64_t j = 0; j < T; ++j) {
      x[r * T + j] = j < real ? tokens[j] : options_.pad;
      y[r * T + j] = j + 1 < real ? tokens[j + 1] : options_.ignore_index;
      if (m != nullptr) m[r * T + j] = j < real ? 1 : 0;
    }
  }
  if (++step_ == batches_per_epoch()) {
    step_ = 0;
    ++epoch_;
  }
  return batch;
}

void TokenLoader::set_epoch(int64_t epoch) {
  DPE_CHECK(epoch >= 0, "TokenLoader::set_epoch: epoch ", epoch, " is negative; expected epoch >= 0");
  epoch_ = epoch;
  step_ = 0;
}

TokenLoaderState TokenLoader::state() const {
  TokenLoaderState s;
  s.epoch = epoch_;
  s.step_in_epoch = step_;
  s.seed = options_.seed;
  for (const TokenShard& shard : shards_) s.shards.push_back({base_name(shard.path()), shard.size()});
  s.seq_len = options_.seq_len;
  s.batch_size = options_.batch_size;
  s.packing = options_.packing;
  s.shuffle = options_.shuffle;
  s.bos = options_.bos;
  s.pad = options_.pad;
  s.ignore_index = options_.ignore_index;
  return s;
}

void TokenLoader::restore(const TokenLoaderState& s) {
  const TokenLoaderState mine = state();
  const char* expected = "; expected the loader the state was saved from";
  DPE_CHECK(s.shards.size() == mine.shards.size(), "TokenLoader::restore: the state has ", s.shards.size(),
            " shards but this loader has ", mine.shards.size(), expected);
  for (size_t i = 0; i < s.shards.size(); ++i) {
    DPE_CHECK(s.shards[i] == mine.shards[i], "TokenLoader::restore: the state's shard ", i, " is ", s.shards[i].name,
              " (", s.shards[i].tokens, " tokens) but this loader's is ", mine.shards[i].name, " (",
              mine.shards[i].tokens, " tokens)", expected);
  }
  auto same = [&](const char* what, int64_t theirs, int64_t ours) {
    DPE_CHECK(theirs == ours, "TokenLoader::restore: the state's ", what, " ", theirs, " differs from this loader's ",
              ours, expected);
  };
  same("seq_len", s.seq_len, mine.seq_len);
  same("batch_size", s.batch_size, mine.batch_size);
  DPE_CHECK(s.packing == mine.packing, "TokenLoader::restore: the state's packing ", packing_name(s.packing),
            " differs from this loader's ", packing_name(mine.packing), expected);
  DPE_CHECK(s.shuffle == mine.shuffle, "TokenLoader::restore: the state's shuffle ", s.shuffle ? "true" : "false",
            " differs from this loader's ", mine.shuffle ? "true" : "false", expected);
  if (s.packing == Packing::Document) {  // they shape Document's rows only
    same("bos", s.bos, mine.bos);
    same("pad", s.pad, mine.pad);
    same("ignore_index", s.ignore_index, mine.ignore_index);
  }
  DPE_CHECK(s.epoch >= 0, "TokenLoader::restore: the state's epoch ", s.epoch, " is negative; expected epoch >= 0");
  DPE_CHECK(s.step_in_epoch >= 0 && s.step_in_epoch < batches_per_epoch(), "TokenLoader::restore: the state's "
            "step_in_epoch ", s.step_in_epoch, " is out of range; expected 0 <= step_in_epoch < ", batches_per_epoch(),
            " (the batches per epoch)");
  options_.seed = s.seed;
  epoch_ = s.epoch;
  step_ = s.step_in_epoch;
  order_epoch_ = -1;
}

}  // namespace dpe::data
