// Execution order on a device.
//
// CPU devices run every op synchronously on the calling thread: an op is complete when it returns, so
// program order on a thread is the CPU device's "stream". CUDA devices run ops asynchronously, in order,
// on the logical device's single compute stream (core/cuda/cuda_device.h). Events order work between
// devices without blocking the host, and time it.
#pragma once

#include <memory>

#include "core/device.h"

namespace dpe {

// Blocks until all work enqueued on d has finished (no-op on CPU).
void synchronize(const Device& d);

class Event {
 public:
  Event();
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;

  // Marks the point in d's stream reached by work enqueued so far.
  void record(const Device& d);
  // Work enqueued on d after this call runs after the recorded point (host does not block).
  void block(const Device& d) const;
  // Blocks the host until the recorded point is reached.
  void synchronize() const;
  // Milliseconds between this event and `later` (both recorded, on the same kind of device).
  double elapsed_ms(const Event& later) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpe
