#include "io/checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/file_kind.h"
#include "core/ops.h"
#include "io/safetensors_header.h"
#include "io/atomic_file.h"
#include "optim/grad_scaler.h"

namespace dpe::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; dpe writes tensors' bytes as they are in memory");

namespace {

constexpr const char* kCheckpointVersion = "1";  // dpe.checkpoint_version: what this dpe writes and reads
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kOptimizerStatePrefix = "optimizer.state.";
// A header larger than this is treated as corrupt (safetensors' own reader caps it at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Int64: return "I64";
    case DType::Int32: return "I32";
    case DType::UInt8: return "U8";
  }
  DPE_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(t));
}

bool parse_safetensors_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::Float32}, {"F64", DType::Float64}, {"F16", DType::Float16}, {"BF16", DType::BFloat16},
      {"I64", DType::Int64},   {"I32", DType::Int32},   {"U8", DType::UInt8}};
  for (const auto& [name, dtype] : kTable) {
    if (s == name) {
      *out = dtype;
      return true;
    }
  }
  return false;
}

std::string strip_module_prefix(const std::string& name) {
  return name.rfind("module.", 0) == 0 ? name.substr(7) : name;
}

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// ---- writing ----

struct Entry {
  std::string name;
  Tensor host;  // contiguous, on cpu:0
};

// Writes the checkpoint's bytes to the temporary, counting them, so that an error can say how far it got; EFBIG
// names the file size limit (SIGXFSZ is ignored while saving: io/temp_file.h) or the file system's largest file.
struct TemporaryWriter {
  int fd;
  const std::string& tmp;
  uint64_t total;  // the checkpoint's size
  uint64_t written = 0;

  void write_all(const char* data, size_t n) {
    size_t done = 0;
    const int err = write_fully(fd, data, n, &done);
    written += done;
    if (err != 0) fail_write(err);
  }

  [[noreturn]] void fail_write(int err) const {
    if (err == EFBIG) {
      rlimit limit;
      if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < total) {
        DPE_CHECK(false, "save_checkpoint: writing ", tmp, " failed: ", std::strerror(err), ": the checkpoint is ",
                  total, " bytes but the file size limit (`ulimit -f`, RLIMIT_FSIZE) is ", limit.rlim_cur,
                  " bytes; expected a limit of at least ", total, " bytes (`ulimit -f unlimited`)");
      }
      DPE_CHECK(false, "save_checkpoint: writing ", tmp, " failed: ", std::strerror(err), " at byte ", written,
                " of ", total, ": the checkpoint is larger than the file system's largest file");
    }
    DPE_CHECK(false, "save_checkpoint: writing ", tmp, " failed at byte ", written, " of ", total, ": ",
              std::strerror(err));
    __builtin_unreachable();
  }
};

// Note [Checkpoint temporaries]
// Each save writes a temporary of its own (io/atomic_file.h), so two writers of one path never share (and
// tear) a temporary, as they did with a fixed `path + ".tmp"`. Temporaries left by killed runs are never read
// (load opens only `path`) and never removed by other saves (a live writer's temporary looks the same).

// Writes the header block and the entries through io::write_file_atomically.
void write_atomically(const std::string& path, const std::string& header_block, const std::vector<Entry>& entries) {
  struct stat st;
  DPE_CHECK(!(::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)), "save_checkpoint: ", path,
            " is a directory; expected a file path");
  uint64_t total = header_block.size();
  for (const Entry& e : entries) total += e.host.nbytes();
  write_file_atomically(path, "save_checkpoint", [&](int fd, const std::string& tmp) {
    TemporaryWriter writer{fd, tmp, total};
    writer.write_all(header_block.data(), header_block.size());
    for (const Entry& e : entries) writer.write_all(static_cast<const char*>(e.host.data_ptr()), e.host.nbytes());
  });
}

Tensor to_host_contiguous(const Tensor& t) {
  return t.detach().to(Device::cpu(0)).contiguous();
}

// ---- reading ----

// Throws "load_checkpoint: <path>: <message>".
template <typename... Args>
[[noreturn]] void fail(const std::string& path, const Args&... args) {
  DPE_CHECK(false, "load_checkpoint: ", path, ": ", args...);
  __builtin_unreachable();
}

struct FileTensor {
  DType dtype = DType::Float32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // within the data section
};

// An open file descriptor, closed on destruction.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Note [Reading checkpoints by ranges]: load never holds the whole file in memory. It reads the 8-byte
// length, then the header (at most kMaxHeaderBytes and at most what the file holds), validates it against
// the file's size, and reads each tensor's byte range straight into a freshly allocated tensor of the
// entry's dtype and shape. Those tensors are staging copies: the model, optimizer, state and generators are
// only modified after every range has been read and every check has passed. The descriptor stays open for
// the whole load, so a concurrent save (which renames a new file over the path) cannot mix two files.
struct ParsedFile {
  std::string path;
  std::unique_ptr<Fd> fd;
  uint64_t file_size = 0;
  uint64_t data_start = 0;  // 8 + header length
  std::map<std::string, FileTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads exactly n bytes at `offset` into dst; a short read (the file shrank under us) or an I/O error fails.
void read_range(const ParsedFile& f, uint64_t offset, void* dst, uint64_t n, const std::string& what) {
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, uint64_t{1} << 30));
    const ssize_t r = ::pread(f.fd->get(), out + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(f.path, "read error in ", what, " at byte ", offset + done, ": ", std::strerror(errno));
    if (r == 0) {
      fail(f.path, "truncated while reading ", what, ": bytes [", offset, ", ", offset + n, ") expected, the file ",
           "ends at ", offset + done, " (was it replaced or cut while loading?)");
    }
    done += static_cast<uint64_t>(r);
  }
}

ParsedFile read_and_validate(const std::string& path) {
  ParsedFile f;
  f.path = path;
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below like any non-regular file.
  const int raw_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (raw_fd < 0) fail(path, "cannot open the file (", std::strerror(errno), ")");
  f.fd = std::make_unique<Fd>(raw_fd);
  struct stat st;
  if (::fstat(raw_fd, &st) != 0) fail(path, "cannot stat the file (", std::strerror(errno), ")");
  if (!S_ISREG(st.st_mode)) {
    fail(path, "is ", io::file_kind(st.st_mode), ", not a checkpoint file",
         S_ISDIR(st.st_mode) ? " (pass the .safetensors file inside it)" : "");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  f.file_size = size;
  if (size < 8) fail(path, "truncated: ", size, " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  read_range(f, 0, &header_len, 8, "the header length");  // little-endian (static_assert above)
  if (header_len > kMaxHeaderBytes) fail(path, "bad header length ", header_len, " (more than 100 MB: corrupt?)");
  if (header_len > size - 8) {
    fail(path, "truncated or bad header length: the header claims ", header_len, " bytes but only ", size - 8,
         " follow the length field");
  }
  f.data_start = 8 + header_len;
  const uint64_t data_size = size - f.data_start;
  safetensors::Json header;
  {
    std::string text;
    try {
      text.resize(header_len);  // at most 100 MB and at most the file's size (both checked above)
    } catch (const std::bad_alloc&) {
      fail(path, "out of memory allocating ", header_len, " bytes for the JSON header");
    }
    read_range(f, 8, text.data(), header_len, "the JSON header");
    try {
      header = safetensors::parse_header(text);
    } catch (const Error& e) {
      fail(path, "malformed JSON header: ", e.what());
    } catch (const std::bad_alloc&) {
      fail(path, "out of memory parsing the ", header_len, "-byte JSON header");
    }
  }
  if (!header.is_object()) fail(path, "the JSON header is a ", safetensors::kind_name(header), ", not an object");
  for (const auto& member : header.items()) {
    const std::string& name = member.key();
    const safetensors::Json& v = member.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& m : v.items()) {
        if (!m.value().is_string()) {
          fail(path, "__metadata__ value of '", m.key(), "' is a ", safetensors::kind_name(m.value()),
               ", not a string");
        }
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail(path, "entry '", name, "' is not an object");
    const auto dtype_it = v.find("dtype"), shape_it = v.find("shape"), offsets_it = v.find("data_offsets");
    if (dtype_it == v.end() || shape_it == v.end() || offsets_it == v.end()) {
      fail(path, "entry '", name, "' lacks dtype, shape or data_offsets");
    }
    const safetensors::Json &dtype = *dtype_it, &shape = *shape_it, &offsets = *offsets_it;
    FileTensor t;
    const std::string dtype_name = dtype.is_string() ? dtype.get<std::string>() : safetensors::kind_name(dtype);
    if (!dtype.is_string() || !parse_safetensors_dtype(dtype_name, &t.dtype)) {
      fail(path, "entry '", name, "' has unsupported dtype ", dtype_name,
           " (supported: F32, F64, F16, BF16, I64, I32, U8)");
    }
    if (!shape.is_array()) fail(path, "entry '", name, "': shape is not an array");
    for (const safetensors::Json& d : shape) {
      // nlohmann holds a non-negative integer as unsigned, a negative one as signed.
      if (!d.is_number_unsigned()) fail(path, "entry '", name, "': shape has a non-integer or negative size");
      const uint64_t size = d.get<uint64_t>();
      if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(path, "entry '", name, "': shape has a size ", size, " above 2^63 - 1");
      }
      t.shape.push_back(static_cast<int64_t>(size));
    }
    // numel and numel * element size, checked: an unchecked product wraps (F64 [2^62] "needs" 0 bytes) and
    // would pass the size comparison below with an empty byte range.
    const bool has_zero = std::find(t.shape.begin(), t.shape.end(), int64_t{0}) != t.shape.end();
    uint64_t numel = 1, expected = 0;
    bool overflow = false;
    for (int64_t d : t.shape) overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
    overflow = overflow || __builtin_mul_overflow(numel, uint64_t{element_size(t.dtype)}, &expected) ||
               expected > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (has_zero) expected = 0;
    if (overflow && !has_zero) {
      fail(path, "entry '", name, "': shape is too large: ", dtype_name, " ", shape_str(t.shape),
           " needs more than 2^63 bytes (the product of its sizes overflows)");
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_integer() ||
        !offsets[1].is_number_integer()) {
      fail(path, "entry '", name, "': data_offsets is not [begin, end]");
    }
    // Offsets are u64 (exact: safetensors_header.h); a negative one is signed.
    const std::string b = offsets[0].dump(), e = offsets[1].dump();
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned() ||
        offsets[1].get<uint64_t>() < offsets[0].get<uint64_t>()) {
      fail(path, "entry '", name, "': invalid data_offsets [", b, ", ", e, "]");
    }
    t.begin = offsets[0].get<uint64_t>();
    t.end = offsets[1].get<uint64_t>();
    if (t.end > data_size) {
      fail(path, "entry '", name, "': data_offsets [", b, ", ", e, "] lie outside the ", data_size,
           "-byte data section (truncated file?)");
    }
    if (t.end - t.begin != expected) {
      fail(path, "entry '", name, "': data_offsets cover ", t.end - t.begin, " bytes but ", dtype_name, " ",
           shape_str(t.shape), " needs ", expected);
    }
    f.tensors[name] = std::move(t);
  }
  // Two tensors sharing bytes (the same or overlapping data_offsets) were once accepted: loading one into a
  // model and writing it back would change the other.
  {
    std::vector<safetensors::TensorRange> ranges;
    ranges.reserve(f.tensors.size());
    for (const auto& [name, t] : f.tensors) ranges.push_back({name, t.begin, t.end});
    try {
      safetensors::check_disjoint_ranges(std::move(ranges));
    } catch (const Error& e) {
      fail(path, e.what());
    }
  }
  // A file of another safetensors writer has no version (its tensors still load); a dpe checkpoint of
  // another format version may mean anything.
  auto version = f.metadata.find("dpe.checkpoint_version");
  if (version != f.metadata.end() && version->second != kCheckpointVersion) {
    fail(path, "__metadata__ 'dpe.checkpoint_version' = '", version->second, "'; this dpe reads version ",
         kCheckpointVersion, " (was the file written by another dpe version?)");
  }
  return f;
}

// A new tensor holding the entry's bytes, read from the file (Note [Reading checkpoints by ranges]). The
// byte count was checked against the file's size, so the allocation is never larger than the file.
Tensor materialize(const ParsedFile& f, const std::string& name, const FileTensor& t) {
  Tensor out;
  try {
    out = Tensor::empty(t.shape, TensorOptions(t.dtype));
  } catch (const Error& e) {
    fail(f.path, "cannot allocate tensor '", name, "' (", t.dtype, " ", shape_str(t.shape), ", ", t.end - t.begin,
         " bytes): ", e.what());
  } catch (const std::bad_alloc&) {
    fail(f.path, "out of memory allocating tensor '", name, "' (", t.dtype, " ", shape_str(t.shape), ", ",
         t.end - t.begin, " bytes)");
  }
  if (t.end > t.begin) read_range(f, f.data_start + t.begin, out.data_ptr(), t.end - t.begin, "tensor '" + name + "'");
  return out;
}

const std::string& require_meta(const std::string& path, const ParsedFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) fail(path, "__metadata__ lacks '", key, "'");
  return it->second;
}

int64_t parse_int(const std::string& path, const std::string& key, const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0') fail(path, "__metadata__ '", key, "' = '", s, "' is not an integer");
  return v;
}

uint64_t parse_uint(const std::string& path, const std::string& key, const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || errno != 0 || *end != '\0') {
    fail(path, "__metadata__ '", key, "' = '", s, "' is not an unsigned integer");
  }
  return v;
}

double parse_double(const std::string& path, const std::string& key, const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno == ERANGE || *end != '\0') fail(path, "__metadata__ '", key, "' = '", s, "' is not a number");
  return v;
}

// "a.b.c" after `prefix` split at the first dot: index and rest.
bool split_index(const std::string& s, size_t from, int64_t* index, std::string* rest) {
  const size_t dot = s.find('.', from);
  if (dot == std::string::npos || dot == from) return false;
  const std::string digits = s.substr(from, dot - from);
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  if (digits.size() > 18) return false;
  *index = std::stoll(digits);
  *rest = s.substr(dot + 1);
  return !rest->empty();
}

optim::OptimizerStateDict read_optimizer_state(const std::string& path, const ParsedFile& f) {
  optim::OptimizerStateDict sd;
  sd.type = require_meta(path, f, "optimizer.type");
  const int64_t groups = parse_int(path, "optimizer.param_groups", require_meta(path, f, "optimizer.param_groups"));
  if (groups < 0 || groups > 1000000) fail(path, "optimizer.param_groups = ", groups, " is not a valid count");
  for (int64_t g = 0; g < groups; ++g) {
    const std::string prefix = "optimizer.param_groups." + std::to_string(g) + ".";
    optim::OptimizerStateDict::Group group;
    group.lr = parse_double(path, prefix + "lr", require_meta(path, f, prefix + "lr"));
    const std::string& params = require_meta(path, f, prefix + "params");
    std::stringstream ss(params);
    for (std::string item; std::getline(ss, item, ',');) group.params.push_back(parse_int(path, prefix + "params", item));
    sd.param_groups.push_back(std::move(group));
  }
  // Group options: every other "optimizer.param_groups.<g>.<name>" key.
  for (const auto& [key, value] : f.metadata) {
    const std::string gp = "optimizer.param_groups.";
    if (key.rfind(gp, 0) != 0) continue;
    int64_t g = 0;
    std::string name;
    if (!split_index(key, gp.size(), &g, &name)) fail(path, "malformed optimizer metadata key '", key, "'");
    if (g >= groups) fail(path, "'", key, "' names param group ", g, " but there are ", groups);
    if (name == "lr" || name == "params") continue;
    sd.param_groups[g].options[name] = parse_double(path, key, value);
  }
  for (const auto& [key, value] : f.metadata) {
    if (key.rfind(kOptimizerStatePrefix, 0) != 0) continue;
    int64_t i = 0;
    std::string name;
    if (!split_index(key, std::strlen(kOptimizerStatePrefix), &i, &name)) {
      fail(path, "malformed optimizer metadata key '", key, "'");
    }
    sd.scalars[i][name] = parse_double(path, key, value);
  }
  for (const auto& [key, t] : f.tensors) {
    if (key.rfind(kOptimizerPrefix, 0) != 0) continue;
    int64_t i = 0;
    std::string name;
    if (key.rfind(kOptimizerStatePrefix, 0) != 0 || !split_index(key, std::strlen(kOptimizerStatePrefix), &i, &name)) {
      fail(path, "unexpected optimizer tensor '", key, "' (expected optimizer.state.<index>.<name>)");
    }
    sd.tensors[i][name] = materialize(f, key, t);
  }
  return sd;
}

// Note [Checkpoint values checked when loaded]: the optimizer's hyper-parameters and state scalars, against
// the ranges of the optimizer being loaded into (Note [Hyper-parameter ranges], optim/optimizer.h), named by
// their metadata key and the text in the file. A NaN or negative learning rate once loaded without a word and
// failed at the first training step, without naming the file. Only for a state of the optimizer's own type
// (another type is refused by check_state_dict, naming both).
void check_optimizer_values(const std::string& path, const ParsedFile& f, const optim::OptimizerStateDict& sd,
                            const optim::Optimizer& optimizer) {
  const std::string& type = optimizer.type_name();
  auto check = [&](const std::string& key, const std::string& name, const std::string& expected) {
    if (expected.empty()) return;
    auto it = f.metadata.find(key);
    fail(path, "__metadata__ '", key, "' = '", it == f.metadata.end() ? "?" : it->second, "' is not a valid ", type,
         " ", name, ": ", expected);
  };
  for (size_t g = 0; g < sd.param_groups.size(); ++g) {
    const std::string prefix = "optimizer.param_groups." + std::to_string(g) + ".";
    const auto& group = sd.param_groups[g];
    check(prefix + "lr", "learning rate", optimizer.hyper_parameter_violation("lr", group.lr));
    for (const auto& [name, value] : group.options) {
      check(prefix + name, name, optimizer.hyper_parameter_violation(name, value));
    }
    const std::string rule = optimizer.param_group_violation(group.lr, group.options);
    if (!rule.empty()) {
      fail(path, "__metadata__ 'optimizer.param_groups.", g, ".*' is not a valid ", type, " param group: ", rule);
    }
  }
  for (const auto& [i, named] : sd.scalars) {
    for (const auto& [name, value] : named) {
      check(std::string(kOptimizerStatePrefix) + std::to_string(i) + "." + name, "state scalar '" + name + "'",
            optimizer.state_scalar_violation(name, value));
    }
  }
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

}  // namespace

std::vector<GeneratorState> capture_rng_state() {
  std::vector<GeneratorState> out;
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::CUDA}) {
    for (const Device& d : all_devices(kind)) {
      Generator& g = default_generator(d);
      out.push_back({d.str(), g.seed(), g.offset()});
    }
  }
  return out;
}

void restore_rng_state(const std::vector<GeneratorState>& rng) {
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::CUDA}) {
    for (const Device& d : all_devices(kind)) {
      for (const GeneratorState& s : rng) {
        if (s.device != d.str()) continue;
        Generator& g = default_generator(d);
        g.manual_seed(s.seed);
        g.set_offset(s.offset);
      }
    }
  }
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const TrainingState& state) {
  std::vector<Entry> entries;
  std::set<std::string> names;
  for (const auto& [name, t] : model.state_dict()) {
    std::string n = strip_module_prefix(name);
    DPE_CHECK(n.rfind(kOptimizerPrefix, 0) != 0, "save_checkpoint: model tensor '", name,
              "' uses the reserved prefix 'optimizer.'");
    DPE_CHECK(n != "__metadata__" && names.insert(n).second, "save_checkpoint: duplicate or reserved tensor name '",
              n, "'");
    entries.push_back({n, to_host_contiguous(t)});
  }
  // Member names are distinct by construction (tensor names checked above, metadata keys with distinct
  // prefixes): append_member appends without searching, as the old writer did.
  safetensors::Json meta = safetensors::Json::object();
  safetensors::append_member(meta, "format", "pt");
  safetensors::append_member(meta, "dpe.checkpoint_version", kCheckpointVersion);
  safetensors::append_member(meta, "training.epoch", std::to_string(state.epoch));
  safetensors::append_member(meta, "training.step", std::to_string(state.step));
  const std::vector<GeneratorState> rng = state.rng.empty() ? capture_rng_state() : state.rng;
  for (const GeneratorState& g : rng) {
    safetensors::append_member(meta, "training.rng." + g.device,
                               std::to_string(g.seed) + "," + std::to_string(g.offset));
  }
  for (const auto& [k, v] : state.grad_scaler) {
    safetensors::append_member(meta, "training.grad_scaler." + k, format_double(v));
  }
  for (const auto& [k, v] : state.metadata) safetensors::append_member(meta, "user." + k, v);
  if (optimizer != nullptr) {
    const optim::OptimizerStateDict sd = optimizer->state_dict();
    safetensors::append_member(meta, "optimizer.type", sd.type);
    safetensors::append_member(meta, "optimizer.param_groups", std::to_string(sd.param_groups.size()));
    for (size_t g = 0; g < sd.param_groups.size(); ++g) {
      const std::string prefix = "optimizer.param_groups." + std::to_string(g) + ".";
      const auto& group = sd.param_groups[g];
      safetensors::append_member(meta, prefix + "lr", format_double(group.lr));
      std::string params;
      for (size_t i = 0; i < group.params.size(); ++i) params += (i ? "," : "") + std::to_string(group.params[i]);
      safetensors::append_member(meta, prefix + "params", params);
      for (const auto& [k, v] : group.options) safetensors::append_member(meta, prefix + k, format_double(v));
    }
    for (const auto& [i, named] : sd.scalars) {
      for (const auto& [k, v] : named) {
        safetensors::append_member(meta, std::string(kOptimizerStatePrefix) + std::to_string(i) + "." + k,
                                   format_double(v));
      }
    }
    for (const auto& [i, named] : sd.tensors) {
      for (const auto& [k, t] : named) {
        entries.push_back({std::string(kOptimizerStatePrefix) + std::to_string(i) + "." + k, to_host_contiguous(t)});
      }
    }
  }
  safetensors::Json header = safetensors::Json::object();
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    safetensors::Json shape = safetensors::Json::array();
    for (int64_t d : e.host.shape()) shape.push_back(d);
    safetensors::Json info = safetensors::Json::object();
    info["dtype"] = safetensors_dtype(e.host.dtype());
    info["shape"] = std::move(shape);
    const uint64_t end = offset + e.host.nbytes();
    info["data_offsets"] = safetensors::Json::array({offset, end});
    safetensors::append_member(header, e.name, std::move(info));
    offset = end;
  }
  safetensors::append_member(header, "__metadata__", std::move(meta));
  std::string text = safetensors::dump_header(header);
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned (8 + N is a multiple of 8)
  std::string block(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(block.data(), &n, 8);
  block += text;
  write_atomically(path, block, entries);
}

namespace {

// The training state in f's metadata (epoch, step, generators, user strings, loss scaler), checked.
TrainingState parse_training_state(const ParsedFile& f) {
  const std::string& path = f.path;
  TrainingState loaded;
  loaded.epoch = parse_int(path, "training.epoch", require_meta(path, f, "training.epoch"));
  loaded.step = parse_int(path, "training.step", require_meta(path, f, "training.step"));
  const std::string rng_prefix = "training.rng.";
  const std::string user_prefix = "user.", scaler_prefix = "training.grad_scaler.";
  for (const auto& [key, value] : f.metadata) {
    if (key.rfind(rng_prefix, 0) == 0) {
      const size_t comma = value.find(',');
      if (comma == std::string::npos) fail(path, "__metadata__ '", key, "' = '", value, "' is not '<seed>,<offset>'");
      loaded.rng.push_back({key.substr(rng_prefix.size()), parse_uint(path, key, value.substr(0, comma)),
                            parse_uint(path, key, value.substr(comma + 1))});
    } else if (key.rfind(user_prefix, 0) == 0) {
      loaded.metadata[key.substr(user_prefix.size())] = value;
    } else if (key.rfind(scaler_prefix, 0) == 0) {
      loaded.grad_scaler[key.substr(scaler_prefix.size())] = parse_double(path, key, value);
    }
  }
  // A loss scaler's state is checked here, naming the file, not when a GradScaler is given it (Note
  // [Checkpoint values checked when loaded]).
  if (!loaded.grad_scaler.empty()) {
    try {
      optim::GradScaler::check_state_dict(loaded.grad_scaler);
    } catch (const Error& e) {
      fail(path, "__metadata__ 'training.grad_scaler.*' is not a valid loss scaler state: ", e.what());
    }
  }
  return loaded;
}

}  // namespace

TrainingState read_training_state(const std::string& path) { return parse_training_state(read_and_validate(path)); }

void load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer, TrainingState* state) {
  const ParsedFile f = read_and_validate(path);

  // Model: exactly the model's keys (optimizer.* entries aside), same shapes and dtypes.
  nn::StateDict incoming;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> model_names;
  for (const auto& [name, t] : model.state_dict()) {
    const std::string n = strip_module_prefix(name);
    model_names.insert(n);
    auto it = f.tensors.find(n);
    if (it == f.tensors.end()) {
      missing.push_back(n);
      continue;
    }
    if (it->second.shape != t.shape() || it->second.dtype != t.dtype()) {
      std::ostringstream os;
      os << n << " (file " << it->second.dtype << " " << shape_str(it->second.shape) << ", model " << t.dtype()
         << " " << shape_str(t.shape()) << ")";
      mismatched.push_back(os.str());
      continue;
    }
    incoming.emplace_back(name, materialize(f, n, it->second));
  }
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind(kOptimizerPrefix, 0) != 0 && !model_names.count(name)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    fail(path, "does not match the ", model.type_name(), " model:",
         missing.empty() ? "" : " missing keys: " + join(missing) + ";",
         unexpected.empty() ? "" : " unexpected keys: " + join(unexpected) + ";",
         mismatched.empty() ? "" : " dtype/shape mismatch: " + join(mismatched) + ";", " nothing was loaded");
  }

  // Optimizer: parsed and checked against the optimizer before anything is modified.
  optim::OptimizerStateDict opt_state;
  if (optimizer != nullptr) {
    if (!f.metadata.count("optimizer.type")) fail(path, "holds no optimizer state, but an optimizer was given");
    opt_state = read_optimizer_state(path, f);
    if (opt_state.type == optimizer->type_name()) check_optimizer_values(path, f, opt_state, *optimizer);
    try {
      optimizer->check_state_dict(opt_state);
    } catch (const Error& e) {
      fail(path, "optimizer state does not fit: ", e.what());
    }
  }

  // Training state.
  TrainingState loaded;
  if (state != nullptr) loaded = parse_training_state(f);

  // Everything is valid: apply.
  model.load_state_dict(incoming, /*strict=*/true);
  if (optimizer != nullptr) optimizer->load_state_dict(opt_state);
  if (state != nullptr) {
    restore_rng_state(loaded.rng);
    *state = std::move(loaded);
  }
}

}  // namespace dpe::io
