"""The external repositories dpe's BUILD files name, declared in one place.

Bazel's WORKSPACE is not transitive: a workspace that builds dpe's targets must declare every repository they
refer to. dpe's own WORKSPACE and any workspace that uses dpe both do it by calling dpe_dependencies():

    local_repository(name = "dpe", path = "/path/to/dpe")
    load("@dpe//:deps.bzl", "dpe_dependencies")
    dpe_dependencies()

Everything stays local: system libraries from Debian packages (tools/setup.sh), offline stand-ins for what
Bazel 4 would otherwise download, and the CUDA toolkit if /usr/local/cuda (or $DPE_CUDA_PATH) has one.
A repository the calling workspace declared before the call is kept, so an application can substitute its
own (for instance its own googletest).
"""

load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

def _vendored_repository_impl(ctx):
    # local_repository's relative paths are relative to the main workspace, which is dpe's root only in dpe's
    # own build; a label finds dpe's third_party/ from whichever workspace loads this file.
    src = ctx.path(Label("//third_party:BUILD")).dirname.get_child(ctx.attr.dir)
    if not src.exists:
        fail("dpe: %s is missing" % src)
    for child in src.readdir():
        ctx.symlink(child, child.basename)

# One of dpe's offline stand-ins (third_party/<dir>, a directory with its own WORKSPACE) as a repository.
_vendored_repository = repository_rule(
    implementation = _vendored_repository_impl,
    attrs = {"dir": attr.string(mandatory = True)},
    local = True,
)

def _maybe(repo_rule, name, **kwargs):
    if not native.existing_rule(name):
        repo_rule(name = name, **kwargs)

# Repository name -> (the Debian package's directory, the BUILD file in third_party/ that describes it).
_SYSTEM_LIBRARIES = {
    "gtest": ("/usr", "gtest.BUILD"),
    "benchmark": ("/usr", "benchmark.BUILD"),
    "tbb": ("/usr", "tbb.BUILD"),
    "dnnl": ("/usr", "dnnl.BUILD"),
    "openblas": ("/usr", "openblas.BUILD"),
    "zlib": ("/usr", "zlib.BUILD"),
    "cli11": ("/usr", "cli11.BUILD"),
    "nlohmann_json": ("/usr", "nlohmann_json.BUILD"),
    "sentencepiece": ("/usr", "sentencepiece.BUILD"),
    "mpi": ("/usr/lib/x86_64-linux-gnu/openmpi", "mpi.BUILD"),
}

def dpe_dependencies():
    """Declares the repositories dpe needs, skipping any the calling WORKSPACE already declared."""

    # Bazel 4's built-in WORKSPACE suffix would download rules_cc, rules_java and remote_coverage_tools;
    # declaring them first stops that (see docs/BUILD_OFFLINE.md).
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        _maybe(_vendored_repository, name, dir = name)
    _maybe(native.local_repository, "platforms", path = "/usr/share/bazel/tools/platforms")

    # new_local_repository's build_file is a string resolved in the main workspace: str(Label(...)) names
    # dpe's file as @dpe//third_party:... there, and as //third_party:... in dpe's own build.
    for name, (path, build_file) in _SYSTEM_LIBRARIES.items():
        _maybe(
            native.new_local_repository,
            name,
            path = path,
            build_file = str(Label("//third_party:" + build_file)),
        )

    # The CUDA toolkit if present, otherwise a CPU-only build (tools/build/defs.bzl reads @local_cuda).
    _maybe(cuda_configure, "local_cuda")
