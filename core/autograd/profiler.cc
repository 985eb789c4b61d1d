#include "core/autograd/profiler.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "core/autograd/pass_profile.h"

namespace dpe::autograd {

namespace {

std::atomic<bool> g_enabled{false};
std::mutex g_mutex;
std::map<std::string, NodeTime>* g_table = new std::map<std::string, NodeTime>;  // leaked: usable at exit
int64_t g_passes = 0;

}  // namespace

void enable_backward_profile(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool backward_profile_enabled() { return g_enabled.load(std::memory_order_relaxed); }

std::vector<NodeTime> backward_profile() {
  std::vector<NodeTime> out;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [name, t] : *g_table) out.push_back(t);
  }
  std::stable_sort(out.begin(), out.end(), [](const NodeTime& a, const NodeTime& b) { return a.ms > b.ms; });
  return out;
}

int64_t backward_profile_passes() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_passes;
}

void clear_backward_profile() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_table->clear();
  g_passes = 0;
}

void PassProfile::start(const Node& node, const std::vector<Tensor>& grad_outputs) {
  open_ = false;
  if (node.runs_nested_backward()) return;  // its passes time their own nodes
  for (const Tensor& g : grad_outputs) {
    if (!g.defined()) continue;
    Timing& t = timings_.emplace_back(Timing{node.name(), g.device(), Event(), Event()});
    t.start.record(t.device);
    open_ = true;
    return;
  }
}

void PassProfile::stop() {
  if (!open_) return;
  Timing& t = timings_.back();
  t.stop.record(t.device);
  open_ = false;
}

void PassProfile::finish() {
  std::map<std::string, NodeTime> pass;
  for (const Timing& t : timings_) {
    t.stop.synchronize();
    NodeTime& n = pass[t.name];
    n.name = t.name;
    n.calls += 1;
    n.ms += t.start.elapsed_ms(t.stop);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [name, n] : pass) {
    NodeTime& total = (*g_table)[name];
    total.name = name;
    total.calls += n.calls;
    total.ms += n.ms;
  }
  ++g_passes;
}

}  // namespace dpe::autograd
