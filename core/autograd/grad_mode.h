// Grad mode: whether operations record a graph. Per thread, so that one worker thread's eval forward
// does not switch off recording on another.
#pragma once

namespace dpe {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Sets grad mode for its scope and restores the previous one (PyTorch's c10::AutoGradMode); on, e.g., where a
// backward function records a graph again (layers/checkpoint.h).
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// Disables graph recording for its scope (PyTorch's torch::NoGradGuard).
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

}  // namespace dpe
