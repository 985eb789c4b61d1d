#!/usr/bin/env python3
"""Restarts a failed `dpe train` job from its newest complete checkpoint, as torchrun's --max-restarts does.

Usage: supervise.py [--max-restarts K] -- COMMAND...

COMMAND is a dpe train command line that writes checkpoints (`--save-every N --checkpoint PATH`, PATH given
explicitly), e.g. `mpirun -np 2 dpe train --dist mpi ...` or `dpe train ...`. It runs as an argument vector
(no shell). When it exits with a status other than 0, the supervisor waits for nothing and restarts it, at most
K times (default 3), from PATH when PATH exists: COMMAND with `--resume PATH` (replacing a `--resume` it had).
A checkpoint is complete whenever it exists: dpe writes a temporary and renames it over PATH (docs/RELIABILITY.md,
"Atomic checkpoints"), so a job killed while saving leaves the previous one. A resumed run keeps its
configuration (Note [A run's configuration]): the options stay the same, only --resume is added.

Prints one line per restart ("supervise: restart 1 of 3 after exit status 2 in 4.1 s, from PATH") and a last
line with the attempts and the seconds spent in failed ones; exits with the last attempt's status (0 once one
succeeded). SIGINT or SIGTERM to the supervisor goes to the running attempt too, and ends both without a restart.
"""
import os
import signal
import subprocess
import sys
import time


def usage(message):
    sys.exit(f"supervise: {message}\nusage: supervise.py [--max-restarts K] -- COMMAND...")


def parse(argv):
    max_restarts = 3
    args = list(argv)
    while args and args[0] != "--":
        if args[0] == "--max-restarts" and len(args) > 1:
            try:
                max_restarts = int(args[1])
            except ValueError:
                usage(f"--max-restarts {args[1]!r}: expected an integer in [0, 1000]")
            if not 0 <= max_restarts <= 1000:
                usage(f"--max-restarts {max_restarts}: expected an integer in [0, 1000]")
            args = args[2:]
        else:
            usage(f"unknown option {args[0]!r}")
    if len(args) < 2:
        usage("no command after --")
    return max_restarts, args[1:]


def checkpoint_of(command):
    """The --checkpoint PATH of a dpe train command line (also --checkpoint=PATH)."""
    path = None
    for i, arg in enumerate(command):
        if arg == "--checkpoint" and i + 1 < len(command):
            path = command[i + 1]
        elif arg.startswith("--checkpoint="):
            path = arg.split("=", 1)[1]
    saves = any(arg == "--save-every" or arg.startswith("--save-every=") for arg in command)
    if path is None or not saves:
        usage("the command must write checkpoints: --save-every N --checkpoint PATH")
    return path


def with_resume(command, path):
    """command with --resume PATH, in place of any --resume it had."""
    out, skip = [], False
    for arg in command:
        if skip:
            skip = False
            continue
        if arg == "--resume":
            skip = True
            continue
        if arg.startswith("--resume="):
            continue
        out.append(arg)
    return out + ["--resume", path]


def main():
    max_restarts, command = parse(sys.argv[1:])
    checkpoint = checkpoint_of(command)
    attempt, lost = 0, 0.0
    interrupted, running = [], []

    def stop(number, frame):  # the running attempt gets the signal too, and nothing restarts
        interrupted.append(number)
        for process in running:
            process.send_signal(number)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    while True:
        started = time.monotonic()
        try:
            process = subprocess.Popen(command)
        except OSError as e:
            sys.exit(f"supervise: cannot run {command[0]!r}: {e.strerror}")
        running[:] = [process]
        while True:
            try:
                status = process.wait()
                break
            except InterruptedError:
                continue
        seconds = time.monotonic() - started
        if status == 0 or interrupted:
            break
        lost += seconds
        if attempt == max_restarts:
            print(f"supervise: exit status {status} after {attempt} restart(s); giving up (--max-restarts "
                  f"{max_restarts})", file=sys.stderr, flush=True)
            break
        attempt += 1
        if os.path.exists(checkpoint):
            command = with_resume(command, checkpoint)
            where = f"from {checkpoint}"
        else:
            where = "from the start (no checkpoint yet)"
        print(f"supervise: restart {attempt} of {max_restarts} after exit status {status} in {seconds:.1f} s, "
              f"{where}", file=sys.stderr, flush=True)
    print(f"supervise: {attempt + 1} attempt(s), {attempt} restart(s), {lost:.1f} s in failed attempts, "
          f"exit status {status}", file=sys.stderr, flush=True)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
