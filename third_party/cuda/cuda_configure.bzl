"""Detects the CUDA toolkit and exposes it as @local_cuda.

Generates:
  @local_cuda//:defs.bzl   HAS_CUDA (bool), NVCC (absolute path or "")
  @local_cuda//:cuda       cc_library: headers + cudart, cuBLAS, cuDNN, NCCL (empty when HAS_CUDA is False)

The toolkit is looked up at $DPE_CUDA_PATH, else /usr/local/cuda. Linking needs no GPU and no driver,
so CI (no GPU) still compiles and links the whole CUDA backend.
"""

_LIBS = ["cudart", "cublas", "cudnn", "nccl"]

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("DPE_CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    has_cuda = nvcc.exists
    if has_cuda:
        for lib in _LIBS:
            if not ctx.path(root + "/lib64/lib" + lib + ".so").exists:
                print("dpe: %s/lib64/lib%s.so missing; building without CUDA" % (root, lib))
                has_cuda = False
    ctx.file("defs.bzl", "HAS_CUDA = %s\nNVCC = %r\nCUDA_ROOT = %r\n" % (
        has_cuda,
        str(nvcc) if has_cuda else "",
        root if has_cuda else "",
    ))
    if has_cuda:
        ctx.symlink(root + "/include", "include")
        build = """
cc_library(
    name = "cuda",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64"] + ["-l" + l for l in {libs}],
    visibility = ["//visibility:public"],
)
""".format(root = root, libs = _LIBS)
    else:
        build = 'cc_library(name = "cuda", visibility = ["//visibility:public"])\n'
    ctx.file("BUILD", build)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["DPE_CUDA_PATH"],
    local = True,
)
