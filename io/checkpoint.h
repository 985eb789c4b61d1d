// Checkpoints: model parameters and buffers, optimizer state, epoch/step, RNG state and user metadata in one
// safetensors file (docs/LAYERS.md, "Losses, optimizers, checkpoints").
//
//   io::save_checkpoint("run/ckpt.safetensors", *model, &opt, {.epoch = 3, .step = 1200});
//   io::TrainingState st;
//   io::load_checkpoint("run/ckpt.safetensors", *model, &opt, &st);   // resumes the same trajectory
//
// Format: safetensors (an 8-byte little-endian header length N, N bytes of JSON header
// {"<name>": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the
// raw little-endian data; the header is padded with spaces so the data starts 8-byte aligned). Model tensors
// carry their state_dict names without a "module." prefix, so the file loads into an unwrapped model and
// into other safetensors readers. Optimizer state tensors are "optimizer.state.<index>.<name>"; everything
// that is not a tensor is a string in __metadata__:
//   format = "pt", dpe.checkpoint_version = "1", training.epoch, training.step,
//   training.rng.<device> = "<seed>,<offset>", training.grad_scaler.<key> = <double>, user.<key> = <value>,
//   optimizer.type, optimizer.param_groups = <count>, optimizer.param_groups.<g>.{lr, params, <option>},
//   optimizer.state.<index>.<scalar> (e.g. Adam's step)
// Doubles are written with 17 significant digits, so they read back bit-identical.
//
// Atomicity: save writes a temporary of its own, `<path>.tmp.XXXXXX` in the same directory (created with
// O_EXCL, so concurrent writers of one path never share one), fsyncs it, renames it over `path` and fsyncs the
// directory: a crash leaves either the old file or the new one, never a torn one, and of two concurrent saves
// one complete file wins. On any failure the temporary is removed and `path` is left as it was, a write past
// the file size limit included (SIGXFSZ is ignored while saving: the error names the limit, `ulimit -f`); a
// SIGINT, SIGTERM or SIGHUP that ends the process during the save removes the temporary first and the process
// still ends by that signal (io/temp_file.h, Note [Temporaries and fatal signals]). Temporaries of runs killed
// otherwise (SIGKILL, a crash) are removed by the next save of the same path once their writer's lock is gone
// (io/atomic_file.h).
// Validation: load opens `path` (refusing a directory, FIFO or device by name), reads the 8-byte length and
// the header, checks them against the file's actual size (header length, JSON, dtypes, shapes with checked
// arithmetic, offsets inside the data, a dpe.checkpoint_version other than 1), then reads each tensor's byte range into a new tensor, and checks
// keys and shapes against the model and the optimizer structure, all before it modifies anything: memory
// never exceeds the header plus the tensors, whatever the header claims. Any problem throws dpe::Error
// "load_checkpoint: <path>: <problem>" with the model, optimizer, state and RNG untouched.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "layers/module.h"
#include "optim/optimizer.h"

namespace dpe::io {

// The state of one default generator (core/ops.h).
struct GeneratorState {
  std::string device;  // "cpu:0", "cuda:1"
  uint64_t seed = 0;
  uint64_t offset = 0;
};

struct TrainingState {
  int64_t epoch = 0;
  int64_t step = 0;
  // save_checkpoint: empty means "the default generators' current state" (the usual case); load_checkpoint
  // fills it from the file.
  std::vector<GeneratorState> rng = {};
  std::map<std::string, std::string> metadata = {};  // the user's own strings
  // A GradScaler's state_dict() (optim/grad_scaler.h; empty: none), as "training.grad_scaler.<key>": the loss
  // scale and its growth tracker resume exactly. Values are checked by GradScaler::load_state_dict.
  std::map<std::string, double> grad_scaler = {};
};

// The current state of every default generator (every CPU and CUDA device this process has).
std::vector<GeneratorState> capture_rng_state();
// Sets the default generators of the listed devices; devices this process does not have are skipped.
void restore_rng_state(const std::vector<GeneratorState>& rng);

// Writes the checkpoint atomically (see the file comment). optimizer may be null.
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const TrainingState& state = {});

// Loads a checkpoint into `model` (strict: the file must hold exactly the model's parameters and buffers,
// same shapes and dtypes; optimizer entries are not model keys), into `optimizer` when non-null (the file
// must then hold optimizer state of the same type and structure), and, when `state` is non-null, into *state
// and the default generators (restore_rng_state). Validates everything first (see the file comment).
void load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer = nullptr,
                     TrainingState* state = nullptr);

// The checkpoint's training state (epoch, step, generators, metadata, loss scaler), after the same checks of the
// file's structure and of those values as load_checkpoint; reads the header only, sets no generator. For what
// must be checked before anything is built (a resumed run's configuration).
TrainingState read_training_state(const std::string& path);

}  // namespace dpe::io
