#include "tools/dpe/progress.h"

#include <unistd.h>

#include <cstdio>

namespace dpe::tool {

Progress::Progress(std::string label, int64_t total, ProgressRate rate)
    : label_(std::move(label)),
      total_(total),
      rate_(std::move(rate)),
      terminal_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string Progress::line(int64_t done, double loss, int64_t samples) const {
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
  double eta = done > 0 ? seconds / static_cast<double>(done) * static_cast<double>(total_ - done) : 0;
  constexpr int kWidth = 24;
  int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
  char mfu[32] = "";
  if (rate_.mfu_scale > 0) std::snprintf(mfu, sizeof mfu, "  MFU %.1f%%", 100 * rate * rate_.mfu_scale);
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s [%s%s] %lld/%lld loss %.4f  %.0f %s/s%s  ETA %d:%02d", label_.c_str(),
                std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                static_cast<long long>(done), static_cast<long long>(total_), loss, rate, rate_.unit.c_str(), mfu,
                static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  return buf;
}

void Progress::update(int64_t done, double loss, int64_t samples) {
  auto now = std::chrono::steady_clock::now();
  if (terminal_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total_) return;
    last_draw_ = now;
    std::fprintf(stderr, "\r%s\033[K", line(done, loss, samples).c_str());
    return;
  }
  int64_t tenth = total_ > 0 ? done * 10 / total_ : 10;
  if (tenth == last_tenth_) return;
  last_tenth_ = tenth;
  std::fprintf(stderr, "%s\n", line(done, loss, samples).c_str());
}

void Progress::note(const std::string& text) {
  std::fprintf(stderr, "%s%s\n", terminal_ ? "\r\033[K" : "", text.c_str());
}

void Progress::finish(const std::string& summary) {
  if (terminal_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s %s\n", label_.c_str(), summary.c_str());
}

}  // namespace dpe::tool
