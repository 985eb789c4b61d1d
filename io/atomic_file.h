// Writing a file so that its readers see the old content or the new, never a torn one: checkpoints, token
// shards, a tokenizer's model.
//
// write_file_atomically(path, who, write): `write(fd, tmp)` writes the content into a fresh temporary
// `<path>.tmp.XXXXXX` beside `path`; it is then fsynced, closed and renamed over `path`, and the directory is
// fsynced (best effort: the new file is complete either way). Note [Checkpoint temporaries] in io/checkpoint.cc:
// a temporary of its own per write (6 random letters and digits, O_EXCL), so two writers of one path never share
// and tear one; created 0644 (the umask applies, as for a plain open; mkstemp's 0600 would hide the file in a
// shared directory); registered with io::TemporaryFileScope before it exists, so SIGINT, SIGTERM or SIGHUP
// during the write removes it and a write past `ulimit -f` fails with EFBIG instead of SIGXFSZ. On any failure
// (`write` throwing included) the temporary is removed, `path` is left as it was, and the error (dpe::Error)
// begins with `who` ("save_checkpoint: cannot create a temporary file ...", "...: fsync of <tmp> failed: ...").
// A temporary left by a writer that was killed outright (SIGKILL) is removed by the next write of the same path
// (Note [Temporaries of a killed writer] in io/atomic_file.cc).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace dpe::io {

void write_file_atomically(const std::string& path, const std::string& who,
                           const std::function<void(int fd, const std::string& tmp)>& write);

// write(2) until all `n` bytes of `data` are written (EINTR retried); returns 0, or the errno of the failure
// (EIO for a write that wrote nothing) with *written the bytes written before it.
int write_fully(int fd, const void* data, size_t n, size_t* written);

}  // namespace dpe::io
