"""dpe_fuzz_test: a fuzz harness (fuzz/<corpus>_fuzz.cc) as a test (docs/FUZZING.md)."""

load("//tools/build:defs.bzl", "DPE_COPTS")

def dpe_fuzz_test(name, deps, seconds = 2):
    """`name`.cc linked with the fuzz driver; the test runs the seed corpus, then `seconds` of mutations.

    The corpus is corpus/<name without _fuzz>/ and the dictionary dicts/<same>.dict. More time:
    `bazel test //fuzz:<name> --test_arg=--seconds=30` (the last --seconds wins), or `bazel run` with the
    driver's options after `--`.
    """
    corpus = name[:-len("_fuzz")]
    native.cc_test(
        name = name,
        srcs = [name + ".cc"],
        copts = DPE_COPTS,
        args = [
            "--seconds=%d" % seconds,
            "--dict=$(location dicts/%s.dict)" % corpus,
            "fuzz/corpus/" + corpus,
        ],
        data = native.glob(["corpus/%s/**" % corpus]) + ["dicts/%s.dict" % corpus],
        # 2 s of mutations by default; CI's 30 s under ASan needs more than "short"'s 60 s with room to spare.
        timeout = "moderate",
        deps = deps + [":fuzz_driver"],
    )
