#include "data/token_loader.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/distributed_sampler.h"
#include "data/test_files.h"
#include "tests/testing/errors.h"

namespace dpe::data {
namespace {

using dpe::testing::error_of;
using testing::test_dir;
using Rows = std::vector<std::vector<int64_t>>;

constexpr int64_t I = -100;  // ignore_index

std::string shard(const std::string& dir, const std::string& name, const std::vector<uint32_t>& tokens,
                  int64_t vocab = 2000) {
  const std::string path = dir + "/" + name;
  write_token_shard(path, tokens, vocab);
  return path;
}

std::vector<uint32_t> iota_tokens(uint32_t first, uint32_t count) {
  std::vector<uint32_t> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

Rows rows(const Tensor& t) {
  Rows out;
  for (int64_t i = 0; i < t.size(0); ++i) out.push_back(t.select(0, i).to_vector<int64_t>());
  return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The rows of a batch, as one comparable value.
struct BatchRows {
  Rows inputs, targets, mask;
  bool operator==(const BatchRows&) const = default;
};
BatchRows of(const TokenBatch& b) {
  return {rows(b.inputs), rows(b.targets), b.padding_mask.defined() ? rows(b.padding_mask) : Rows{}};
}
BatchRows concat(const std::vector<BatchRows>& parts) {
  BatchRows all;
  for (const BatchRows& p : parts) {
    all.inputs.insert(all.inputs.end(), p.inputs.begin(), p.inputs.end());
    all.targets.insert(all.targets.end(), p.targets.begin(), p.targets.end());
    all.mask.insert(all.mask.end(), p.mask.begin(), p.mask.end());
  }
  return all;
}

TEST(TokenLoader, PackedWindowsAndTargets) {
  const std::string dir = test_dir();
  // 21 tokens 0..20, T = 4: windows [0..4], [4..8], [8..12], [12..16], [16..20]: (21 - 1) / 4 = 5.
  TokenLoader loader({shard(dir, "a_train_0.bin", iota_tokens(0, 21))},
                     {.seq_len = 4, .batch_size = 5, .shuffle = false});
  EXPECT_EQ(loader.num_windows(), 5);
  EXPECT_EQ(loader.batches_per_epoch(), 1);
  const TokenBatch b = loader.next_batch();
  EXPECT_EQ(b.inputs.shape(), (Shape{5, 4}));
  EXPECT_EQ(b.inputs.dtype(), DType::Int64);
  EXPECT_EQ(b.targets.dtype(), DType::Int64);
  EXPECT_EQ(b.inputs.device(), Device::cpu(0));
  EXPECT_FALSE(b.padding_mask.defined());
  EXPECT_EQ(rows(b.inputs), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}, {16, 17, 18, 19}}));
  EXPECT_EQ(rows(b.targets), (Rows{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}, {13, 14, 15, 16}, {17, 18, 19, 20}}));
  EXPECT_EQ(b.epoch, 0);
  EXPECT_EQ(b.step, 0);
  EXPECT_EQ(loader.epoch(), 1);  // that was epoch 0's only step
  EXPECT_EQ(loader.step_in_epoch(), 0);
}

TEST(TokenLoader, PackedWindowsNeverCrossShardsAndDropTails) {
  const std::string dir = test_dir();
  // 100..110 (11 tokens): windows [100..104] and [104..108]; 109 and 110, shorter than a window, are dropped.
  // 200..203 (4 tokens): no window. 300..304 (5 tokens): exactly one.
  TokenLoader loader({shard(dir, "a.bin", iota_tokens(100, 11)), shard(dir, "b.bin", iota_tokens(200, 4)),
                      shard(dir, "c.bin", iota_tokens(300, 5))},
                     {.seq_len = 4, .batch_size = 3, .shuffle = false});
  EXPECT_EQ(loader.num_windows(), 3);
  const TokenBatch b = loader.next_batch();
  EXPECT_EQ(rows(b.inputs), (Rows{{100, 101, 102, 103}, {104, 105, 106, 107}, {300, 301, 302, 303}}));
  EXPECT_EQ(rows(b.targets), (Rows{{101, 102, 103, 104}, {105, 106, 107, 108}, {301, 302, 303, 304}}));
}

TEST(TokenLoader, DocumentPaddingMaskAndIgnoreIndex) {
  const std::string dir = test_dir();
  constexpr uint32_t B = 1000;  // bos
  constexpr int64_t P = 999;    // pad
  // Documents: [7 8] (before the first BOS), [B 1 2], [B 3 4 5 6 7 8] (cut at 4), [B] (nothing to predict),
  // [B 9] (ends the shard: the next shard's leading 5 is a document of its own), then [5], [B 6].
  const std::string s0 = shard(dir, "d_train_0.bin", {7, 8, B, 1, 2, B, 3, 4, 5, 6, 7, 8, B, B, 9});
  const std::string s1 = shard(dir, "d_train_1.bin", {5, B, 6});
  TokenLoader loader({s0, s1}, {.seq_len = 4, .batch_size = 6, .packing = Packing::Document, .shuffle = false,
                                .vocab_size = 1001, .bos = B, .pad = P});
  EXPECT_EQ(loader.num_windows(), 6);
  const TokenBatch b = loader.next_batch();
  ASSERT_TRUE(b.padding_mask.defined());
  EXPECT_EQ(b.padding_mask.dtype(), DType::Int64);
  EXPECT_EQ(b.padding_mask.shape(), (Shape{6, 4}));
  EXPECT_EQ(rows(b.inputs), (Rows{{7, 8, P, P},
                                  {B, 1, 2, P},
                                  {B, 3, 4, 5},
                                  {6, 7, 8, P},
                                  {B, 9, P, P},
                                  {B, 6, P, P}}));
  EXPECT_EQ(rows(b.targets), (Rows{{8, I, I, I},
                                   {1, 2, I, I},
                                   {3, 4, 5, 6},
                                   {7, 8, I, I},
                                   {9, I, I, I},
                                   {6, I, I, I}}));
  EXPECT_EQ(rows(b.padding_mask), (Rows{{1, 1, 0, 0},
                                        {1, 1, 1, 0},
                                        {1, 1, 1, 1},
                                        {1, 1, 1, 0},
                                        {1, 1, 0, 0},
                                        {1, 1, 0, 0}}));
}

TEST(TokenLoader, DocumentExactFitAndOtherIgnoreIndex) {
  const std::string dir = test_dir();
  // [B 1 2 3 4] is exactly T + 1 = 5 tokens: one unpadded window. [B 5 6 7 8 9] is 6: a second window [8 9].
  const std::string s = shard(dir, "e.bin", {50, 1, 2, 3, 4, 50, 5, 6, 7, 8, 9});
  TokenLoader loader({s}, {.seq_len = 4, .batch_size = 3, .packing = Packing::Document, .shuffle = false,
                           .bos = 50, .pad = 0, .ignore_index = -1});
  const TokenBatch b = loader.next_batch();
  EXPECT_EQ(rows(b.inputs), (Rows{{50, 1, 2, 3}, {50, 5, 6, 7}, {8, 9, 0, 0}}));
  EXPECT_EQ(rows(b.targets), (Rows{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, -1, -1, -1}}));
  EXPECT_EQ(rows(b.padding_mask), (Rows{{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 0, 0}}));
}

// 1 + 4 * 26 tokens, T = 4: 26 windows; window w's first input token is 4w.
std::string windows26(const std::string& dir) { return shard(dir, "w_train_0.bin", iota_tokens(0, 1 + 4 * 26)); }

std::vector<int64_t> window_ids(const TokenBatch& b) {
  std::vector<int64_t> ids;
  for (const auto& row : rows(b.inputs)) ids.push_back(row[0] / 4);
  return ids;
}

TEST(TokenLoader, ShuffleIsTheSamplersOrderWithDropLast) {
  const std::string dir = test_dir();
  TokenLoader loader({windows26(dir)}, {.seq_len = 4, .batch_size = 6, .seed = 42});
  // 26 windows, 6 per step: 4 steps, the last 2 windows of each epoch's order are not read.
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    DistributedSampler sampler(26, {.shuffle = true, .seed = 42});
    sampler.set_epoch(epoch);
    const std::vector<int64_t> order = sampler.indices();
    std::set<int64_t> seen;
    for (int64_t step = 0; step < 4; ++step) {
      const TokenBatch b = loader.next_batch();
      EXPECT_EQ(b.epoch, epoch);
      EXPECT_EQ(b.step, step);
      EXPECT_EQ(window_ids(b), std::vector<int64_t>(order.begin() + step * 6, order.begin() + step * 6 + 6));
      for (int64_t w : window_ids(b)) EXPECT_TRUE(seen.insert(w).second) << "window " << w << " twice in an epoch";
      // Targets stay the inputs shifted by one inside the shuffled rows.
      const Rows x = rows(b.inputs), y = rows(b.targets);
      for (size_t r = 0; r < x.size(); ++r) {
        EXPECT_EQ(y[r], (std::vector<int64_t>{x[r][1], x[r][2], x[r][3], x[r][0] + 4}));
      }
    }
    EXPECT_EQ(seen.size(), 24u);
  }
}

TEST(TokenLoader, OrderChangesWithEpochAndSeedOnly) {
  const std::string dir = test_dir();
  const std::string s = windows26(dir);
  auto first_batch = [&](uint64_t seed, int64_t epoch) {
    TokenLoader l({s}, {.seq_len = 4, .batch_size = 24, .seed = seed});
    l.set_epoch(epoch);
    return window_ids(l.next_batch());
  };
  EXPECT_EQ(first_batch(42, 0), first_batch(42, 0));
  EXPECT_NE(first_batch(42, 0), first_batch(42, 1));
  EXPECT_NE(first_batch(42, 0), first_batch(43, 0));
  // Seed + epoch, like DistributedSampler: seed 42 epoch 1 is seed 43 epoch 0.
  EXPECT_EQ(first_batch(42, 1), first_batch(43, 0));
  // Without shuffle: 0, 1, 2, ... every epoch.
  TokenLoader plain({s}, {.seq_len = 4, .batch_size = 24, .shuffle = false});
  plain.set_epoch(5);
  std::vector<int64_t> expected(24);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(window_ids(plain.next_batch()), expected);
}

// The loader has no notion of devices: 1, 2 or 3 devices of one process are given the same global batch, which
// DataParallel then scatters. What could make it differ is the process split and the history of calls: the
// global batch at (epoch, step) is the same whatever they are.
TEST(TokenLoader, GlobalBatchDependsOnlyOnSeedAndEpoch) {
  const std::string dir = test_dir();
  const std::string s = windows26(dir);
  const TokenLoaderOptions base{.seq_len = 4, .batch_size = 6, .seed = 7};
  TokenLoader reference({s}, base);
  std::vector<BatchRows> expected;
  for (int i = 0; i < 8; ++i) expected.push_back(of(reference.next_batch()));  // 2 epochs of 4 steps

  for (int64_t P : {1, 2, 3}) {
    std::vector<TokenLoader> processes;
    for (int64_t p = 0; p < P; ++p) {
      TokenLoaderOptions o = base;
      o.num_processes = P;
      o.process_rank = p;
      processes.emplace_back(std::vector<std::string>{s}, o);
    }
    EXPECT_EQ(processes[0].rows_per_process(), 6 / P);
    for (int i = 0; i < 8; ++i) {
      std::vector<BatchRows> slices;
      for (TokenLoader& l : processes) slices.push_back(of(l.next_batch()));
      EXPECT_EQ(concat(slices), expected[i]) << P << " processes, batch " << i;
    }
  }
  // Jumping to epoch 1 directly gives epoch 1's batches, as iterating through epoch 0 did.
  TokenLoader jumped({s}, base);
  jumped.set_epoch(1);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(of(jumped.next_batch()), expected[i]);
}

TEST(TokenLoader, DocumentSlicesConcatenateToTheGlobalBatch) {
  const std::string dir = test_dir();
  const std::string s = shard(dir, "d.bin", {9, 1, 2, 9, 3, 9, 4, 5, 6, 7, 8, 9, 1, 9, 2, 3});
  const TokenLoaderOptions base{.seq_len = 3, .batch_size = 6, .packing = Packing::Document, .seed = 3, .bos = 9,
                                .pad = 0};
  TokenLoader one({s}, base);
  ASSERT_EQ(one.num_windows(), 6);
  TokenLoaderOptions o0 = base, o1 = base;
  o0.num_processes = o1.num_processes = 2;
  o1.process_rank = 1;
  TokenLoader p0({s}, o0), p1({s}, o1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(concat({of(p0.next_batch()), of(p1.next_batch())}), of(one.next_batch()));
}

TEST(TokenLoader, StateRestoreContinuesExactly) {
  const std::string dir = test_dir();
  const std::string s = windows26(dir);
  const TokenLoaderOptions options{.seq_len = 4, .batch_size = 6, .seed = 11};
  // Mid-epoch (after 2 of 4 steps), at an epoch boundary (after 4), on an epoch's last step (after 7).
  for (int taken : {2, 4, 7}) {
    TokenLoader original({s}, options);
    for (int i = 0; i < taken; ++i) original.next_batch();
    const TokenLoaderState st = original.state();
    EXPECT_EQ(st.epoch, taken / 4);
    EXPECT_EQ(st.step_in_epoch, taken % 4);
    EXPECT_EQ(st.seed, 11u);
    TokenLoaderOptions other = options;
    other.seed = 999;  // the state's seed wins: the order is a function of it
    TokenLoader restored({s}, other);
    restored.restore(TokenLoaderState::from_json(st.to_json()));
    for (int i = 0; i < 6; ++i) {
      const TokenBatch a = original.next_batch(), b = restored.next_batch();
      EXPECT_EQ(b.epoch, a.epoch);
      EXPECT_EQ(b.step, a.step);
      EXPECT_EQ(of(b), of(a)) << "after " << taken << " batches, batch " << i << " of the continuation";
    }
  }
  // A state saved by one process continues in two: the position counts global batches.
  TokenLoader one({s}, options);
  one.next_batch();
  const TokenLoaderState st = one.state();
  TokenLoaderOptions o0 = options, o1 = options;
  o0.num_processes = o1.num_processes = 2;
  o1.process_rank = 1;
  TokenLoader p0({s}, o0), p1({s}, o1);
  p0.restore(st);
  p1.restore(st);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(concat({of(p0.next_batch()), of(p1.next_batch())}), of(one.next_batch()));
}

TEST(TokenLoader, StateJson) {
  TokenLoaderState st;
  st.epoch = 1;
  st.step_in_epoch = 2;
  st.seed = 18446744073709551615u;  // 2^64 - 1 stays exact
  st.shards = {{"a_train_0.bin", 21}, {"a_train_1.bin", 5}};
  st.seq_len = 4;
  st.batch_size = 2;
  st.packing = Packing::Document;
  st.shuffle = false;
  st.bos = 50256;
  st.pad = 0;
  st.ignore_index = -100;
  const std::string json =
      R"({"epoch":1,"step_in_epoch":2,"seed":18446744073709551615,"shards":[{"name":"a_train_0.bin","tokens":21},)"
      R"({"name":"a_train_1.bin","tokens":5}],"seq_len":4,"batch_size":2,"packing":"document","shuffle":false,)"
      R"("bos":50256,"pad":0,"ignore_index":-100})";
  EXPECT_EQ(st.to_json(), json);
  const TokenLoaderState back = TokenLoaderState::from_json(json);
  EXPECT_EQ(back.to_json(), json);
  EXPECT_EQ(back.seed, 18446744073709551615u);
  EXPECT_EQ(back.shards, st.shards);
  EXPECT_EQ(back.packing, Packing::Document);

  auto error = [](const std::string& text) { return error_of([&] { TokenLoaderState::from_json(text); }); };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = json;
    t.replace(t.find(from), from.size(), to);
    return error(t);
  };
  EXPECT_TRUE(contains(replaced(R"("epoch":1,)", ""), "key 'epoch' is missing"));
  EXPECT_TRUE(contains(replaced(R"("seq_len":4)", R"("seq_len":"4")"), "'seq_len' is string; expected an integer"));
  EXPECT_TRUE(contains(replaced(R"("seq_len":4)", R"("seq_len":4.5)"), "non-integer number"));
  EXPECT_TRUE(contains(replaced(R"("seed":18446744073709551615)", R"("seed":-1)"),
                       "'seed' is -1; expected an integer in [0, 2^64)"));
  EXPECT_TRUE(contains(replaced(R"("epoch":1)", R"("epoch":9223372036854775808)"),
                       "'epoch' is 9223372036854775808; expected an integer below 2^63"));
  EXPECT_TRUE(contains(replaced(R"("packing":"document")", R"("packing":"rows")"),
                       "'packing' is \"rows\"; expected \"packed\" or \"document\""));
  EXPECT_TRUE(contains(replaced(R"("shuffle":false)", R"("shuffle":0)"), "'shuffle' is integer; expected a boolean"));
  EXPECT_TRUE(contains(replaced(R"("pad":0,)", R"("pad":0,"padding":1,)"), "unknown key 'padding' in the state"));
  EXPECT_TRUE(contains(replaced(R"("tokens":5})", R"("tokens":5,"size":3})"), "unknown key 'size' in a shard"));
  EXPECT_TRUE(contains(replaced(R"("name":"a_train_1.bin")", R"("name":1)"), "shard 1's 'name' is integer"));
  EXPECT_TRUE(contains(replaced(R"("pad":0,)", R"("pad":0,"pad":1,)"), "duplicate key"));
  EXPECT_TRUE(contains(error("[1]"), "the JSON is array; expected an object"));
  EXPECT_NE(error("{\"epoch\":"), "(no error)");
}

TEST(TokenLoader, RestoreRefusesAnotherConfiguration) {
  const std::string dir = test_dir();
  const std::string a = shard(dir, "a_train_0.bin", iota_tokens(0, 49));  // 12 windows of T = 4
  const std::string b = shard(dir, "b_train_0.bin", iota_tokens(0, 49));
  const std::string c = shard(dir, "c_train_0.bin", iota_tokens(0, 53));
  const TokenLoaderOptions o{.seq_len = 4, .batch_size = 3, .seed = 1};
  const TokenLoaderState st = TokenLoader({a}, o).state();
  auto restore_error = [&](const std::vector<std::string>& shards, TokenLoaderOptions options,
                           const TokenLoaderState& state) {
    TokenLoader l(shards, options);
    return error_of([&] { l.restore(state); });
  };
  std::string e = restore_error({a, a}, o, st);
  EXPECT_TRUE(contains(e, "the state has 1 shards but this loader has 2")) << e;
  e = restore_error({b}, o, st);
  EXPECT_TRUE(contains(e, "the state's shard 0 is a_train_0.bin (49 tokens) but this loader's is b_train_0.bin (49 "
                          "tokens)")) << e;
  // Same name, other contents: a shard rewritten with another token count.
  TokenLoaderState renamed = st;
  renamed.shards[0].name = "c_train_0.bin";
  e = restore_error({c}, o, renamed);
  EXPECT_TRUE(contains(e, "is c_train_0.bin (49 tokens) but this loader's is c_train_0.bin (53 tokens)")) << e;
  TokenLoaderOptions other = o;
  other.seq_len = 3;
  EXPECT_TRUE(contains(restore_error({a}, other, st), "the state's seq_len 4 differs from this loader's 3"));
  other = o;
  other.batch_size = 4;
  EXPECT_TRUE(contains(restore_error({a}, other, st), "the state's batch_size 3 differs from this loader's 4"));
  other = o;
  other.packing = Packing::Document;
  other.bos = 0;
  EXPECT_TRUE(contains(restore_error({a}, other, st), "the state's packing packed differs from this loader's document"));
  other = o;
  other.shuffle = false;
  EXPECT_TRUE(contains(restore_error({a}, other, st), "the state's shuffle true differs from this loader's false"));
  TokenLoaderState doc = st;
  doc.packing = Packing::Document;
  doc.bos = 5;
  other = o;
  other.packing = Packing::Document;
  other.bos = 6;
  EXPECT_TRUE(contains(restore_error({a}, other, doc), "the state's bos 5 differs from this loader's 6"));
  TokenLoaderState late = st;
  late.step_in_epoch = 4;  // 12 windows / 3 = 4 steps: 0..3
  EXPECT_TRUE(contains(restore_error({a}, o, late), "step_in_epoch 4 is out of range; expected 0 <= step_in_epoch < 4"));
  late.step_in_epoch = 0;
  late.epoch = -1;
  EXPECT_TRUE(contains(restore_error({a}, o, late), "the state's epoch -1 is negative"));
  // A refused restore leaves the loader where it was.
  TokenLoader l({a}, o);
  l.next_batch();
  EXPECT_NE(error_of([&] { l.restore(late); }), "(no error)");
  EXPECT_EQ(l.step_in_epoch(), 1);
}

TEST(TokenLoader, Errors) {
  const std::string dir = test_dir();
  const std::string s = shard(dir, "a.bin", iota_tokens(0, 21));  // 5 windows of T = 4
  auto error = [&](TokenLoaderOptions o, std::vector<std::string> shards = {}) {
    if (shards.empty()) shards = {s};
    return error_of([&] { TokenLoader loader(shards, o); });
  };
  EXPECT_TRUE(contains(error({.seq_len = 0, .batch_size = 1}), "seq_len 0 is invalid; expected 1 <= seq_len"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 0}), "batch_size 0 is invalid; expected batch_size >= 1"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 6}),
                       "the 1 shard holds 5 windows of seq_len + 1 = 5 tokens (packed packing), fewer than one global "
                       "batch of 6 windows"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 2, .num_processes = 2, .process_rank = 2}),
                       "process_rank 2 is out of range for num_processes 2; expected 0 <= process_rank < 2"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 2, .num_processes = 2, .process_rank = -1}),
                       "process_rank -1 is out of range"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1, .num_processes = 0}), "num_processes 0 is invalid"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 5, .num_processes = 2}),
                       "batch_size 5 is not a multiple of num_processes 2; expected every process to take an equal "
                       "slice of the global batch: batch_size 4 or 6"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1, .num_processes = 3}), "batch_size 3"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1, .packing = Packing::Document}),
                       "bos -1 is invalid; Packing::Document needs the token id that starts each document"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1, .packing = Packing::Document, .vocab_size = 21, .bos = 21}),
                       "bos 21 is out of range; expected a token in [0, 21)"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1, .packing = Packing::Document, .vocab_size = 21, .bos = 0,
                              .pad = 30}),
                       "pad 30 is out of range"));
  // The shard's own checks, at construction.
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1, .vocab_size = 20}),
                       "token 20 at index 20 (byte 1064) is out of range; expected a token in [0, 20)"));
  EXPECT_TRUE(contains(error({.seq_len = 4, .batch_size = 1}, {s, dir + "/missing.bin"}), "cannot open"));
  EXPECT_TRUE(contains(error_of([&] { TokenLoader loader({}, {.seq_len = 4, .batch_size = 1}); }), "no shards given"));
  TokenLoader ok({s}, {.seq_len = 4, .batch_size = 1});
  EXPECT_TRUE(contains(error_of([&] { ok.set_epoch(-1); }), "epoch -1 is negative"));
}

}  // namespace
}  // namespace dpe::data
