#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "io/safetensors_header.h"
#include "tests/testing/errors.h"
#include "tests/testing/golden.h"

namespace dpe::io {
namespace {

namespace fs = std::filesystem;
using dpe::testing::describe_wait_status;
using dpe::testing::error_of;

// fc1: Linear(4, 3), relu, fc2: Linear(3, 2); optionally an int64 buffer (checkpoints keep every dtype).
class Mlp : public nn::Cloneable<Mlp> {
 public:
  explicit Mlp(DType dtype = DType::Float64, bool with_buffer = false)
      : Cloneable("Mlp"), dtype_(dtype), with_buffer_(with_buffer) {
    reset();
  }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{4, 3, true, TensorOptions(dtype_)}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{3, 2, true, TensorOptions(dtype_)}));
    if (with_buffer_) count = register_buffer("count", Tensor::from_vector(std::vector<int64_t>{7, -1}, {2}));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }

  std::shared_ptr<nn::Linear> fc1, fc2;
  Tensor count;

 private:
  DType dtype_;
  bool with_buffer_;
};

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return (fs::path(dir ? dir : fs::temp_directory_path().string()) / name).string();
}

// The temporaries a save of `path` may leave: `<name>.tmp` (the old fixed name) and `<name>.tmp.XXXXXX`.
std::vector<std::string> temporaries_of(const std::string& path) {
  std::vector<std::string> out;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp";
  for (const auto& entry : fs::directory_iterator(p.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

std::vector<Tensor> snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const auto& [name, t] : m.state_dict()) out.push_back(t.detach().clone());
  return out;
}

bool same_state(const nn::Module& m, const std::vector<Tensor>& snap) {
  nn::StateDict sd = m.state_dict();
  if (sd.size() != snap.size()) return false;
  for (size_t i = 0; i < sd.size(); ++i) {
    if (!equal(sd[i].second, snap[i])) return false;
  }
  return true;
}

// One cross-entropy training step on a fixed batch.
void train_step(Mlp& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = nn::functional::cross_entropy(model.forward(x), y);
  loss.backward();
  opt.step();
}

struct Batch {
  Tensor x, y;
};
Batch make_batch() {
  Generator gen(123);
  return {randn({8, 4}, TensorOptions(DType::Float64), &gen),
          Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0, 1, 0, 0, 1}, {8})};
}

TEST(CheckpointTest, RoundTripIsBitExact) {
  manual_seed(1);
  Mlp model(DType::Float64, /*with_buffer=*/true);
  optim::AdamW opt(model.parameters(), {.lr = 0.01});
  Batch b = make_batch();
  train_step(model, opt, b.x, b.y);
  train_step(model, opt, b.x, b.y);
  rand({5});  // move the cpu:0 generator off its initial offset
  TrainingState st{.epoch = 3,
                   .step = 17,
                   .rng = {},
                   .metadata = {{"note", "h\xc3\xa9 \"quoted\"\n\\"}, {"k", ""}},
                   .grad_scaler = {{"scale", 32768.0},
                                   {"growth_tracker", 1999},
                                   {"backoff_factor", 0.1},
                                   {"growth_factor", 2.0},
                                   {"growth_interval", 2000}}};
  const std::string path = temp_path("roundtrip.safetensors");
  save_checkpoint(path, model, &opt, st);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_TRUE(temporaries_of(path).empty());
  const std::vector<double> next_random = rand({4}, TensorOptions(DType::Float64)).to_vector<double>();

  manual_seed(99);  // different init and generator state
  Mlp fresh(DType::Float64, true);
  {
    NoGradGuard no_grad;
    fresh.count.fill_(0);
  }
  optim::AdamW fresh_opt(fresh.parameters(), {.lr = 0.5});
  TrainingState loaded;
  load_checkpoint(path, fresh, &fresh_opt, &loaded);

  const nn::StateDict a = model.state_dict(), c = fresh.state_dict();
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, c[i].first);
    EXPECT_EQ(c[i].second.dtype(), a[i].second.dtype());
    EXPECT_TRUE(equal(a[i].second, c[i].second)) << a[i].first;
  }
  const optim::OptimizerStateDict s1 = opt.state_dict(), s2 = fresh_opt.state_dict();
  EXPECT_EQ(s2.param_groups[0].lr, 0.01);
  EXPECT_EQ(s2.param_groups[0].options, s1.param_groups[0].options);
  EXPECT_EQ(s2.scalars, s1.scalars);
  ASSERT_EQ(s2.tensors.size(), s1.tensors.size());
  for (const auto& [i, named] : s1.tensors) {
    for (const auto& [name, t] : named) EXPECT_TRUE(equal(s2.tensors.at(i).at(name), t)) << i << " " << name;
  }
  EXPECT_EQ(loaded.epoch, 3);
  EXPECT_EQ(loaded.step, 17);
  EXPECT_EQ(loaded.metadata, st.metadata);
  EXPECT_EQ(loaded.grad_scaler, st.grad_scaler);  // 0.1 too: 17 digits read back bit-identical
  EXPECT_EQ(loaded.rng.size(), capture_rng_state().size());
  // The generators continue where they were at save time.
  EXPECT_EQ(rand({4}, TensorOptions(DType::Float64)).to_vector<double>(), next_random);

  // The training state alone, from the header, without a model; no generator is set.
  const std::vector<GeneratorState> generators = capture_rng_state();
  const TrainingState header_only = read_training_state(path);
  EXPECT_EQ(header_only.epoch, 3);
  EXPECT_EQ(header_only.step, 17);
  EXPECT_EQ(header_only.metadata, st.metadata);
  EXPECT_EQ(header_only.grad_scaler, st.grad_scaler);
  ASSERT_EQ(header_only.rng.size(), loaded.rng.size());
  for (size_t i = 0; i < loaded.rng.size(); ++i) EXPECT_EQ(header_only.rng[i].offset, loaded.rng[i].offset);
  const std::vector<GeneratorState> after = capture_rng_state();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].offset, generators[i].offset) << after[i].device;
}

TEST(CheckpointTest, HeaderIsValidSafetensors) {
  Mlp model(DType::Float32);
  const std::string path = temp_path("layout.safetensors");
  save_checkpoint(path, model, nullptr);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // data 8-byte aligned
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find(R"("fc1.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]})"), std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("format":"pt")"), std::string::npos);
  // 4*3 + 3 + 3*2 + 2 floats of data.
  EXPECT_EQ(bytes.size() - 8 - n, (12u + 3 + 6 + 2) * 4);
}

// Train 2N steps = train N, save, load into fresh objects, train N: bit-identical parameters.
template <typename MakeOpt>
void check_resume(MakeOpt make_opt, const std::string& name) {
  const int N = 3;
  Batch b = make_batch();
  manual_seed(5);
  Mlp straight;
  auto opt = make_opt(straight);
  for (int i = 0; i < 2 * N; ++i) train_step(straight, *opt, b.x, b.y);

  manual_seed(5);
  Mlp first;
  auto opt1 = make_opt(first);
  for (int i = 0; i < N; ++i) train_step(first, *opt1, b.x, b.y);
  const std::string path = temp_path(name + ".safetensors");
  save_checkpoint(path, first, opt1.get(), {.epoch = 0, .step = N});

  manual_seed(77);
  Mlp resumed;
  auto opt2 = make_opt(resumed);
  TrainingState st;
  load_checkpoint(path, resumed, opt2.get(), &st);
  EXPECT_EQ(st.step, N);
  for (int i = 0; i < N; ++i) train_step(resumed, *opt2, b.x, b.y);
  const nn::StateDict a = straight.state_dict(), c = resumed.state_dict();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(equal(a[i].second, c[i].second)) << name << " " << a[i].first;
}

TEST(CheckpointTest, ResumeEquivalenceSgdMomentum) {
  check_resume(
      [](Mlp& m) {
        return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      },
      "sgd");
}

TEST(CheckpointTest, ResumeEquivalenceAdamW) {
  check_resume(
      [](Mlp& m) {
        return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
      },
      "adamw");
}

// ---- corrupt and mismatched files ----

// A file with the given header text and data bytes (length prefix computed unless overridden).
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               std::optional<uint64_t> length = std::nullopt) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

class CorruptFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    good_ = temp_path("good.safetensors");
    Mlp source(DType::Float32);
    optim::SGD opt(source.parameters(), {.lr = 0.1, .momentum = 0.9});
    Batch b = make_batch();
    save_checkpoint(good_, source, nullptr);
    model_ = std::make_unique<Mlp>(DType::Float32);
    opt_ = std::make_unique<optim::SGD>(model_->parameters(), optim::SGDOptions{.lr = 0.3, .momentum = 0.5});
    before_ = snapshot(*model_);
  }

  // Loads `path` into the model and returns the error ("" if none); checks the model is untouched.
  std::string load_error(const std::string& path, bool with_optimizer = false) {
    std::string message;
    try {
      TrainingState st;
      load_checkpoint(path, *model_, with_optimizer ? opt_.get() : nullptr, &st);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_TRUE(same_state(*model_, before_)) << "model modified by a failed load of " << path;
    EXPECT_EQ(opt_->param_groups()[0].lr, 0.3);
    EXPECT_NE(message.find("load_checkpoint: " + path + ": "), std::string::npos) << message;
    return message;
  }

  std::string good_;
  std::unique_ptr<Mlp> model_;
  std::unique_ptr<optim::SGD> opt_;
  std::vector<Tensor> before_;
};

TEST_F(CorruptFileTest, MissingFile) {
  EXPECT_NE(load_error(temp_path("does_not_exist.safetensors")).find("cannot open"), std::string::npos);
}

TEST_F(CorruptFileTest, ReadingTheTrainingStateChecksTheFileAlike) {
  const std::string bytes = read_bytes(good_);
  const std::string p = temp_path("truncated_state.safetensors");
  write_bytes(p, bytes.substr(0, bytes.size() - 3));
  try {
    read_training_state(p);
    ADD_FAILURE() << "read_training_state accepted a truncated file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": entry "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lie outside the"), std::string::npos) << e.what();
  }
}

TEST_F(CorruptFileTest, TruncatedFiles) {
  const std::string bytes = read_bytes(good_);
  const std::string p = temp_path("truncated.safetensors");
  write_bytes(p, bytes.substr(0, 5));
  EXPECT_NE(load_error(p).find("truncated: 5 bytes"), std::string::npos);
  write_bytes(p, bytes.substr(0, 40));
  EXPECT_NE(load_error(p).find("truncated or bad header length"), std::string::npos);
  write_bytes(p, bytes.substr(0, bytes.size() - 3));  // cut inside the last tensor's data
  EXPECT_NE(load_error(p).find("lie outside the"), std::string::npos);
}

// Regression: a checkpoint of another format version was loaded as if it were version 1.
TEST_F(CorruptFileTest, AnotherFormatVersion) {
  std::string bytes = read_bytes(good_);
  const size_t key = bytes.find("\"dpe.checkpoint_version\"");
  ASSERT_NE(key, std::string::npos);
  const size_t value = bytes.find("\"1\"", key + 24);
  ASSERT_NE(value, std::string::npos);
  bytes[value + 1] = '9';  // same length: the header stays valid safetensors
  const std::string p = temp_path("version9.safetensors");
  write_bytes(p, bytes);
  EXPECT_NE(load_error(p).find("'dpe.checkpoint_version' = '9'; this dpe reads version 1"), std::string::npos);
}

TEST_F(CorruptFileTest, BadHeaderLength) {
  const std::string p = temp_path("badlen.safetensors");
  write_raw(p, "{}", "", uint64_t(1) << 60);
  EXPECT_NE(load_error(p).find("bad header length"), std::string::npos);
}

TEST_F(CorruptFileTest, MalformedJson) {
  const std::string p = temp_path("badjson.safetensors");
  write_raw(p, R"({"fc1.weight": {"dtype": "F32", )", "");
  EXPECT_NE(load_error(p).find("malformed JSON header"), std::string::npos);
  write_raw(p, "[1, 2]", "");
  EXPECT_NE(load_error(p).find("not an object"), std::string::npos);
}

TEST_F(CorruptFileTest, OffsetsOutsideTheFileOrWrongSize) {
  const std::string p = temp_path("offsets.safetensors");
  write_raw(p, R"({"fc1.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}})", std::string(20, 'x'));
  EXPECT_NE(load_error(p).find("data_offsets [0, 48] lie outside the 20-byte data section"), std::string::npos);
  write_raw(p, R"({"fc1.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}})", std::string(48, 'x'));
  EXPECT_NE(load_error(p).find("cover 40 bytes but F32 [3, 4] needs 48"), std::string::npos);
  write_raw(p, R"({"w": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}})", "x");
  EXPECT_NE(load_error(p).find("unsupported dtype Q8"), std::string::npos);
}

TEST_F(CorruptFileTest, DtypeShapeAndKeyMismatches) {
  const std::string p = temp_path("mismatch.safetensors");
  Mlp f64(DType::Float64);
  save_checkpoint(p, f64, nullptr);
  EXPECT_NE(load_error(p).find("fc1.weight (file float64 [3, 4], model float32 [3, 4])"), std::string::npos);

  class Wide : public nn::Cloneable<Wide> {
   public:
    Wide() : Cloneable("Wide") { reset(); }
    void reset() override {
      fc1 = register_module("fc1", std::make_shared<nn::Linear>(5, 3));
      fc2 = register_module("fc2", std::make_shared<nn::Linear>(3, 2));
      extra = register_parameter("extra", zeros({1}));
    }
    std::shared_ptr<nn::Linear> fc1, fc2;
    Tensor extra;
  };
  Wide wide;
  save_checkpoint(p, wide, nullptr);
  const std::string e = load_error(p);
  EXPECT_NE(e.find("unexpected keys: extra"), std::string::npos) << e;
  EXPECT_NE(e.find("fc1.weight (file float32 [3, 5], model float32 [3, 4])"), std::string::npos) << e;

  nn::Linear lone(4, 3);
  save_checkpoint(p, lone, nullptr);  // "weight", "bias": every Mlp key missing
  EXPECT_NE(load_error(p).find("missing keys: fc1.weight, fc1.bias, fc2.weight, fc2.bias"), std::string::npos);
}

TEST_F(CorruptFileTest, OptimizerMismatches) {
  // No optimizer state in the file, but an optimizer given.
  EXPECT_NE(load_error(good_, /*with_optimizer=*/true).find("holds no optimizer state"), std::string::npos);
  // Adam state into SGD.
  const std::string p = temp_path("adam.safetensors");
  Mlp source(DType::Float32);
  optim::Adam adam(source.parameters(), {.lr = 0.1});
  save_checkpoint(p, source, &adam);
  EXPECT_NE(load_error(p, true).find("belongs to a Adam optimizer, not SGD"), std::string::npos);
}

// A copy of the checkpoint `src` with __metadata__[key] = value (the data unchanged).
void rewrite_metadata(const std::string& src, const std::string& dst,
                      const std::map<std::string, std::string>& changes) {
  const std::string bytes = read_bytes(src);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  safetensors::Json header = safetensors::parse_header(std::string_view(bytes).substr(8, n));
  for (const auto& [key, value] : changes) header["__metadata__"][key] = value;
  std::string text = safetensors::dump_header(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  write_raw(dst, text, bytes.substr(8 + n));
}

// Regression: a checkpoint's NaN or negative hyper-parameters loaded without a
// word and failed at the first training step, without naming the file. They are refused when the file is
// loaded, naming the file, the key, the value and what was expected; nothing is modified.
TEST_F(CorruptFileTest, OptimizerHyperParametersAreCheckedWhenLoaded) {
  const std::string src = temp_path("sgd_state.safetensors");
  Mlp source(DType::Float32);
  optim::SGD sgd(source.parameters(), {.lr = 0.1, .momentum = 0.9});
  save_checkpoint(src, source, &sgd);
  {
    Mlp m(DType::Float32);
    optim::SGD o(m.parameters(), {.lr = 0.3, .momentum = 0.5});
    ASSERT_EQ(error_of([&] { load_checkpoint(src, m, &o); }), "(no error)");  // the unchanged file loads
  }
  const std::string p = temp_path("sgd_bad.safetensors");
  const std::string g = "__metadata__ 'optimizer.param_groups.0.";
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"optimizer.param_groups.0.lr", "nan"}},
       g + "lr' = 'nan' is not a valid SGD learning rate: expected a finite number >= 0"},
      {{{"optimizer.param_groups.0.lr", "-0.5"}},
       g + "lr' = '-0.5' is not a valid SGD learning rate: expected a finite number >= 0"},
      {{{"optimizer.param_groups.0.lr", "inf"}}, g + "lr' = 'inf' is not a valid SGD learning rate"},
      {{{"optimizer.param_groups.0.momentum", "-0.9"}},
       g + "momentum' = '-0.9' is not a valid SGD momentum: expected a finite number >= 0"},
      {{{"optimizer.param_groups.0.weight_decay", "NaN"}}, g + "weight_decay' = 'NaN' is not a valid SGD weight_decay"},
      {{{"optimizer.param_groups.0.dampening", "-inf"}},
       g + "dampening' = '-inf' is not a valid SGD dampening: expected a finite number"},
      {{{"optimizer.param_groups.0.nesterov", "2"}},
       g + "nesterov' = '2' is not a valid SGD nesterov: expected 0 or 1"},
      {{{"optimizer.param_groups.0.nesterov", "1"}, {"optimizer.param_groups.0.dampening", "0.5"}},
       "__metadata__ 'optimizer.param_groups.0.*' is not a valid SGD param group: nesterov requires momentum > 0 "
       "and dampening 0, got momentum 0.9 and dampening 0.5"},
  };
  for (const auto& [changes, expected] : cases) {
    rewrite_metadata(src, p, changes);
    const std::string e = load_error(p, /*with_optimizer=*/true);
    EXPECT_NE(e.find("load_checkpoint: " + p + ": " + expected), std::string::npos) << e;
  }

  // Adam: betas in [0, 1), eps >= 0, and the per-parameter step a whole number.
  Batch b = make_batch();
  const std::string adam_src = temp_path("adam_state.safetensors");
  Mlp source64(DType::Float64);
  optim::Adam adam(source64.parameters(), {.lr = 0.01});
  train_step(source64, adam, b.x, b.y);
  save_checkpoint(adam_src, source64, &adam);
  Mlp target(DType::Float64);
  optim::Adam target_adam(target.parameters(), {.lr = 0.5});
  const std::vector<Tensor> target_before = snapshot(target);
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> adam_cases = {
      {{{"optimizer.param_groups.0.beta1", "1"}},
       g + "beta1' = '1' is not a valid Adam beta1: expected a number in [0, 1)"},
      {{{"optimizer.param_groups.0.beta2", "nan"}}, g + "beta2' = 'nan' is not a valid Adam beta2"},
      {{{"optimizer.param_groups.0.eps", "-1e-8"}},
       g + "eps' = '-1e-8' is not a valid Adam eps: expected a finite number >= 0"},
      {{{"optimizer.state.0.step", "nan"}},
       "__metadata__ 'optimizer.state.0.step' = 'nan' is not a valid Adam state scalar 'step': expected a whole "
       "number in [0, 2^53]"},
      {{{"optimizer.state.1.step", "-1"}},
       "__metadata__ 'optimizer.state.1.step' = '-1' is not a valid Adam state scalar"},
      {{{"optimizer.state.2.step", "1.5"}},
       "__metadata__ 'optimizer.state.2.step' = '1.5' is not a valid Adam state scalar"},
  };
  for (const auto& [changes, expected] : adam_cases) {
    rewrite_metadata(adam_src, p, changes);
    const std::string e = error_of([&] { load_checkpoint(p, target, &target_adam); });
    EXPECT_NE(e.find("load_checkpoint: " + p + ": " + expected), std::string::npos) << e;
    EXPECT_EQ(target_adam.param_groups()[0].lr, 0.5);
    EXPECT_TRUE(target_adam.state_dict().scalars.empty());
    EXPECT_TRUE(same_state(target, target_before));
  }
  EXPECT_EQ(error_of([&] { load_checkpoint(adam_src, target, &target_adam); }), "(no error)");
}

// A loss scaler's state in the training state is checked when the checkpoint is loaded, naming the file.
TEST_F(CorruptFileTest, GradScalerStateIsCheckedWhenLoaded) {
  const std::string src = temp_path("scaler_state.safetensors");
  Mlp source(DType::Float32);
  save_checkpoint(src, source, nullptr,
                  {.grad_scaler = {{"scale", 65536.0},
                                   {"growth_factor", 2.0},
                                   {"backoff_factor", 0.5},
                                   {"growth_interval", 2000},
                                   {"growth_tracker", 3}}});
  {
    Mlp m(DType::Float32);
    TrainingState st;
    ASSERT_EQ(error_of([&] { load_checkpoint(src, m, nullptr, &st); }), "(no error)");
    EXPECT_EQ(st.grad_scaler.at("growth_tracker"), 3);
  }
  const std::string p = temp_path("scaler_bad.safetensors");
  rewrite_metadata(src, p, {{"training.grad_scaler.scale", "nan"}});
  std::string e = load_error(p);
  EXPECT_NE(e.find(p + ": __metadata__ 'training.grad_scaler.*' is not a valid loss scaler state: "
                       "GradScaler::load_state_dict: scale must be finite and > 0 as a float32, got nan"),
            std::string::npos)
      << e;
  rewrite_metadata(src, p, {{"training.grad_scaler.growth_tracker", "1e300"}});
  e = load_error(p);
  EXPECT_NE(e.find("growth_tracker 1e+300 is above 2^53"), std::string::npos) << e;
}

// Regression: two tensors sharing bytes (aliased or overlapping data_offsets)
// were accepted. Refused when the header is read, naming both tensors and their ranges.
TEST_F(CorruptFileTest, AliasedOrOverlappingDataOffsets) {
  const std::string p = temp_path("overlap.safetensors");
  write_raw(p,
            R"({"fc1.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},)"
            R"( "fc1.bias": {"dtype": "F32", "shape": [3], "data_offsets": [40, 52]}})",
            std::string(52, 'x'));
  std::string e = load_error(p);
  EXPECT_NE(e.find(p + ": entries 'fc1.weight' (data_offsets [0, 48]) and 'fc1.bias' (data_offsets [40, 52]) "
                       "overlap in bytes [40, 48) of the data section"),
            std::string::npos)
      << e;
  write_raw(p,
            R"({"fc2.bias": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},)"
            R"( "fc1.bias": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]}})",
            std::string(16, 'x'));
  e = load_error(p);
  EXPECT_NE(e.find("entries 'fc1.bias' (data_offsets [8, 16]) and 'fc2.bias' (data_offsets [8, 16]) are the "
                   "same bytes"),
            std::string::npos)
      << e;
}

// Headers that claim more than the file holds fail before anything that large is allocated, naming the sizes.
TEST_F(CorruptFileTest, HeaderClaimingHugeTensors) {
  const std::string p = temp_path("huge.safetensors");
  // numel * element size wraps to 0 bytes (2^62 * 8 = 2^65): once accepted with an empty byte range, and the
  // tensor then claimed 2^62 elements without storage.
  write_raw(p, R"({"fc1.weight": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", "");
  std::string e = load_error(p);
  EXPECT_NE(e.find("entry 'fc1.weight': shape is too large: F64 [4611686018427387904] needs more than 2^63 bytes"),
            std::string::npos)
      << e;
  // numel itself wraps: 2^32 * 2^32 * 2^32.
  write_raw(p, R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 0]}})", "");
  EXPECT_NE(load_error(p).find("shape is too large"), std::string::npos);
  // 2^40 bytes claimed, 16 present.
  write_raw(p, R"({"fc1.weight": {"dtype": "F32", "shape": [262144, 1048576], "data_offsets": [0, 1099511627776]}})",
            std::string(16, 'x'));
  e = load_error(p);
  EXPECT_NE(e.find("data_offsets [0, 1099511627776] lie outside the 16-byte data section"), std::string::npos) << e;
  // A header length of 50 MB in a 40-byte file, and one of 2^40.
  write_raw(p, "{}", std::string(30, ' '), uint64_t{50} << 20);
  e = load_error(p);
  EXPECT_NE(e.find("the header claims 52428800 bytes but only 32 follow the length field"), std::string::npos) << e;
  write_raw(p, "{}", "", uint64_t{1} << 40);
  EXPECT_NE(load_error(p).find("bad header length 1099511627776"), std::string::npos);
  // A shape with a zero is empty, however large its other sizes (safetensors allows it); the model rejects it.
  write_raw(p, R"({"fc1.weight": {"dtype": "F32", "shape": [0, 9223372036854775807], "data_offsets": [0, 0]}})", "");
  e = load_error(p);
  EXPECT_NE(e.find("fc1.weight (file float32 [0, 9223372036854775807], model float32 [3, 4])"), std::string::npos)
      << e;
}

// Paths that are not regular files say what they are (a directory once read as "truncated: 0 bytes"), and a
// FIFO is refused without waiting for a writer.
TEST_F(CorruptFileTest, PathsThatAreNotCheckpointFiles) {
  const std::string dir = temp_path("a_directory");
  fs::create_directories(dir);
  std::string e = load_error(dir);
  EXPECT_NE(e.find(dir + ": is a directory, not a checkpoint file"), std::string::npos) << e;
  const std::string fifo = temp_path("a_fifo");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  e = load_error(fifo);
  EXPECT_NE(e.find("is a FIFO (named pipe), not a checkpoint file"), std::string::npos) << e;
  e = load_error("/dev/null");
  EXPECT_NE(e.find("/dev/null: is a character device, not a checkpoint file"), std::string::npos) << e;
  e = load_error("/dev/zero");
  EXPECT_NE(e.find("is a character device"), std::string::npos) << e;
  e = load_error(temp_path("missing.safetensors"));
  EXPECT_NE(e.find("cannot open the file (No such file or directory)"), std::string::npos) << e;
  e = load_error(good_ + "/inside");
  EXPECT_NE(e.find("cannot open the file (Not a directory)"), std::string::npos) << e;
  e = load_error("");
  EXPECT_NE(e.find("cannot open the file (No such file or directory)"), std::string::npos) << e;
  // Unreadable: only observable when not root (root reads any file).
  if (::geteuid() != 0) {
    const std::string locked = temp_path("locked.safetensors");
    fs::copy_file(good_, locked, fs::copy_options::overwrite_existing);
    fs::permissions(locked, fs::perms::none);
    e = load_error(locked);
    EXPECT_NE(e.find("cannot open the file (Permission denied)"), std::string::npos) << e;
  }
}

// load reads the header and the tensors' ranges, never the whole file: bytes after the last tensor (here a
// sparse 64 GiB tail, which takes no disk) are never read, so the load is immediate and small.
TEST(CheckpointTest, LoadReadsOnlyTheHeaderAndTheTensorRanges) {
  Mlp source(DType::Float32);
  const std::string path = temp_path("sparse_tail.safetensors");
  save_checkpoint(path, source, nullptr);
  ASSERT_EQ(::truncate(path.c_str(), off_t{64} << 30), 0) << std::strerror(errno);
  Mlp target(DType::Float32);
  const auto start = std::chrono::steady_clock::now();
  load_checkpoint(path, target);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  const nn::StateDict a = source.state_dict(), b = target.state_dict();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(equal(a[i].second, b[i].second)) << a[i].first;
  fs::remove(path);
}

// Two writers saving different models to one path over and over (a shared default checkpoint name): with a
// shared `path.tmp` they truncated and interleaved each other's bytes. Every load during the race and the
// final file must be exactly one of the two models, with its own metadata.
TEST(CheckpointTest, ConcurrentWritersOfOnePathNeverTearTheFile) {
  const std::string path = temp_path("contended.safetensors");
  manual_seed(11);
  Mlp a(DType::Float32, true), b(DType::Float32, true);
  const std::vector<Tensor> snap_a = snapshot(a), snap_b = snapshot(b);
  ASSERT_FALSE(same_state(a, snap_b));
  // Different metadata lengths shift the data offsets, so a mix of the two files cannot parse by luck.
  // The generator entry names a device this process lacks: loads then restore no generator, and the
  // writers do not capture the generators the reader would be restoring (no data race on them).
  const std::vector<GeneratorState> rng = {{"cpu:9999", 1, 2}};
  const TrainingState state_a{.epoch = 1, .step = 0, .rng = rng, .metadata = {{"who", "a"}}};
  const TrainingState state_b{.epoch = 2, .step = 0, .rng = rng, .metadata = {{"who", std::string(3000, 'b')}}};
  save_checkpoint(path, a, nullptr, state_a);

  constexpr int kSaves = 60;
  std::atomic<bool> writing{true};
  std::atomic<int> torn{0}, loads{0};
  std::string first_problem;
  std::mutex problem_mutex;
  auto check_file = [&](Mlp& into) {
    TrainingState st;
    try {
      load_checkpoint(path, into, nullptr, &st);
    } catch (const Error& e) {
      std::lock_guard lock(problem_mutex);
      if (torn++ == 0) first_problem = e.what();
      return;
    }
    const bool is_a = st.epoch == 1 && st.metadata == state_a.metadata && same_state(into, snap_a);
    const bool is_b = st.epoch == 2 && st.metadata == state_b.metadata && same_state(into, snap_b);
    if (!is_a && !is_b) {
      std::lock_guard lock(problem_mutex);
      if (torn++ == 0) first_problem = "a file that is neither model";
    }
    ++loads;
  };
  auto writer = [&](const Mlp& model, const TrainingState& state) {
    for (int i = 0; i < kSaves; ++i) {
      try {
        save_checkpoint(path, model, nullptr, state);
      } catch (const Error& e) {  // e.g. a rename of a temporary that the other writer already renamed
        std::lock_guard lock(problem_mutex);
        if (torn++ == 0) first_problem = e.what();
      }
    }
  };
  std::thread writer_a(writer, std::cref(a), std::cref(state_a));
  std::thread writer_b(writer, std::cref(b), std::cref(state_b));
  std::thread reader([&] {
    Mlp into(DType::Float32, true);
    while (writing) check_file(into);
  });
  writer_a.join();
  writer_b.join();
  writing = false;
  reader.join();
  Mlp final_model(DType::Float32, true);
  check_file(final_model);
  EXPECT_EQ(torn.load(), 0) << torn.load() << " failed saves or bad loads; the first: " << first_problem;
  EXPECT_GT(loads.load(), 0);
  EXPECT_TRUE(temporaries_of(path).empty());
}

// A save that fails while writing leaves the previous checkpoint as it was and no temporary behind. The
// failure is real: a file size limit (RLIMIT_FSIZE, which binds root too) makes write() fail with EFBIG.
TEST(CheckpointTest, FailedSaveKeepsTheOldFileAndLeavesNoTemporary) {
  const std::string path = temp_path("kept.safetensors");
  manual_seed(3);
  Mlp small(DType::Float32);
  save_checkpoint(path, small, nullptr, {.epoch = 1});
  const std::string before = read_bytes(path);
  ASSERT_LT(before.size(), 4096u);

  // A model whose file is larger than the limit.
  class Big : public nn::Cloneable<Big> {
   public:
    Big() : Cloneable("Big") { reset(); }
    void reset() override { w = register_parameter("w", zeros({64, 64})); }
    Tensor w;
  };
  Big big;
  rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = 4096;
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // otherwise the write past the limit kills the process
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string message;
  try {
    save_checkpoint(path, big, nullptr, {.epoch = 2});
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("save_checkpoint: writing " + path + ".tmp."), std::string::npos) << message;
  EXPECT_NE(message.find("failed: File too large"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(temporaries_of(path).empty());
  TrainingState st;
  Mlp reloaded(DType::Float32);
  load_checkpoint(path, reloaded, nullptr, &st);
  EXPECT_EQ(st.epoch, 1);

  // The target is a directory: refused before anything is written.
  const std::string dir = temp_path("dir_target.safetensors");
  fs::create_directories(dir);
  try {
    save_checkpoint(dir, small, nullptr);
    ADD_FAILURE() << "saved over a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + " is a directory; expected a file path"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(temporaries_of(dir).empty());
}

// A model of one float32 parameter of `numel` elements: a checkpoint of about 4 * numel bytes.
class Flat : public nn::Cloneable<Flat> {
 public:
  explicit Flat(int64_t numel) : Cloneable("Flat"), numel_(numel) { reset(); }
  void reset() override { w = register_parameter("w", zeros({numel_})); }
  Tensor w;

 private:
  int64_t numel_;
};

// Regression: SIGINT or SIGTERM during a save left a full-size
// `<path>.tmp.XXXXXX` every time. A child saves a large checkpoint; the parent signals it as soon as the
// temporary appears. The child must die of that signal (the status a shell or scheduler expects) and leave no
// temporary. When the save won the race (the checkpoint exists: the signal came after the rename), the round
// proves nothing and is repeated with a larger model.
TEST(CheckpointTest, ASignalDuringASaveRemovesTheTemporaryAndEndsTheProcess) {
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string path = temp_path("signalled_" + std::to_string(sig) + ".safetensors");
    bool interrupted = false;
    for (int64_t numel = int64_t{1} << 24; !interrupted && numel <= (int64_t{1} << 27); numel *= 2) {
      fs::remove(path);
      ASSERT_TRUE(temporaries_of(path).empty());
      const Flat model(numel);  // built here: the child only saves (no thread pools across fork)
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0) << std::strerror(errno);
      if (pid == 0) {
        try {
          save_checkpoint(path, model, nullptr);
        } catch (...) {
          ::_exit(3);
        }
        ::_exit(0);
      }
      int status = 0;
      pid_t done = 0;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (temporaries_of(path).empty() && (done = ::waitpid(pid, &status, WNOHANG)) == 0 &&
             std::chrono::steady_clock::now() < deadline) {
        ::usleep(100);
      }
      if (done == 0) {
        ::kill(pid, sig);
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      }
      if (fs::exists(path)) continue;  // the save finished before the signal: again, larger
      interrupted = true;
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig)
          << strsignal(sig) << " during a save of " << 4 * numel << " bytes: " << describe_wait_status(status);
      EXPECT_TRUE(temporaries_of(path).empty())
          << strsignal(sig) << " during a save left " << temporaries_of(path).front();
    }
    EXPECT_TRUE(interrupted) << "every save of " << path << " finished before " << strsignal(sig) << " arrived";
    for (const std::string& name : temporaries_of(path)) fs::remove(fs::path(path).parent_path() / name);
    fs::remove(path);
  }
}

// Regression: under `ulimit -f` below the checkpoint's size the run died of
// SIGXFSZ without a word and left the temporary. A child with RLIMIT_FSIZE below the size (and SIGXFSZ at its
// default disposition, as in a shell) must get a dpe::Error naming the file, the sizes and `ulimit -f`,
// exit normally, leave no temporary and keep the old checkpoint intact.
TEST(CheckpointTest, AFileSizeLimitIsAnErrorNamingItNotSigxfsz) {
  const std::string path = temp_path("fsize_limited.safetensors");
  Mlp small(DType::Float32);
  save_checkpoint(path, small, nullptr, {.epoch = 1});
  const std::string before = read_bytes(path);
  const Flat big(64 * 1024);  // 256 KiB of data
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    ::signal(SIGXFSZ, SIG_DFL);
    rlimit limit;
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 64 * 1024;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    std::string message = "(no error)";
    try {
      save_checkpoint(path, big, nullptr, {.epoch = 2});
    } catch (const Error& e) {
      message = e.what();
    }
    if (::write(pipe_fds[1], message.data(), message.size()) != static_cast<ssize_t>(message.size())) ::_exit(11);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buf[4096];
  for (ssize_t r; (r = ::read(pipe_fds[0], buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    ASSERT_GT(r, 0) << std::strerror(errno);
    message.append(buf, static_cast<size_t>(r));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_wait_status(status);
  EXPECT_NE(message.find("save_checkpoint: writing " + path + ".tmp."), std::string::npos) << message;
  EXPECT_NE(message.find("File too large: the checkpoint is "), std::string::npos) << message;
  EXPECT_NE(message.find("bytes but the file size limit (`ulimit -f`, RLIMIT_FSIZE) is 65536 bytes"),
            std::string::npos)
      << message;
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(temporaries_of(path).empty());
}

// Temporaries of killed runs (the old fixed name and the new random ones) are never read nor removed.
TEST(CheckpointTest, StaleTemporariesAreIgnored) {
  const std::string path = temp_path("stale.safetensors");
  write_bytes(path + ".tmp", "garbage from an old run");
  write_bytes(path + ".tmp.AbC123", "garbage from a killed run");
  Mlp model(DType::Float32);
  save_checkpoint(path, model, nullptr, {.epoch = 5});
  TrainingState st;
  Mlp reloaded(DType::Float32);
  load_checkpoint(path, reloaded, nullptr, &st);
  EXPECT_EQ(st.epoch, 5);
  EXPECT_EQ(read_bytes(path + ".tmp"), "garbage from an old run");
  EXPECT_EQ(read_bytes(path + ".tmp.AbC123"), "garbage from a killed run");
  EXPECT_EQ(temporaries_of(path).size(), 2u);
}

TEST(CheckpointTest, SaveOverwritesAtomicallyAndReportsBadPaths) {
  Mlp model(DType::Float32);
  const std::string path = temp_path("overwrite.safetensors");
  save_checkpoint(path, model, nullptr, {.epoch = 1});
  save_checkpoint(path, model, nullptr, {.epoch = 2});
  TrainingState st;
  load_checkpoint(path, model, nullptr, &st);
  EXPECT_EQ(st.epoch, 2);
  EXPECT_TRUE(temporaries_of(path).empty());
  try {
    save_checkpoint(temp_path("no/such/dir/x.safetensors"), model, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
  }
}

TEST(CheckpointTest, ReadsAFileWrittenByPython) {
  // io/testdata/torch_mlp.safetensors and its values: tests/golden/gen_checkpoint.py.
  testing::Golden g = testing::load_golden("checkpoint_torch");
  Mlp model(DType::Float32);
  load_checkpoint("io/testdata/torch_mlp.safetensors", model);
  EXPECT_TRUE(equal(model.fc1->weight, g.tensor("fc1_weight")));
  EXPECT_TRUE(equal(model.fc1->bias, g.tensor("fc1_bias")));
  EXPECT_TRUE(equal(model.fc2->weight, g.tensor("fc2_weight")));
  EXPECT_TRUE(equal(model.fc2->bias, g.tensor("fc2_bias")));
}

}  // namespace
}  // namespace dpe::io
