// The fuzz driver: main() for every harness (fuzz/*_fuzz.cc), in place of libFuzzer's. GCC has no libFuzzer,
// so this is a deterministic, coverage-free fuzzer (docs/FUZZING.md):
//
//   1. every file of the seed corpus runs once;
//   2. a mutation loop (fixed seed) runs until the time budget or run count is spent: it picks a corpus entry,
//      applies 1-5 stacked mutations (bit flips, byte sets, interesting integers in both byte orders, small
//      arithmetic, inserts, deletes, truncation, copies, splices of two entries, dictionary tokens, decimal
//      numbers replaced by interesting ones) and runs the result. A mutated input that reaches an outcome no
//      input reached before (a rejection by a check not seen yet, fuzz/fuzz_target.h) joins the corpus.
//
// A finding is an exception other than dpe::Error, a crash, a sanitizer report, a timeout, or an RSS over the
// limit (and, under ASan, one allocation over 2 GiB). The input is written to the artifact directory as
// crash-<hash> (and printed in hex when short); the driver exits 1.
//
//   <harness> [options] CORPUS_DIR...   corpus, then mutations
//   <harness> [options] FILE...         reproduce: run just these inputs (e.g. a crash-<hash> file)
//
// Options (--name=value or --name value): --seconds (2), --runs (mutated runs; unlimited), --seed (1),
// --max_len (8192), --timeout (per input, seconds; 10), --rss_limit_mb (2048; 0: off), --dict (a libFuzzer/AFL
// dictionary; repeatable), --artifact_dir (default: $TEST_UNDECLARED_OUTPUTS_DIR, else the directory
// `bazel run` was started in, else .), --save_new DIR (writes inputs that joined the corpus), --keep_going
// (report every distinct finding instead of stopping at the first exception).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fuzz/fuzz_target.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
// One allocation over 2 GiB from an input of a few KB is a size taken from the input unchecked: ASan then
// reports it with the allocating stack (libFuzzer's -malloc_limit_mb). ASAN_OPTIONS still overrides.
extern "C" const char* __asan_default_options() { return "max_allocation_size_mb=2048"; }
#endif

// UBSan findings end in abort(), so that the SIGABRT handler below saves the input: GCC's UBSan runtime is a
// library of its own that does not call ASan's death callback. halt_on_error: misalignment is recoverable
// under --config=asan (.bazelrc), and is a finding all the same.
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1:halt_on_error=1:print_stacktrace=1"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

struct Options {
  double seconds = 2;
  int64_t runs = -1;
  uint64_t seed = 1;
  size_t max_len = 8192;
  double timeout = 10;
  int64_t rss_limit_mb = 2048;
  std::vector<std::string> dicts;
  std::string artifact_dir;
  std::string save_new;
  bool keep_going = false;
  std::vector<std::string> paths;
};

// ---- the current input, readable from the watchdog thread and from crash handlers ----

std::atomic<const uint8_t*> g_data{nullptr};
std::atomic<size_t> g_size{0};
std::atomic<int64_t> g_started_ns{0};  // 0: no input running
std::atomic<bool> g_reported{false};
char g_artifact_dir[4096] = ".";
const char* g_name = "fuzz";
// Under `bazel test` the artifact directory is zipped after the test.
const char* g_outputs_hint = "";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Async-signal-safe output (crash handlers, the sanitizers' death callback).
void say(const char* s) { (void)!::write(2, s, std::strlen(s)); }

void hex64(uint64_t v, char* out) {  // 16 hex digits + NUL
  for (int i = 15; i >= 0; --i, v >>= 4) out[i] = "0123456789abcdef"[v & 15];
  out[16] = '\0';
}

// Writes the current input to <artifact_dir>/<prefix>-<hash> and prints where, plus the bytes in hex when
// there are at most 256. Async-signal-safe; runs once per process.
void save_current_input(const char* prefix) {
  if (g_reported.exchange(true)) return;
  const uint8_t* data = g_data.load();
  const size_t size = g_size.load();
  if (data == nullptr && size != 0) return;
  char hash[17];
  hex64(fnv1a(data, size), hash);
  char path[4200];
  std::snprintf(path, sizeof path, "%s/%s-%s", g_artifact_dir, prefix, hash);  // no allocation in glibc
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  say("\n==fuzz== ");
  say(g_name);
  if (fd >= 0) {
    (void)!::write(fd, data, size);
    ::close(fd);
    say(": the input is saved as ");
    say(path);
    say(g_outputs_hint);
    say("\n");
  } else {
    say(": cannot write the input to ");
    say(path);
    say("\n");
  }
  if (size <= 256) {
    say("==fuzz== input (hex): ");
    char byte[3] = {0, 0, 0};
    for (size_t i = 0; i < size; ++i) {
      byte[0] = "0123456789abcdef"[data[i] >> 4];
      byte[1] = "0123456789abcdef"[data[i] & 15];
      say(byte);
    }
    say("\n");
  }
}

void on_sanitizer_death() { save_current_input("crash"); }

void on_fatal_signal(int sig) {
  save_current_input("crash");
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_crash_handlers() {
#if defined(__SANITIZE_ADDRESS__)
  // ASan (and UBSan with it) print the report, then call this before exiting.
  __sanitizer_set_death_callback(on_sanitizer_death);
  const int signals[] = {SIGABRT};  // ASan handles SEGV, BUS, FPE itself and then dies through the callback
#else
  (void)on_sanitizer_death;
  const int signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#endif
  for (int sig : signals) ::signal(sig, on_fatal_signal);
}

// Per-input timeout and RSS limit, checked ten times a second.
class Watchdog {
 public:
  Watchdog(double timeout_s, int64_t rss_limit_mb) : timeout_ns_(static_cast<int64_t>(timeout_s * 1e9)),
                                                     rss_limit_mb_(rss_limit_mb) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    stop_ = true;
    thread_.join();
  }

 private:
  static int64_t rss_mb() {
    long pages = 0, resident = 0;
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return 0;
    const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
    std::fclose(f);
    return n == 2 ? resident * (::sysconf(_SC_PAGESIZE) / 1024) / 1024 : 0;
  }

  void loop() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t started = g_started_ns.load();
      if (timeout_ns_ > 0 && started != 0 && now_ns() - started > timeout_ns_) {
        std::fprintf(stderr, "\n==fuzz== %s: timeout: one input has run for more than %.1f s\n", g_name,
                     timeout_ns_ / 1e9);
        save_current_input("timeout");
        std::_Exit(70);
      }
      const int64_t rss = rss_limit_mb_ > 0 ? rss_mb() : 0;
      if (rss > rss_limit_mb_ && rss_limit_mb_ > 0) {
        std::fprintf(stderr, "\n==fuzz== %s: out of memory: RSS %lld MB exceeds the limit of %lld MB\n", g_name,
                     static_cast<long long>(rss), static_cast<long long>(rss_limit_mb_));
        save_current_input("oom");
        std::_Exit(71);
      }
    }
  }

  int64_t timeout_ns_;
  int64_t rss_limit_mb_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- running one input ----

std::vector<std::string>* g_outcomes = nullptr;  // of the running input

void collect_outcome(std::string_view outcome) {
  if (g_outcomes != nullptr) g_outcomes->emplace_back(outcome);
}

std::string demangle(const char* name) {
  int status = 0;
  char* s = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && s != nullptr ? s : name;
  std::free(s);
  return out;
}

// An exception that escaped the harness: its type and message; empty when none did.
std::string run_input(const Bytes& input, std::vector<std::string>& outcomes) {
  // A copy of exactly `size` bytes, so that ASan catches a read past the end of the input.
  uint8_t* copy = new uint8_t[std::max<size_t>(input.size(), 1)];
  if (!input.empty()) std::memcpy(copy, input.data(), input.size());
  g_data = copy;
  g_size = input.size();
  g_outcomes = &outcomes;
  g_started_ns = now_ns();
  std::string escaped;
  try {
    LLVMFuzzerTestOneInput(copy, input.size());
  } catch (const std::exception& e) {
    escaped = demangle(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    escaped = "exception of type " + (t != nullptr ? demangle(t->name()) : std::string("?"));
  }
  g_started_ns = 0;
  g_outcomes = nullptr;
  g_data = nullptr;
  g_size = 0;
  delete[] copy;
  return escaped;
}

// ---- mutations ----

class Mutator {
 public:
  Mutator(uint64_t seed, size_t max_len, std::vector<Bytes> dict)
      : rng_(seed), max_len_(max_len), dict_(std::move(dict)) {}

  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // 1-5 stacked mutations of `v` (`corpus` supplies the second parent of a splice).
  void mutate(Bytes& v, const std::vector<Bytes>& corpus) {
    const int n = 1 + static_cast<int>(below(5));
    for (int i = 0; i < n; ++i) mutate_once(v, corpus);
    if (v.size() > max_len_) v.resize(max_len_);
  }

 private:
  static constexpr uint64_t kInteresting[] = {
      0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 100, 127, 128, 255, 256, 512, 1000, 1023, 1024, 4095, 4096,
      32767, 32768, 65535, 65536, 0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x100000000ull,
      uint64_t{1} << 40, uint64_t{1} << 61, uint64_t{1} << 62, 0x7fffffffffffffffull, 0x8000000000000000ull,
      0xffffffffffffffffull, 100ull << 20, (100ull << 20) + 1, 0xfffffffffffffff8ull, 0xfffffffeull};
  static constexpr const char* kDecimals[] = {
      "0", "1", "-1", "-0", "2", "7", "8", "255", "256", "65536", "2147483647", "2147483648", "-2147483648",
      "-2147483649", "4294967295", "4294967296", "1099511627776", "1152921504606846976", "2305843009213693952",
      "4611686018427387904", "4611686018427387905", "9223372036854775807", "9223372036854775808",
      "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
      "99999999999999999999999", "00", "01", "1e3", "1.5"};

  void put_int(Bytes& v, size_t pos, uint64_t value, int width, bool big_endian) {
    for (int b = 0; b < width; ++b) {
      const int shift = 8 * (big_endian ? width - 1 - b : b);
      v[pos + b] = static_cast<uint8_t>(value >> shift);
    }
  }
  uint64_t get_int(const Bytes& v, size_t pos, int width, bool big_endian) {
    uint64_t value = 0;
    for (int b = 0; b < width; ++b) {
      const int shift = 8 * (big_endian ? width - 1 - b : b);
      value |= uint64_t{v[pos + b]} << shift;
    }
    return value;
  }

  void insert_bytes(Bytes& v, size_t pos, const uint8_t* p, size_t n) { v.insert(v.begin() + pos, p, p + n); }

  void mutate_once(Bytes& v, const std::vector<Bytes>& corpus) {
    if (v.empty()) {  // nothing to change yet: grow
      const uint8_t b = static_cast<uint8_t>(rng_());
      v.push_back(b);
      return;
    }
    const size_t n = v.size();
    switch (below(dict_.empty() ? 12 : 14)) {
      case 0:  // flip a bit
        v[below(n)] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // a random byte
        v[below(n)] = static_cast<uint8_t>(rng_());
        break;
      case 2: {  // an interesting integer, 1/2/4/8 bytes, either byte order
        const int width = 1 << below(4);
        if (n < static_cast<size_t>(width)) break;
        uint64_t value = kInteresting[below(std::size(kInteresting))];
        if (below(4) == 0) value = ~value + 1;  // negated
        put_int(v, below(n - width + 1), value, width, below(2) == 0);
        break;
      }
      case 3: {  // add or subtract a little, 1/2/4/8 bytes, either byte order
        const int width = 1 << below(4);
        if (n < static_cast<size_t>(width)) break;
        const size_t pos = below(n - width + 1);
        const bool be = below(2) == 0;
        const uint64_t delta = 1 + below(35);
        const uint64_t value = get_int(v, pos, width, be);
        put_int(v, pos, below(2) == 0 ? value + delta : value - delta, width, be);
        break;
      }
      case 4: {  // insert 1-16 random bytes, or one byte repeated
        const size_t k = 1 + below(16);
        Bytes bytes(k);
        const bool repeat = below(2) == 0;
        const uint8_t fill = static_cast<uint8_t>(rng_());
        for (auto& b : bytes) b = repeat ? fill : static_cast<uint8_t>(rng_());
        insert_bytes(v, below(n + 1), bytes.data(), k);
        break;
      }
      case 5: {  // delete a range (short, or up to half)
        const size_t k = 1 + below(below(4) == 0 ? std::max<size_t>(n / 2, 1) : std::min<size_t>(n, 16));
        const size_t pos = below(n - std::min(k, n) + 1);
        v.erase(v.begin() + pos, v.begin() + std::min(n, pos + k));
        break;
      }
      case 6:  // truncate
        if (below(4) == 0) v.resize(below(n));
        break;
      case 7: {  // copy a range elsewhere (overwrite or insert)
        const size_t k = 1 + below(std::min<size_t>(n, 64));
        const size_t from = below(n - k + 1);
        const Bytes chunk(v.begin() + from, v.begin() + from + k);
        if (below(2) == 0) {
          insert_bytes(v, below(n + 1), chunk.data(), k);
        } else {
          const size_t to = below(n - k + 1);
          std::copy(chunk.begin(), chunk.end(), v.begin() + to);
        }
        break;
      }
      case 8: {  // splice: a prefix of this one, a suffix of another corpus entry
        const Bytes& other = corpus[below(corpus.size())];
        const size_t cut = below(n + 1);
        const size_t from = below(other.size() + 1);
        v.resize(cut);
        v.insert(v.end(), other.begin() + from, other.end());
        break;
      }
      case 9: {  // an interesting byte
        static constexpr uint8_t kBytes[] = {0, 1, 0x7f, 0x80, 0xff, ' ', '"', ',', ':', '-', '0', '9', '[',
                                             ']', '{', '}', '\\', '\n', '.'};
        v[below(n)] = kBytes[below(std::size(kBytes))];
        break;
      }
      case 10:
      case 11: {  // replace a decimal number (the run of digits at or after a random position) by an interesting one
        size_t pos = below(n);
        while (pos < n && !(v[pos] >= '0' && v[pos] <= '9')) ++pos;
        if (pos == n) break;
        size_t begin = pos, end = pos;
        while (begin > 0 && v[begin - 1] >= '0' && v[begin - 1] <= '9') --begin;
        if (begin > 0 && v[begin - 1] == '-') --begin;
        while (end < n && v[end] >= '0' && v[end] <= '9') ++end;
        const char* s = kDecimals[below(std::size(kDecimals))];
        v.erase(v.begin() + begin, v.begin() + end);
        insert_bytes(v, begin, reinterpret_cast<const uint8_t*>(s), std::strlen(s));
        break;
      }
      case 12:
      case 13: {  // a dictionary token, inserted or overwriting
        const Bytes& token = dict_[below(dict_.size())];
        if (below(2) == 0 || token.size() > n) {
          insert_bytes(v, below(n + 1), token.data(), token.size());
        } else {
          std::copy(token.begin(), token.end(), v.begin() + below(n - token.size() + 1));
        }
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  size_t max_len_;
  std::vector<Bytes> dict_;
};

// ---- files ----

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A libFuzzer/AFL dictionary: one token per line, `"text"` or `name="text"`, with \\, \" and \xNN escapes only;
// blank lines and lines starting with # are ignored.
std::vector<Bytes> read_dict(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the dictionary " + path);
  std::vector<Bytes> tokens;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t open = line.find('"'), close = line.rfind('"');
    if (open == std::string::npos || close <= open) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": expected a quoted token");
    }
    Bytes token;
    for (size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        const char e = line[++i];
        if (e == 'x' && i + 2 < close) {
          token.push_back(static_cast<uint8_t>(std::stoi(line.substr(i + 1, 2), nullptr, 16)));
          i += 2;
        } else if (e == '\\' || e == '"') {
          token.push_back(static_cast<uint8_t>(e));
        } else {  // as libFuzzer: no \n and the like
          throw std::runtime_error(path + ":" + std::to_string(line_no) + ": unknown escape \\" + e + " (use \\xNN)");
        }
      } else {
        token.push_back(static_cast<uint8_t>(line[i]));
      }
    }
    if (!token.empty()) tokens.push_back(std::move(token));
  }
  return tokens;
}

// `bazel run` starts the program in its runfiles; a relative path the user typed is relative to where they were.
fs::path resolve(const std::string& p) {
  const char* bwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (fs::path(p).is_relative() && !fs::exists(p) && bwd != nullptr && fs::exists(fs::path(bwd) / p)) {
    return fs::path(bwd) / p;
  }
  return p;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      o.paths.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    auto need_value = [&] {
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        throw std::runtime_error("--" + name + " needs a value");
      }
    };
    if (name == "keep_going") {
      o.keep_going = true;
      continue;
    }
    need_value();
    if (name == "seconds") o.seconds = std::stod(value);
    else if (name == "runs") o.runs = std::stoll(value);
    else if (name == "seed") o.seed = std::stoull(value);
    else if (name == "max_len") o.max_len = std::stoull(value);
    else if (name == "timeout") o.timeout = std::stod(value);
    else if (name == "rss_limit_mb") o.rss_limit_mb = std::stoll(value);
    else if (name == "dict") o.dicts.push_back(value);
    else if (name == "artifact_dir") o.artifact_dir = value;
    else if (name == "save_new") o.save_new = value;
    else throw std::runtime_error("unknown option --" + name + " (see fuzz/fuzz_driver.cc)");
  }
  return o;
}

// "<label>:<file>:<line> <message up to its first quoted part>" of an outcome (fuzz/fuzz_target.h).
std::string check_of(const std::string& outcome) { return outcome.substr(0, outcome.find("'*")); }

// Distinct findings by kind, with digits blanked so that one bug seen with many sizes counts once.
std::string finding_key(const std::string& what) {
  std::string key = what.substr(0, 160);
  for (char& c : key) {
    if (c >= '0' && c <= '9') c = '#';
  }
  return key;
}

int run(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  g_name = argv[0];
  if (const char* slash = std::strrchr(argv[0], '/')) g_name = slash + 1;
  std::string artifacts = o.artifact_dir;
  if (artifacts.empty()) {
    const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    const char* bwd = std::getenv("BUILD_WORKING_DIRECTORY");
    artifacts = outputs != nullptr ? outputs : bwd != nullptr ? bwd : ".";
    if (outputs != nullptr) g_outputs_hint = " (after bazel test: bazel-testlogs/<package>/<target>/test.outputs/outputs.zip)";
  }
  std::snprintf(g_artifact_dir, sizeof g_artifact_dir, "%s", artifacts.c_str());
  if (!o.save_new.empty()) fs::create_directories(o.save_new);

  // Inputs: files named on the command line (reproduce mode), else every file under the corpus directories.
  std::vector<std::pair<std::string, Bytes>> seeds;
  bool reproduce = false;
  for (const std::string& p : o.paths) reproduce |= fs::is_regular_file(resolve(p));
  for (const std::string& p : o.paths) {
    const fs::path path = resolve(p);
    if (fs::is_regular_file(path)) {
      seeds.emplace_back(path.string(), read_file(path));
    } else if (fs::is_directory(path)) {
      if (reproduce) continue;
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(path)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // a fixed order: runs repeat
      for (const fs::path& f : files) seeds.emplace_back(f.string(), read_file(f));
    } else {
      throw std::runtime_error("no such file or directory: " + p);
    }
  }
  std::vector<Bytes> dict;
  for (const std::string& d : o.dicts) {
    for (Bytes& t : read_dict(resolve(d).string())) dict.push_back(std::move(t));
  }

  dpe::fuzz::set_outcome_sink(collect_outcome);
  install_crash_handlers();
  Watchdog watchdog(o.timeout, o.rss_limit_mb);

  std::unordered_set<std::string> seen_outcomes;
  std::unordered_map<std::string, int> signatures_per_check;
  std::map<std::string, std::string> findings;  // key -> first report
  auto report = [&](const std::string& source, const Bytes& input, const std::string& what) {
    const std::string key = finding_key(what);
    if (findings.count(key)) return;
    char hash[17];
    hex64(fnv1a(input.data(), input.size()), hash);
    const fs::path saved = fs::path(artifacts) / (std::string("crash-") + hash);
    {
      std::ofstream out(saved, std::ios::binary);
      out.write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
    }
    std::string hex;
    if (input.size() <= 256) {
      for (uint8_t b : input) {
        hex += "0123456789abcdef"[b >> 4];
        hex += "0123456789abcdef"[b & 15];
      }
    }
    std::fprintf(stderr, "\n==fuzz== %s: FINDING on %s (%zu bytes): %s\n==fuzz== the input is saved as %s%s\n%s%s%s",
                 g_name, source.c_str(), input.size(), what.c_str(), saved.c_str(), g_outputs_hint,
                 hex.empty() ? "" : "==fuzz== input (hex): ", hex.c_str(), hex.empty() ? "" : "\n");
    findings[key] = what;
  };
  auto done = [&] { return !findings.empty() && !o.keep_going; };

  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);

  // 1. The corpus (or the files to reproduce).
  std::vector<Bytes> corpus;
  const auto t0 = Clock::now();
  for (const auto& [name, input] : seeds) {
    std::vector<std::string> outcomes;
    const std::string escaped = run_input(input, outcomes);
    if (!escaped.empty()) report(name, input, escaped);
    if (reproduce) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), escaped.empty() ? "no finding" : "FINDING");
      for (const std::string& oc : outcomes) std::fprintf(stderr, "  outcome %s\n", oc.c_str());
    }
    for (auto& oc : outcomes) {
      if (seen_outcomes.insert(oc).second) ++signatures_per_check[check_of(oc)];
    }
    corpus.push_back(input.size() > o.max_len ? Bytes(input.begin(), input.begin() + o.max_len) : input);
    if (done()) break;
  }
  const double corpus_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "%s: %zu corpus inputs in %.2f s, %zu distinct outcomes\n", g_name, seeds.size(), corpus_s,
               seen_outcomes.size());

  // 2. Mutations.
  if (!reproduce && !done()) {
    if (corpus.empty()) corpus.push_back({});
    const size_t seed_count = corpus.size();
    Mutator mutator(o.seed, o.max_len, std::move(dict));
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
    auto next_status = start + std::chrono::seconds(10);
    int64_t runs = 0;
    std::vector<std::string> outcomes;
    Bytes input;
    while ((o.runs < 0 || runs < o.runs) && (o.runs >= 0 || Clock::now() < deadline) && !done()) {
      input = corpus[mutator.below(corpus.size())];
      mutator.mutate(input, corpus);
      outcomes.clear();
      const std::string escaped = run_input(input, outcomes);
      ++runs;
      if (!escaped.empty()) report("mutated input #" + std::to_string(runs), input, escaped);
      bool fresh = false;
      for (auto& oc : outcomes) {
        // At most 32 signatures per check and message up to its first quoted part: messages that quote
        // the input, or one fail() helper throwing for many checks, would otherwise flood the corpus.
        int& per_check = signatures_per_check[check_of(oc)];
        if (per_check < 32 && seen_outcomes.insert(std::move(oc)).second) {
          ++per_check;
          fresh = true;
        }
      }
      if (fresh && corpus.size() < 4096) {
        corpus.push_back(input);
        if (!o.save_new.empty()) {
          char hash[17];
          hex64(fnv1a(input.data(), input.size()), hash);
          std::ofstream(fs::path(o.save_new) / hash, std::ios::binary)
              .write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
        }
      }
      if (Clock::now() >= next_status) {
        next_status += std::chrono::seconds(10);
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        std::fprintf(stderr, "%s: #%lld runs in %.0f s (%.0f exec/s), corpus %zu, %zu outcomes\n", g_name,
                     static_cast<long long>(runs), s, runs / s, corpus.size(), seen_outcomes.size());
      }
    }
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr,
                 "%s: %lld mutated inputs in %.2f s (%.0f exec/s; seed %llu), corpus %zu -> %zu, %zu distinct "
                 "outcomes\n",
                 g_name, static_cast<long long>(runs), s, s > 0 ? runs / s : 0.0,
                 static_cast<unsigned long long>(o.seed), seed_count, corpus.size(), seen_outcomes.size());
  }
  dpe::fuzz::set_outcome_sink(nullptr);
  std::fprintf(stderr, "%s: %zu finding%s\n", g_name, findings.size(), findings.size() == 1 ? "" : "s");
  return findings.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz driver: %s\n", e.what());
    return 2;
  }
}
