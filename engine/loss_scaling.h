// Dynamic loss scaling in the step API (DataParallel::set_grad_scaler): how a step's optimizers step through
// a GradScaler.
//
// Note [One skip decision]
// A step with an inf or NaN gradient is skipped, and in DDP mode every replica owns an optimizer, so every
// replica must skip, or none: a replica that steps alone leaves the replicas different for the rest of the
// run, silently. The all-reduce usually leaves identical gradients, hence identical flags, but the engine does
// not rely on that: under no_sync the gradients are each replica's own, and a fault on one device (which is
// what loss scaling exists to catch) may show on that device only. So the decision is taken once:
//  1. each replica unscales its own gradients with the amp kernel (core/kernels/amp.h) and reads its flag;
//  2. one all-reduce of one value (max) over the DDP group, i.e. every replica of every process, gives every
//     replica the combined flag;
//  3. each replica records the combined flag for its optimizer (GradScaler::record_unscaled) and steps by it;
//     an optimizer its user already unscale_'d (to clip) keeps its gradients and contributes its own flag;
//  4. scaler.update() runs once, on the caller's thread, after every replica has finished (Step::optimizer_step).
// DP mode has one optimizer, the master's; across processes its flag is combined over the masters' group the
// same way (every process calls optimizer_step at the same point, as it calls forward_backward).
// The deterministic mode backpropagates each shard's weighted loss times the scale and steps the same way; a
// power-of-two scale is exact, so its results stay the same bits for any device count.
#pragma once

#include <functional>

#include "optim/grad_scaler.h"

namespace dpe {

// Steps `optimizer` through `scaler`: unscales its gradients (unless the caller already did with unscale_,
// e.g. to clip them: then the flag it recorded), combines the found-inf flag over every owner (`combine`, the
// identity for one), records it and steps by it. Returns whether the update was taken.
bool step_through_scaler(optim::GradScaler& scaler, optim::Optimizer& optimizer,
                         const std::function<bool(bool found_inf)>& combine);

}  // namespace dpe
