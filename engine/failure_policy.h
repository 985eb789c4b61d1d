// DataParallelOptions::on_device_failure: surviving a replica's failure inside the step API. A failed step
// has run no optimizer, so the parameters are where the step found them (DP: the master's; DDP: every
// replica's, identical); what the failed step changed is undone here (buffers restored, gradients dropped),
// the replica set and the step are rebuilt over what is left, and the same step is redone.
//
// A replica that does not arrive at a collective within the group's timeout is dropped too: the partner that
// timed out reports first (ErrorKind::Timeout), and the step names who it waited for.
// A replica stuck for good (in a kernel, a wait) is declared lost by the worker pool's straggler timeout and
// dropped like a failed one; its thread is left behind with everything it may still reach kept alive
// (ReplicaSet::retire). Not covered (docs/DATA_PARALLEL.md "A failed device"): failures across
// processes; a step onto gradients accumulated by earlier backwards (no_sync, or forward_backward without
// zero_grad), which cannot be redone exactly.
#pragma once

#include <functional>

#include "engine/step.h"

namespace dpe {

// Runs `attempt` (one forward_backward of the step API, report included) under ctx.options.on_device_failure
// and returns its loss: a ReplicaError the policy covers is recovered from (what was done is listed in
// ctx.report.recovered_failures) and the attempt redone; any other is rethrown, its text saying why the
// policy could not recover when it tried. `step` is the engine's step, told of every dropped replica.
double run_surviving_failures(StepContext& ctx, Step& step, const std::function<double()>& attempt);

}  // namespace dpe
