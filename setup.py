"""Build script for the transformer_engine_cpp extension (``transformer_engine_cpp._C``).

The extension holds every ``torch.ops.te_cpp.*`` operator, built against the torch already
installed: ``make build`` (``setup.py build_ext --inplace``, then an editable install of the tree,
``pip install --no-build-isolation --no-deps -e .``), or ``pip install --no-build-isolation .`` /
``pip wheel --no-build-isolation .``. Every route compiles in the same ``build/temp.*`` folder with
ninja, so a rebuild compiles only the sources changed since (headers included).

Environment variables:
  TECPP_WITH_CUDA=0|1      force the CUDA kernels off/on (default: on when torch has CUDA and
                           nvcc is found).
  TECPP_CPU_CAPABILITY=... AVX512 | AVX2 | DEFAULT: the at::vec instruction set the CPU
                           kernels are compiled for (default: the best this machine has).
  TECPP_DEBUG=1            -O0 -g build.
  MAX_JOBS                 parallel compile jobs (ninja).
"""

import glob
import os
import re
import subprocess
import sys
import sysconfig

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cpu_flags():
    """Pick the at::vec ISA for the CPU kernels (they are built on the machine that runs them)."""
    choice = os.environ.get("TECPP_CPU_CAPABILITY", "").upper()
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        flags = set()
    if not choice:
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags:
            choice = "AVX512"
        elif {"avx2", "fma", "f16c"} <= flags:
            choice = "AVX2"
        else:
            choice = "DEFAULT"
    if choice == "AVX512":
        # AVX512_BF16 (vcvtneps2bf16: one instruction per fp32 -> bf16 vector store) when this
        # CPU has it; TECPP_AVX512_BF16=0/1 overrides the detection
        bf16 = os.environ.get("TECPP_AVX512_BF16")
        use_bf16 = "avx512_bf16" in flags if bf16 is None else bf16.strip() == "1"
        return (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"]
                + (["-mavx512bf16"] if use_bf16 else [])
                + ["-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"])
    if choice == "AVX2":
        return ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]
    if choice == "DEFAULT":
        return ["-DCPU_CAPABILITY=DEFAULT"]
    raise ValueError(f"TECPP_CPU_CAPABILITY={choice!r}: expected AVX512, AVX2 or DEFAULT")


def _with_cuda():
    forced = os.environ.get("TECPP_WITH_CUDA")
    if forced is not None:
        return forced.strip() not in ("0", "", "false", "False")
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _cublaslt():
    """Include directories and link arguments for cuBLASLt.

    pip's CUDA 13 builds of torch bring cuBLASLt in the nvidia/cu13 package beside torch
    (site-packages/nvidia/cu13/{include,lib}), where the library has only its versioned name
    (libcublasLt.so.13): it is linked by that name. Otherwise (a full CUDA toolkit) cuBLASLt is
    in CUDA_HOME's include and lib folders, which CUDAExtension already searches.
    """
    import torch

    cu13 = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu13")
    if os.path.exists(os.path.join(cu13, "include", "cublasLt.h")):
        lib = os.path.join(cu13, "lib")
        return [os.path.join(cu13, "include")], [f"-L{lib}", "-l:libcublasLt.so.13"]
    return [], ["-lcublasLt"]


def _extension():
    debug = os.environ.get("TECPP_DEBUG") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # torch's headers as system headers: their warnings (AVX-512 intrinsics, bit-fields) are
    # not ours, and would bury ours.
    system_includes = [f"-isystem{d}" for d in cpp_extension.include_paths()]
    cxx = [*system_includes, "-std=c++20", "-Wall", "-fopenmp", "-Wno-unknown-pragmas",
           # GCC 12 false positive on the _mm512 fp16 conversion intrinsics inlined from torch
           "-Wno-maybe-uninitialized",
           # GCC 12's AVX-512 headers write their "undefined" vectors as self-initialisations
           # (`__m512 __Y = __Y;`): after inlining into our kernels, -Wall's -Winit-self reports
           # each one ("'__Y' is used uninitialized", hundreds). Self-initialisation only:
           # -Wuninitialized still reports a variable of ours used before it is set.
           "-Wno-init-self", "-DTORCH_ASSERT_ONLY_METHOD_OPERATORS",
           # no implicit contraction: the kernels' multiply-adds are the shared math's explicit
           # fma/fnma, so a row's vector body and its scalar tail round alike
           "-ffp-contract=off", *opt, *_cpu_flags()]
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/ops/*.cpp")
                     + glob.glob("csrc/kernels/cpu/*.cpp"))
    kwargs = dict(
        # the headers too: setuptools skips the whole build when no listed file is newer than
        # the built library (ninja then recompiles only the sources that include a changed one)
        depends=sorted(glob.glob("csrc/**/*.h", recursive=True)),
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    if _with_cuda():
        sources += sorted(glob.glob("csrc/kernels/cuda/*.cu"))
        kwargs["depends"] += sorted(glob.glob("csrc/**/*.cuh", recursive=True))
        cublaslt_include, cublaslt_link = _cublaslt()
        # nvcc: the same defines and contraction rule as the C++ sources; the targets come from
        # TORCH_CUDA_ARCH_LIST (`make cuda-build`: "9.0+PTX", sm_90 code plus PTX for later GPUs).
        nvcc = ["-std=c++20", "--expt-relaxed-constexpr", "--fmad=false", "-DTECPP_WITH_CUDA",
                "-DTORCH_ASSERT_ONLY_METHOD_OPERATORS", *(["-G"] if debug else []), *opt]
        kwargs["include_dirs"] += cublaslt_include
        kwargs["extra_link_args"] += cublaslt_link
        return cpp_extension.CUDAExtension(
            "transformer_engine_cpp._C", sources,
            extra_compile_args={"cxx": cxx + ["-DTECPP_WITH_CUDA"], "nvcc": nvcc}, **kwargs)
    return cpp_extension.CppExtension(
        "transformer_engine_cpp._C", sources, extra_compile_args={"cxx": cxx}, **kwargs)


def _run_ninja(build_directory: str, verbose: bool, error_prefix: str) -> None:
    """Runs ninja in ``build_directory`` as torch.utils.cpp_extension does, but quietly.

    torch runs ``ninja -v``, which prints every compiler command line (about 2,000 characters
    each). Here each rule of torch's build.ninja gets a description (its input file), so ninja
    prints one progress line per compiled file, "[3/23] csrc/ops/linear.cpp", followed by what the
    compiler printed: warnings stay visible. Nothing is printed when nothing is out of date.
    """
    manifest = os.path.join(build_directory, "build.ninja")
    with open(manifest) as f:
        text = f.read()
    described = re.sub(r"^(rule \w+\n)(?!  description)", r"\1  description = $in\n", text,
                       flags=re.M)
    if described != text:
        with open(manifest, "w") as f:
            f.write(described)
    cmd = ["ninja"]
    if os.environ.get("MAX_JOBS", "").isdigit():
        cmd += ["-j", os.environ["MAX_JOBS"]]
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, cwd=build_directory, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    root = ROOT + os.sep
    for line in proc.stdout:
        if line.startswith("ninja: no work to do"):
            continue
        # paths relative to the checkout, as a user names them
        sys.stdout.write(line.replace(root, ""))
        sys.stdout.flush()
    if proc.wait() != 0:
        raise RuntimeError(f"{error_prefix} (the compiler's messages are above)")


class BuildExtension(cpp_extension.BuildExtension.with_options(no_python_abi_suffix=True)):
    """torch's BuildExtension, with two changes.

    * Ninja runs quietly (``_run_ninja``) instead of printing every command line.
    * An editable install (``pip install -e .``) compiles in the same ``build/temp.*`` folder as
      ``setup.py build_ext --inplace`` and ``pip wheel .`` instead of a fresh temporary folder,
      so it reuses their objects (after ``make build``: nothing to compile).
    """

    def finalize_options(self):
        super().finalize_options()
        if getattr(self, "editable_mode", False):
            # the folder setuptools' build command uses by default
            tag = f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
            self.build_temp = os.path.join(ROOT, "build", tag)

    def build_extensions(self):
        # torch.utils.cpp_extension runs ninja through this module-level function; replace it
        # for this build only (where a torch version lacks it, torch's verbose build runs)
        saved = getattr(cpp_extension, "_run_ninja_build", None)
        if saved is not None:
            cpp_extension._run_ninja_build = _run_ninja
        try:
            super().build_extensions()
        finally:
            if saved is not None:
                cpp_extension._run_ninja_build = saved


setup(
    name="transformer_engine_cpp",
    version="0.1.0",
    description="TransformerEngine's fusible ops (te.ops) as PyTorch C++ custom ops",
    packages=find_packages(include=["transformer_engine_cpp", "transformer_engine_cpp.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    python_requires=">=3.10",
)
