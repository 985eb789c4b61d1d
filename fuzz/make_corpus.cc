// Writes the seed corpora of the fuzz harnesses (fuzz/corpus/<harness>/): small valid inputs and slightly
// invalid ones. Deterministic (fixed seeds and RNG state), so rerunning it rewrites the same bytes:
//
//   bazel run //fuzz:make_corpus -- "$PWD/fuzz/corpus"
//
// Inputs that the fuzzers found and that now pass belong in fuzz/corpus/<harness>/regression-* (added by
// hand, not written here).
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "io/checkpoint.h"
#include "fuzz/fuzz_model.h"
#include "layers/linear.h"
#include "layers/loss.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

fs::path g_root;

void write(const std::string& rel, const Bytes& bytes) {
  const fs::path p = g_root / rel;
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::printf("%s (%zu bytes)\n", p.c_str(), bytes.size());
}
void write(const std::string& rel, const std::string& text) { write(rel, Bytes(text.begin(), text.end())); }

Bytes read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// magic, then each size, big-endian uint32; then the payload 0, 1, 2, ...
Bytes idx(uint32_t magic, const std::vector<uint32_t>& dims, size_t payload) {
  Bytes out;
  auto put32 = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  for (size_t i = 0; i < payload; ++i) out.push_back(static_cast<uint8_t>(i * 7));
  return out;
}

// gzip with a fixed header (no name, no time), as deterministic as zlib makes it.
Bytes gzip(const Bytes& in) {
  z_stream z{};
  deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  Bytes out(deflateBound(&z, in.size()) + 32);
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(out.size() - z.avail_out);
  deflateEnd(&z);
  return out;
}

void idx_corpus() {
  const Bytes images = idx(0x803, {2, 3, 4}, 24), labels = idx(0x801, {5}, 5);
  write("idx/images_2x3x4", images);
  write("idx/labels_5", labels);
  write("idx/images_2x3x4.gz", gzip(images));
  write("idx/labels_5.gz", gzip(labels));
  write("idx/four_dims", idx(0x804, {1, 2, 2, 2}, 8));
  write("idx/zero_items", idx(0x803, {0, 28, 28}, 0));
  write("idx/zero_size", idx(0x803, {3, 0, 5}, 0));
  write("idx/short_payload", idx(0x803, {2, 3, 4}, 20));
  write("idx/trailing_byte", idx(0x801, {5}, 6));
  write("idx/huge_header", idx(0x803, {0xffffffff, 0xffffffff, 0xffffffff}, 16));
  write("idx/header_ends_early", Bytes(images.begin(), images.begin() + 10));
  write("idx/float_type", idx(0x0d01, {2}, 8));
  Bytes gz = gzip(images);
  gz.resize(gz.size() - 6);  // cut inside the CRC/length trailer
  write("idx/truncated.gz", gz);
}

std::vector<dpe::io::GeneratorState> fixed_rng() { return {{"cpu:0", 42, 1000}, {"cpu:1", 43, 0}}; }

// One Adam (or SGD) step on a fixed batch, so the optimizer has state to save.
void one_step(dpe::fuzz::TinyModel& model, dpe::optim::Optimizer& opt) {
  dpe::Generator gen(7);
  const dpe::Tensor x = dpe::randn({4, 3}, {}, &gen);
  const dpe::Tensor y = dpe::Tensor::from_vector(std::vector<int64_t>{0, 1, 1, 0}, {4});
  opt.zero_grad();
  dpe::nn::functional::cross_entropy(model.forward(x), y).backward();
  opt.step();
}

void checkpoint_corpus(const fs::path& tmp) {
  using namespace dpe;
  auto save = [&](const std::string& name, const nn::Module& model, const optim::Optimizer* opt,
                  const io::TrainingState& st) {
    const fs::path p = tmp / name;
    io::save_checkpoint(p.string(), model, opt, st);
    return read(p);
  };
  manual_seed(1);
  fuzz::TinyModel model;
  const Bytes model_only = save("model_only", model, nullptr, {.epoch = 1, .step = 10, .rng = fixed_rng()});
  write("checkpoint/model_only.safetensors", model_only);

  optim::Adam adam(model.parameters(), {.lr = 0.01});
  one_step(model, adam);
  const Bytes with_adam = save("adam", model, &adam,
                               {.epoch = 2, .step = 20, .rng = fixed_rng(), .metadata = {{"note", "seed"}}});
  write("checkpoint/with_adam.safetensors", with_adam);

  fuzz::TinyModel sgd_model;
  optim::SGD sgd(sgd_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  one_step(sgd_model, sgd);
  write("checkpoint/with_sgd.safetensors", save("sgd", sgd_model, &sgd, {.rng = fixed_rng()}));

  nn::Linear other(4, 2);  // keys and shapes that do not match the harness's model
  write("checkpoint/other_model.safetensors", save("other", other, nullptr, {.rng = fixed_rng()}));

  // Slightly invalid: truncated data, a header length past the end, a lying header length, an empty header.
  write("checkpoint/truncated.safetensors", Bytes(with_adam.begin(), with_adam.end() - 5));
  Bytes long_header = model_only;
  long_header[0] = 0xff;
  long_header[1] = 0xff;
  write("checkpoint/header_length_past_end.safetensors", long_header);
  Bytes short_header = model_only;
  short_header[0] = static_cast<uint8_t>(short_header[0] - 8);
  write("checkpoint/header_length_short.safetensors", short_header);
  std::string empty = std::string("\x08\0\0\0\0\0\0\0", 8) + "{}      ";
  write("checkpoint/empty_header.safetensors", empty);
}

void json_corpus() {
  write("json/object.json", R"({"a": [1, -2, 0], "b": {"c": true, "d": false, "e": null}, "": "x"})");
  write("json/strings.json", R"(["plain", "esc \" \\ \/ \b \f \n \r \t", "\u00e9\u20ac", "\ud83d\ude00", "\u0000"])");
  write("json/limits.json", "[9223372036854775807, -9223372036854775808, 0, -0]");
  write("json/nested.json", "[[[[[[[[[[[[[[[[{\"k\": [[[]]]}]]]]]]]]]]]]]]]]");
  write("json/header.json",
        R"({"fc.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"format":"pt"}})");
  write("json/bad_fraction.json", "[1.5]");
  write("json/duplicate_key.json", R"({"a": 1, "a": 2})");
  write("json/unterminated.json", R"({"a": "b)");
}

void device_list_corpus() {
  write("device_list/two_cpus", "cpu:0,cpu:1");
  write("device_list/cuda", "cuda:0,cuda:1,cuda:2");
  write("device_list/bare_kinds", "cpu,cuda");
  write("device_list/empty_entries", ",cpu:3,,cuda:1,");
  write("device_list/int_max", "cpu:2147483647");
  write("device_list/int_overflow", "cpu:2147483648");
  write("device_list/negative", "cpu:-1");
  write("device_list/unknown_kind", "gpu:0");
  write("device_list/spaces", " cpu:0, cpu:1");
  write("device_list/plus_sign", "cpu:+1");
  write("device_list/two_colons", "cpu:1:2");
}

// Byte 0 picks seq_len = 1 + b % 40 (b >= 200: max_bytes 64); the rest is the text (fuzz/text_corpus_fuzz.cc).
void text_corpus_corpus() {
  write("text_corpus/fortunes", std::string("\x0f") + "A fortune.\n%\nAnother one,\non two lines.\n%\n%\nLast\n");
  write("text_corpus/crlf", std::string("\x07") + "one\r\n%\r\ntwo\r\n%\r\n");
  write("text_corpus/one_record", std::string("\x01") + "no separator at all");
  write("text_corpus/only_separators", std::string("\x05") + "%\n%\n%");
  write("text_corpus/empty_text", std::string("\x03"));
  write("text_corpus/over_limit", std::string("\xc8") + std::string(70, 'x'));
  write("text_corpus/long_record", std::string("\x02") + std::string(100, 'y') + "\n%\nz");
}

// llm.c token shards (data/token_shards.h): a 1024-byte header of little-endian int32 (magic, version, count,
// then zeros), then `tokens` little-endian, `width` bytes each (2 for version 1, 4 for version 7).
Bytes token_shard(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens, int width) {
  Bytes out(1024, 0);
  const int32_t header[3] = {magic, version, count};
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(static_cast<uint32_t>(header[i]) >> (8 * b));
  for (uint32_t t : tokens)
    for (int b = 0; b < width; ++b) out.push_back(static_cast<uint8_t>(t >> (8 * b)));
  return out;
}

void token_shard_corpus() {
  constexpr int32_t kV1 = 20240520, kV7 = 20240801;
  // Documents separated by token 0 (the loader's BOS), GPT-2 ids up to 2^16 - 1.
  write("token_shard/v1_documents", token_shard(kV1, 1, 12, {0, 15496, 11, 995, 0, 464, 0, 1, 2, 3, 4, 65535}, 2));
  write("token_shard/v1_bytes_only", token_shard(kV1, 1, 9, {0, 72, 105, 0, 33, 200, 255, 0, 10}, 2));
  // Llama 3 ids: past 2^16, and around the vocabulary checks of 256 and 65537.
  write("token_shard/v7_tokens", token_shard(kV7, 7, 5, {0, 128000, 65535, 65536, 300}, 4));
  write("token_shard/empty", token_shard(kV1, 1, 0, {}, 2));
  // Slightly invalid: 10 tokens claimed, 3 present; one byte after the tokens; version 7 under the version 1
  // magic; a magic one below version 1's; a negative count; a header cut to 100 bytes.
  write("token_shard/count_past_end", token_shard(kV1, 1, 10, {1, 2, 3}, 2));
  Bytes trailing = token_shard(kV7, 7, 1, {7}, 4);
  trailing.push_back(0);
  write("token_shard/trailing_byte", trailing);
  write("token_shard/version_mismatch", token_shard(kV1, 7, 1, {1}, 2));
  write("token_shard/bad_magic", token_shard(kV1 - 1, 1, 0, {}, 2));
  write("token_shard/negative_count", token_shard(kV7, 7, -1, {}, 4));
  const Bytes header_only = token_shard(kV1, 1, 0, {}, 2);
  write("token_shard/short_header", Bytes(header_only.begin(), header_only.begin() + 100));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus OUTPUT_DIR (e.g. \"$PWD/fuzz/corpus\")\n");
    return 2;
  }
  g_root = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("dpe_make_corpus_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  idx_corpus();
  checkpoint_corpus(tmp);
  json_corpus();
  device_list_corpus();
  text_corpus_corpus();
  token_shard_corpus();
  fs::remove_all(tmp);
  return 0;
}
