#!/usr/bin/env python3
"""A chaos soak: a dpe train job interrupted K times, restarted from its newest checkpoint each time, must end
with the uninterrupted run's checkpoint, byte for byte.

Usage: chaos.py DPE_BINARY [--faults K] [--seed S] [--mpi] [--timeout SECONDS] [--workdir DIR] [--no-disk-faults]

The job: the MLP on a slice of Fashion-MNIST, DDP, a checkpoint after every epoch (enough epochs that K faults
fall inside it). First the uninterrupted run; then the same job under faults, each at a random moment (seeded),
every kind once before kinds repeat:
  kill      SIGKILL of the job (with --mpi: of one rank, chosen at random);
  stop      SIGSTOP of one rank (--mpi only): its partner must fail within --timeout, naming it;
  device    a device failure through the tool's fault injection (--inject-failure cpu:1@STEP, a random step);
  disk      the checkpoint's file system filled up (the job's next save fails with ENOSPC, naming the file; the
            previous checkpoint stays whole), then freed again before the restart, as an operator would. The
            checkpoints live on a small tmpfs of their own, mounted under the work directory for the soak (root);
            --no-disk-faults leaves this kind out where nothing can be mounted.
After each fault the job is restarted with --resume from its newest complete checkpoint (the first attempt, or a
fault before the first checkpoint, starts afresh), as tools/reliability/supervise.py does. Each interruption
must end within --timeout plus 20 s and say what failed (with --mpi, the rank that was killed or stopped; the
device a failure was injected into; the checkpoint that could not be written, and ENOSPC), and no `*.tmp.*`
temporary may remain at the end. Prints the faults injected (by kind) and survived, restarts, seconds lost (time
in attempts that failed) and bytes lost (bytes of the final checkpoint that differ from the uninterrupted run's:
must be 0); exits 1 when anything failed.
"""
import argparse
import errno
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time


def child_ranks(mpirun_pid, binary):
    """The pids of the dpe processes mpirun started (its descendants running `binary`)."""
    ranks = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            exe = os.readlink(entry / "exe")
        except (OSError, ValueError, IndexError):
            continue
        if os.path.basename(exe) == os.path.basename(binary) and (parent == mpirun_pid or is_descendant(parent, mpirun_pid)):
            ranks.append(int(entry.name))
    return sorted(ranks)


def mpi_rank(pid):
    """The MPI rank of process `pid` (Open MPI's OMPI_COMM_WORLD_RANK), or None."""
    try:
        for entry in (pathlib.Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0"):
            if entry.startswith(b"OMPI_COMM_WORLD_RANK="):
                return int(entry.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def is_descendant(pid, ancestor):
    for _ in range(8):
        if pid <= 1:
            return False
        if pid == ancestor:
            return True
        try:
            pid = int((pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def mount_small_disk(path):
    """A 32 MiB tmpfs at `path` (a few checkpoints of the MLP, 5.4 MB each): what a full disk fills."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(path)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"chaos: the full-disk fault needs a file system of its own, and mounting a tmpfs at {path} failed "
                 f"({done.stdout.strip()}); run as root, or pass --no-disk-faults")


def fill(disk):
    """Writes disk/filler until the file system is full."""
    chunk = b"\0" * (1 << 20)
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def job(args, checkpoint, epochs):
    common = ["train", "--model", "mlp", "--mode", "ddp", "--limit", "1024", "--batch-size", "64", "--seed", "7",
              "--epochs", str(epochs), "--save-every", "1", "--checkpoint", str(checkpoint),
              "--timeout", str(args.timeout)]
    if args.mpi:
        return ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", args.dpe] + common + [
            "--dist", "mpi", "--device-ids", "cpu:0"]
    return [args.dpe] + common + ["--cpu-devices", "2"]


class Attempt:
    """A job's process with its output collected by a thread; `training` is set once a progress line shows that
    the steps have begun (a rank stopped before then may be inside MPI_Init, which has no timeout: Open MPI's
    start-up, not dpe's, would hang)."""

    def __init__(self, command, env):
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = []
        self.training = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("epoch "):
                self.training.set()
        self.training.set()  # ended: nothing more to wait for

    def wait(self):
        self.process.wait()
        self.reader.join()
        return "".join(self.lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dpe")
    parser.add_argument("--faults", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mpi", action="store_true")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--workdir")
    parser.add_argument("--no-disk-faults", action="store_true")
    args = parser.parse_args()
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="dpe_chaos_"))
    work.mkdir(parents=True, exist_ok=True)
    disk = work if args.no_disk_faults else work / "disk"
    if not args.no_disk_faults:
        mount_small_disk(disk)
    try:
        return soak(args, work, disk)
    finally:
        if not args.no_disk_faults:
            subprocess.run(["umount", str(disk)])


def soak(args, work, disk):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rng = random.Random(args.seed)
    epochs = 2 + args.faults  # each fault costs at most the epoch it hits
    kinds = ["kill", "device"] + (["stop"] if args.mpi else []) + ([] if args.no_disk_faults else ["disk"])

    reference = work / "uninterrupted.safetensors"
    started = time.monotonic()
    done = subprocess.run(job(args, reference, epochs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    if done.returncode != 0:
        sys.exit(f"chaos: the uninterrupted run failed (exit {done.returncode}):\n{done.stdout[-2000:]}")
    run_seconds = time.monotonic() - started

    checkpoint = disk / "chaos.safetensors"
    failures, injected, survived, restarts, lost = [], 0, 0, 0, 0.0
    kinds_used = {}  # kind -> faults of that kind injected
    # Every kind once (in a random order) when there are enough faults, then kinds at random.
    schedule = rng.sample(kinds, len(kinds)) + [rng.choice(kinds) for _ in range(max(0, args.faults - len(kinds)))]
    while True:
        command = job(args, checkpoint, epochs)
        if checkpoint.exists():
            command += ["--resume", str(checkpoint)]
        kind = schedule[injected] if injected < args.faults else None
        if kind == "device":
            command += ["--inject-failure", f"cpu:{0 if args.mpi else 1}@{rng.randrange(2, 30)}"]
        attempt_start = time.monotonic()
        attempt = Attempt(command, env)
        process = attempt.process
        fault_at = None
        named = []  # what the job's output must say for this fault: the rank, the device or the file that failed
        if kind == "device":
            named = [f"failure injected by --inject-failure on cpu:{0 if args.mpi else 1}"]
        if kind == "disk":
            named = ["No space left on device", str(checkpoint)]
        if kind in ("kill", "stop", "disk"):
            attempt.training.wait(timeout=60)
            time.sleep(rng.uniform(0.0, max(0.1, run_seconds / (args.faults + 2))))
            if process.poll() is None and kind == "disk":
                fill(disk)
                fault_at = time.monotonic()
            elif process.poll() is None:
                if args.mpi:
                    ranks = child_ranks(process.pid, args.dpe)
                    victim = rng.choice(ranks) if ranks else process.pid
                    rank = mpi_rank(victim)
                    # SIGSTOP: dpe's partner names it ("rank 1 stopped answering"); SIGKILL: mpirun does
                    # ("process rank 1 ... exited on signal 9").
                    named = [f"rank {rank}"] if rank is not None else []
                else:
                    victim = process.pid
                os.kill(victim, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
                fault_at = time.monotonic()
        output = attempt.wait()
        seconds = time.monotonic() - attempt_start
        if kind == "disk":
            (disk / "filler").unlink(missing_ok=True)  # space freed before the restart
        if kind is not None and (process.returncode != 0):
            injected += 1
            kinds_used[kind] = kinds_used.get(kind, 0) + 1
            ended = time.monotonic() - (fault_at or attempt_start)
            if fault_at is not None and ended > args.timeout + 20:
                failures.append(f"{kind}: the job took {ended:.1f} s to end after the fault (timeout {args.timeout} s)")
            elif any(n not in output for n in named):
                failures.append(f"{kind}: the job's messages do not name what failed ({named}):\n{output[-1500:]}")
            else:
                survived += 1
            restarts += 1
            lost += seconds
            continue
        if process.returncode != 0:
            failures.append(f"an attempt without a fault failed (exit {process.returncode}):\n{output[-1500:]}")
        break  # the job finished (a fault that came too late is not counted)

    # A process killed with SIGKILL while it saved cannot remove its temporary (no handler runs); any other end
    # removes it (io/temp_file.h), and a later save removes a killed writer's once it is 10 s old (Note
    # [Temporaries of a killed writer], io/atomic_file.cc), which a short job may not reach. So a temporary is a
    # failure unless a SIGKILL could have left it.
    temporaries = [p.name for p in disk.iterdir() if ".tmp." in p.name]
    if temporaries and "kill" not in kinds_used:
        failures.append(f"temporaries left behind: {temporaries}")
    bytes_lost = 0
    if checkpoint.exists():
        a, b = reference.read_bytes(), checkpoint.read_bytes()
        bytes_lost = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
    else:
        failures.append("no final checkpoint")
    if bytes_lost:
        failures.append(f"the final checkpoint differs from the uninterrupted run's in {bytes_lost} bytes")
    by_kind = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds_used.items()))
    print(f"chaos{' (mpirun -np 2)' if args.mpi else ''}: {injected} faults injected ({by_kind}), {survived} survived, "
          f"{restarts} restarts, {lost:.1f} s lost, {bytes_lost} bytes lost"
          + (f", {len(temporaries)} temporaries left by SIGKILL during a save" if temporaries else ""))
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
