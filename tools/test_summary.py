"""Counts test cases in Bazel's gtest XML reports and prints "N passed, N failed, N skipped".

Usage: test_summary.py TESTLOGS_DIR BAZEL_EXIT_STATUS TARGETS_FILE. TARGETS_FILE lists the test targets
(tools/test.sh: `bazel query 'tests(//...)'` less the manual ones); only their reports are read. Exits non-zero
when anything failed, including a test binary that crashed before writing its report (Bazel's exit status says
so), or a target without one. Before the total, a line per instruction-set cap: the targets named
`<test>_isa_<cap>` (dpe_isa_capped_tests, tools/build/defs.bzl) are that cap's run, the others the native one.
"""
import collections
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

CAP_SUFFIX = re.compile(r"_isa_(avx2|avx512|avx512_bf16)$")  # ISA_CAPS, tools/build/defs.bzl


def native_isa() -> str:
    """This CPU's instruction set as dpe names it (core/cpu_isa.h's native_cpu_isa, from /proc/cpuinfo)."""
    try:
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    except OSError:
        return "unknown"
    if not {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
        return "avx2"
    return "avx512_bf16" if "avx512_bf16" in flags else "avx512"


def cap_of(target: str) -> str:
    match = CAP_SUFFIX.search(target)
    return match.group(1) if match else "native"


def main() -> int:
    logs = pathlib.Path(sys.argv[1]).resolve()
    bazel_status = int(sys.argv[2])
    targets = [t.strip() for t in pathlib.Path(sys.argv[3]).read_text().splitlines() if t.strip()]
    counts = collections.defaultdict(lambda: collections.Counter())  # cap -> passed/failed/skipped/targets
    failures = []
    for target in targets:  # //pkg/sub:name -> TESTLOGS/pkg/sub/name/test.xml
        cap = counts[cap_of(target)]
        cap["targets"] += 1
        package, name = target[2:].split(":")
        report = logs / package / name / "test.xml"
        if not report.exists():
            cap["failed"] += 1
            failures.append(f"{target}: no test report")
            continue
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError:
            cap["failed"] += 1
            failures.append(f"{report}: unreadable report")
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname')}.{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                cap["failed"] += 1
                failures.append(f"{name} ({target})")
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                cap["skipped"] += 1
            else:
                cap["passed"] += 1
    for name, cap in sorted(counts.items(), key=lambda item: item[0] != "native"):
        what = f"this CPU's {native_isa()}" if name == "native" else "DPE_MAX_CPU_ISA=" + name
        print(f"instruction set {name} ({what}, {cap['targets']} targets): "
              f"{cap['passed']} passed, {cap['failed']} failed, {cap['skipped']} skipped")
    passed, failed, skipped = (sum(cap[k] for cap in counts.values()) for k in ("passed", "failed", "skipped"))
    # Bazel status 3 = some tests failed; 1 = build failure. Either way something did not pass.
    if bazel_status != 0 and failed == 0:
        failed = 1
        failures.append(f"bazel test exited with status {bazel_status} (build failure or crashed test)")
    for name in failures[:50]:
        print(f"FAILED: {name}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
