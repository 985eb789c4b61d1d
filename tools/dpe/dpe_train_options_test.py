#!/usr/bin/env python3
"""Every option of `dpe train`, one by one, generated from the command's own help so that a new option is
covered without a line here (Note [A run's configuration], tools/dpe/run_configuration.h):

  across processes  two processes under mpirun, the second given another value of the option: dpe must refuse
                    at start-up, naming the option and both values, unless the option is one of those the
                    `--dist` help says may differ per process (then no such refusal may come);
  across a resume   a run resumed from a checkpoint with another value of the option: refused, naming the option
                    and both values, unless `--override` lists it (then what changed is printed) or the option
                    is one of those the `--override` help says may change anyway (then no refusal).

Another value is derived from the help line's type: a flag is given, a choice another member, an integer its
default + 1 (or its range's low end), a number twice its default, free text another string.

Usage: dpe_train_options_test.py DPE_BINARY WORKDIR
"""
import os
import re
import subprocess
import sys

# "  --name[,--alias] [TYPE[:CHECK][=DEFAULT]] [Needs: --other] ...help"
OPTION = re.compile(r"^  (?:-\w,)?(?P<name>--[\w-]+)(?:,--[\w-]+)*"
                    r"(?: (?P<type>[A-Z]+)(?::(?P<check>\{[^}]*\}|[\[(][^\])]*[\])]))?(?:=(?P<default>\S*))?)?"
                    r"(?P<rest>.*)$")
LIST = r"((?:--[\w-]+, )*--[\w-]+)"
WORK = "."  # main() sets the work directory


class Option:
    def __init__(self, match):
        self.name, self.type, self.check, self.default = match["name"], match["type"], match["check"], match["default"]
        needs = re.search(r"Needs: (--[\w-]+)", match["rest"] or "")
        self.needs = [needs[1]] if needs else []


def options_of(help_text):
    options, lines = [], help_text.splitlines()
    for i, line in enumerate(lines):
        match = OPTION.match(line)
        if match and match["name"] != "--help":
            option = Option(match)
            # The help text is on this line or the next one (a long first column).
            option.help = line + (lines[i + 1] if i + 1 < len(lines) else "")
            options.append(option)
    return options


def bound(text):
    text = text.strip()
    if "^" in text:
        base, rest = text.split("^")
        power = rest.split("-")
        return int(base) ** int(power[0]) - (int(power[1]) if len(power) > 1 else 0)
    return float(text) if text in ("inf", "-inf") else int(text)


def other_value(option, current):
    """The option's arguments with a value other than `current` (its value in the base command, else its
    default) and, for a choice, other than its default too where there is a third member."""
    current = option.default if current is None else current
    if option.type is None:
        return [option.name]  # a flag
    if option.check and option.check.startswith("{"):
        choices = [c for c in option.check[1:-1].split(",") if c != current]
        return [option.name, next((c for c in choices if c != option.default), choices[0])]
    if option.type == "INT":
        low, high = (bound(b) for b in option.check[1:-1].split(","))
        number = int(current) if current and re.fullmatch(r"-?\d+", current) else None
        value = number + 1 if number is not None and low <= number + 1 <= high else low
        if value == number:
            value = number - 1
        return [option.name, str(value)]
    if option.type == "FLOAT":
        number = float(current or 0)
        return [option.name, repr(number * 2 if number > 0 else 1.0)]
    if option.name == "--override":
        return [option.name, "lr"]
    return [option.name, os.path.join(WORK, "another_" + option.name.strip("-"))]  # paths land in the work dir


def command(base, option, value):
    """`base` ({name: value, None for a flag}) with `option` set to `value` (other_value's arguments)."""
    args = []
    for name, given in base.items():
        if name != option.name:
            args += [name] + ([] if given is None else [given])
    return args + [n for n in option.needs if n not in base] + value


def listed(help_text, pattern):
    match = re.search(pattern + LIST, help_text)
    if not match:
        sys.exit(f"the help does not say which options {pattern!r}")
    return set(match[1].split(", "))


def run(command, env, timeout=120):
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              timeout=timeout)
        return done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        return 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")


def main():
    global WORK
    dpe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    WORK = work
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DPE_NUM_CPU_DEVICES="2")
    help_text = subprocess.run([dpe, "train", "--help"], stdout=subprocess.PIPE, text=True, check=True).stdout
    options = options_of(help_text)
    per_process = listed(help_text, "must be the same on every process but ")
    on_resume = listed(help_text, "these may change without it: ")
    names = {o.name for o in options}
    failures = []
    if len(options) < 40:
        failures.append(f"only {len(options)} options read from the help: is its format still the one parsed here?")
    for name in sorted((per_process | on_resume) - names):
        failures.append(f"{name} is listed as one that may differ, but dpe train has no such option")

    # Across processes: the first process keeps the defaults, the second takes another value. Without data
    # (a directory that does not exist), an accepted difference fails later, on loading it.
    base = {"--dist": "mpi", "--model": "mlp", "--epochs": "1", "--batch-size": "32",
            "--data-dir": os.path.join(work, "no_data")}
    checked = 0
    for option in options:
        value = other_value(option, base.get(option.name))
        first = [dpe, "train"] + command(base, option, [])
        if option.name in base:
            first += [option.name, base[option.name]]
        second = [dpe, "train"] + command(base, option, value)
        status, output = run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "1"] + first +
                             [":", "-np", "1"] + second, env)
        refusal = f"--dist: the processes were launched with different options; {option.name}: rank 0 has "
        if option.name in per_process:
            if "launched with different options" in output or status == 124:
                failures.append(f"{' '.join(value)} on one process (may differ) was refused or hung "
                                f"(status {status}):\n{output[-800:]}")
        elif status == 0 or refusal not in output or ", rank 1 has '" not in output:
            failures.append(f"{' '.join(value)} on one process only: expected the refusal '{refusal}...', got "
                            f"status {status}:\n{output[-800:]}")
        checked += 1

    # Across a resume: a checkpoint of a short run (one per set of options another one needs), then each
    # option changed on --resume.
    base = {"--model": "mlp", "--epochs": "1", "--limit": "64", "--batch-size": "32"}
    checkpoints = {}
    for option in options:
        needs = tuple(n for n in option.needs if n not in base)
        if needs not in checkpoints:
            checkpoints[needs] = os.path.join(work, f"resume_me{len(checkpoints)}.safetensors")
            given = command(base, option, [])
            if option.name in base:
                given += [option.name, base[option.name]]
            status, output = run([dpe, "train"] + given + ["--save-every", "1", "--checkpoint", checkpoints[needs]], env)
            if status != 0:
                sys.exit(f"the run to resume failed (status {status}):\n{output[-2000:]}")
        value = other_value(option, base.get(option.name))
        resumed = [dpe, "train"] + command(base, option, value) + ["--resume", checkpoints[needs]]
        status, output = run(resumed, env)
        refusal = f"{option.name} was "
        if option.name in on_resume:
            if "in the checkpoint's run and is" in output:
                failures.append(f"--resume with {' '.join(value)} (may change) was refused:\n{output[-800:]}")
            continue
        if status != 2 or refusal not in output or "in the checkpoint's run and is" not in output:
            failures.append(f"--resume with {' '.join(value)}: expected exit 2 and '{refusal}... in the checkpoint's "
                            f"run', got status {status}:\n{output[-800:]}")
        status, output = run(resumed + ["--override", option.name[2:]], env)
        if f"{option.name} changed from " not in output or "in the checkpoint's run and is" in output:
            failures.append(f"--resume with {' '.join(value)} --override {option.name[2:]}: expected "
                            f"'{option.name} changed from', got status {status}:\n{output[-800:]}")
        checked += 1

    print(f"{len(options)} options of dpe train; {len(per_process)} may differ per process, {len(on_resume)} may "
          f"change on resume; {checked} checks")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
