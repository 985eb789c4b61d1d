// The progress line of long work: on a terminal, one line redrawn in place at most 10 times a second
// (bar, loss, samples/s, ETA); otherwise plain lines, one per tenth of the work, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dpe::tool {

// How a progress line shows its rate: per `unit` ("samples", "tokens"), and, when mfu_scale > 0, model FLOPs
// utilisation = units/s x mfu_scale (the model's FLOPs per unit over the devices' peak FLOP/s:
// core/peak_flops.h).
struct ProgressRate {
  std::string unit = "samples";
  double mfu_scale = 0;
};

class Progress {
 public:
  // label: "epoch 3/10"; total: steps in this unit of work.
  Progress(std::string label, int64_t total, ProgressRate rate = {});
  // After step `done` (1-based) of total: the running loss and the units (samples) processed so far.
  void update(int64_t done, double loss, int64_t samples);
  // A line of its own between updates (on a terminal, the progress line is cleared first and redrawn by the
  // next update).
  void note(const std::string& text);
  // Ends the line (terminal) with a final summary.
  void finish(const std::string& summary);

 private:
  std::string line(int64_t done, double loss, int64_t samples) const;

  std::string label_;
  int64_t total_;
  ProgressRate rate_;
  bool terminal_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int64_t last_tenth_ = 0;
};

}  // namespace dpe::tool
