"""dpe's build macros: the only place compiler flags and the CUDA switch live."""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC")

DPE_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",  # options structs are built with designated initializers
]

# sm_80 (A100), sm_90 (H100/H200) SASS, plus compute_90 PTX for newer GPUs.
_NVCC_ARCH = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_enabled(if_true, if_false = []):
    """`if_true` when this build compiles the CUDA backend, else `if_false`.

    CUDA is on when the toolkit is present, unless `--config=cpu_only` (--define=dpe_cuda=off).
    """
    if not HAS_CUDA:
        return if_false
    return select({
        "//tools/build:cuda_disabled": if_false,
        "//conditions:default": if_true,
    })

def dpe_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = DPE_COPTS + copts, **kwargs)

def dpe_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = DPE_COPTS + copts, **kwargs)

# The instruction-set caps an ISA-sensitive test runs under besides its uncapped run (Note [The CPU
# instruction-set cap], core/cpu_isa.h): with the native run, AVX2, AVX-512 without bfloat16 and the CPU's own.
ISA_CAPS = ["avx2", "avx512"]

def dpe_isa_capped_tests(test, args = [], data = [], size = None, tags = []):
    """`test` (a test target of this package, with its `args` and `data`) again under each of ISA_CAPS.

    The targets are named `<test>_isa_<cap>`; tools/build/isa_capped_test.sh sets the cap, or reports the run
    skipped where the CPU lacks the cap's instructions. tools/test.sh lists each cap's results.
    """
    for cap in ISA_CAPS:
        native.sh_test(
            name = test + "_isa_" + cap,
            srcs = ["//tools/build:isa_capped_test.sh"],
            args = [cap, "$(location :" + test + ")"] + args,
            data = [":" + test] + data,
            size = size,
            tags = tags,
        )

def dpe_sh_test(name, args = [], data = [], size = None, tags = [], isa_caps = False):
    """The shell test `<name>.sh` with its `args` and `data`; `isa_caps`: also run under each of ISA_CAPS."""
    native.sh_test(name = name, srcs = [name + ".sh"], args = args, data = data, size = size, tags = tags)
    if isa_caps:
        dpe_isa_capped_tests(name, args = args, data = data, size = size, tags = tags)

def dpe_cc_test(name, copts = [], deps = [], tags = [], isa_caps = False, **kwargs):
    """A gtest test with dpe's flags and test main; `isa_caps`: also run under each of ISA_CAPS."""
    native.cc_test(
        name = name,
        copts = DPE_COPTS + copts,
        deps = deps + ["@gtest//:gtest", "//tests/testing:helpers", "//tests/testing:test_main"],
        tags = tags,
        **kwargs
    )
    if isa_caps:
        dpe_isa_capped_tests(name, args = kwargs.get("args", []), size = kwargs.get("size"), tags = tags)

def dpe_cuda_library(name, srcs, hdrs = [], nvcc_inputs = [], deps = [], **kwargs):
    """Compiles `srcs` (.cu) with nvcc into a cc_library.

    nvcc runs in a genrule, so every header a .cu includes must be listed in `hdrs` or
    `nvcc_inputs` (filegroups of headers). Without the toolkit the library is empty.
    """
    objs = []
    if HAS_CUDA:
        for src in srcs:
            obj = src.replace("/", "_").replace(".cu", ".pic.o")
            native.genrule(
                name = name + "_" + obj.replace(".", "_"),
                srcs = [src] + hdrs + nvcc_inputs,
                outs = [obj],
                cmd = " ".join([
                    NVCC,
                    "-std=c++20 -O3 --expt-relaxed-constexpr -Xcompiler=-fPIC,-Wall",
                    "-DDPE_WITH_CUDA=1",
                    "-I. -I$(GENDIR)",
                ] + _NVCC_ARCH + ["-c $(location " + src + ") -o $@"]),
                message = "nvcc " + src,
            )
            objs.append(obj)
    native.cc_library(
        name = name,
        srcs = cuda_enabled(objs),
        hdrs = hdrs,
        deps = deps + cuda_enabled(["@local_cuda//:cuda"]),
        **kwargs
    )
