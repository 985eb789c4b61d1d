// One backward pass's node timings (core/autograd/profiler.h), kept by backward() on its own thread and
// merged into the process's table when the pass ends. Internal to core/autograd.
#pragma once

#include <string>
#include <vector>

#include "core/autograd/node.h"
#include "core/device.h"
#include "core/stream.h"
#include "core/tensor.h"

namespace dpe::autograd {

class PassProfile {
 public:
  // Around node.apply(grad_outputs): timed on the device of the first defined gradient (untimed if none, or
  // if the node runs nested backward passes, whose nodes are timed instead).
  void start(const Node& node, const std::vector<Tensor>& grad_outputs);
  void stop();
  // Waits for the pass's last recorded events and adds its times to the table. Call once, after the pass.
  void finish();

 private:
  struct Timing {
    std::string name;
    Device device;
    Event start, stop;
  };
  std::vector<Timing> timings_;
  bool open_ = false;
};

}  // namespace dpe::autograd
