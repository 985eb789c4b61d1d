// What every fuzz harness (fuzz/*_fuzz.cc) shares. A harness is libFuzzer's entry point
//
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
//
// run by fuzz/fuzz_driver.cc (the seed corpus, then a deterministic mutation loop; docs/FUZZING.md), or by
// clang's libFuzzer unchanged. The contract of every harness: an input the parser rejects ends in dpe::Error
// (caught by expect_only_dpe_errors); anything else (dpe::InternalError, another exception, a crash, a
// sanitizer report, a hang, a huge allocation) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/error.h"

namespace dpe::fuzz {

// Feedback for the driver's mutation loop: the outcome of one call, e.g. "plain:ok" or the source location
// of the check that rejected the input ("plain:data/idx_reader.cc:123"). An input reaching an outcome no
// earlier input reached joins the corpus. Without the driver (under libFuzzer) it does nothing.
void note_outcome(std::string_view outcome);
using OutcomeSink = void (*)(std::string_view outcome);
void set_outcome_sink(OutcomeSink sink);

// What rejected an input, as an outcome: the check that threw (core/error.cc appends "(<file>:<line>)" to
// the message) and the message with its numbers and quoted parts blanked, so that checks sharing one throw
// site (a fail() helper) still tell apart, and one check with many values counts once:
//   "f: bad magic number 7 ('x') (data/idx_reader.cc:98)" -> "data/idx_reader.cc:98 f: bad magic number # ('*')"
std::string error_signature(std::string_view what);
// The "<file>:<line>" that core/error.cc appends to every dpe::Error message; "?" when there is none. Only
// feedback: an input with a NUL byte cuts what() short, and its own text may then pose as a location.
std::string_view error_location(std::string_view what);

// A harness's own verdict that an input found a bug (an oracle failed). Not a dpe::Error, so the driver (and
// libFuzzer, through std::terminate) report it.
class Finding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws Finding("harness oracle failed: <what>") unless ok (e.g. parse(dump(v)) == v).
void require(bool ok, const std::string& what);

// Runs f(). A dpe::Error is the expected way to reject an input: swallowed and noted as "<label>:<signature>".
// Except the allocators' "out of memory" (core/allocator.cc; recognised by the start of the message, which
// no input can forge: messages that quote the input start with dpe's own words): an input of a few KB that
// makes dpe allocate more than the machine has (or than ASan's 2 GiB limit in the driver) is a size taken
// from the input unchecked, a Finding. dpe::InternalError (a dpe bug) and every other exception propagate to the
// driver, which reports them.
template <typename F>
void expect_only_dpe_errors(std::string_view label, F&& f) {
  try {
    f();
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    const std::string_view what = e.what();
    if (what.starts_with("out of memory")) {
      throw Finding("an input made dpe run out of memory: " + std::string(what));
    }
    note_outcome(std::string(label) + ":" + error_signature(what));
    return;
  }
  note_outcome(std::string(label) + ":ok");
}

// A file holding the current input, for readers that take a path: an anonymous in-memory file
// (memfd_create, path /proc/self/fd/N), or a file under $TEST_TMPDIR / $TMPDIR where memfd is unavailable.
class InputFile {
 public:
  explicit InputFile(const std::string& name);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's contents.
  void write(const uint8_t* data, size_t size);
  // Replaces the contents with `data` gzip-compressed (a valid gzip stream around arbitrary bytes).
  void write_gzip(const uint8_t* data, size_t size);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  bool unlink_ = false;
  std::string path_;
};

}  // namespace dpe::fuzz
