// Fuzz target: the safetensors checkpoint reader (io::load_checkpoint, io/checkpoint.h) on arbitrary
// file contents. Each input is loaded twice into a fresh model (fuzz/fuzz_model.h): the model alone, then
// model, Adam optimizer and training state (every metadata parser). Rejected files end in dpe::Error; the
// reader promises to leave the model untouched then, which the harness checks.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/ops.h"
#include "io/checkpoint.h"
#include "fuzz/fuzz_model.h"
#include "fuzz/fuzz_target.h"
#include "optim/adam.h"

namespace {

bool same_state(const dpe::nn::Module& m, const dpe::nn::StateDict& before) {
  const dpe::nn::StateDict now = m.state_dict();
  if (now.size() != before.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (!dpe::equal(now[i].second, before[i].second)) return false;
  }
  return true;
}

dpe::nn::StateDict snapshot(const dpe::nn::Module& m) {
  dpe::nn::StateDict out;
  for (const auto& [name, t] : m.state_dict()) out.emplace_back(name, t.detach().clone());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dpe;
  static fuzz::InputFile file("safetensors");
  file.write(data, size);
  default_generator(Device::cpu(0)).manual_seed(0);  // loading restores generators: start each input alike

  {
    fuzz::TinyModel model;
    const nn::StateDict before = snapshot(model);
    bool loaded = false;
    fuzz::expect_only_dpe_errors("model", [&] {
      io::load_checkpoint(file.path(), model);
      loaded = true;
    });
    fuzz::require(loaded || same_state(model, before), "a rejected checkpoint leaves the model untouched");
  }
  {
    fuzz::TinyModel model;
    optim::Adam adam(model.parameters(), {.lr = 0.01});
    io::TrainingState state;
    const nn::StateDict before = snapshot(model);
    bool loaded = false;
    fuzz::expect_only_dpe_errors("all", [&] {
      io::load_checkpoint(file.path(), model, &adam, &state);
      loaded = true;
    });
    fuzz::require(loaded || same_state(model, before), "a rejected checkpoint leaves the model untouched");
  }
  return 0;
}
