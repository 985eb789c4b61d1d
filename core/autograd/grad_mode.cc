#include "core/autograd/grad_mode.h"

namespace dpe {

namespace {
thread_local bool grad_mode_enabled = true;
}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

}  // namespace dpe
