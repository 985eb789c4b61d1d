"""Counts test cases in Bazel's gtest XML reports and prints "N passed, N failed, N skipped".

Usage: test_summary.py TESTLOGS_DIR BAZEL_EXIT_STATUS TARGETS_FILE. TARGETS_FILE lists the test targets
(tools/test.sh: `bazel query 'tests(//...)'` less the manual ones); only their reports are read. Exits non-zero
when anything failed, including a test binary that crashed before writing its report (Bazel's exit status says
so), or a target without one.
"""
import pathlib
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    logs = pathlib.Path(sys.argv[1]).resolve()
    bazel_status = int(sys.argv[2])
    targets = [t.strip() for t in pathlib.Path(sys.argv[3]).read_text().splitlines() if t.strip()]
    passed = failed = skipped = 0
    failures = []
    reports = []
    for target in targets:  # //pkg/sub:name -> TESTLOGS/pkg/sub/name/test.xml
        package, name = target[2:].split(":")
        report = logs / package / name / "test.xml"
        if report.exists():
            reports.append(report)
        else:
            failed += 1
            failures.append(f"{target}: no test report")
    for report in reports:
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError:
            failed += 1
            failures.append(f"{report}: unreadable report")
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname')}.{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
                failures.append(name)
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
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
