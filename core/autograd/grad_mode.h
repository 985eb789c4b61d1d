// Grad mode: whether operations record a graph. Per thread, so that one worker thread's eval forward
// does not switch off recording on another.
#pragma once

namespace dpe {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Disables graph recording for its scope (PyTorch's torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace dpe
