"""The extension shares no CUDA library, and no symbol, with another package in the process (Note [Private
CUDA sonames] in python/private_cuda_libs.py, Note [Symbols beside torch] in python/CMakeLists.txt).

PyTorch's stand-ins are built here with the C compiler: a libnccl.so.2 that exports a function the
toolkit's NCCL lacks (as torch's newer NCCL does), a library that needs it (as libtorch_cuda.so does), and
a libcudart.so.13 loaded RTLD_GLOBAL (as torch's libtorch_global_deps.so brings its own). Each order runs
in a child interpreter; tests/python/test_torch_beside.py does the same with torch itself.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import strata
import strata_support as sup

PACKAGE_DIR = pathlib.Path(strata.__file__).resolve().parent
# Sonames that PyTorch's CUDA wheels (and other CUDA packages) ship too: none may be needed by name.
SHARED_CUDA_SONAME = re.compile(
    r"^lib(nccl|cudnn\w*|cublas(Lt)?|cudart|nvrtc[\w-]*|nvJitLink|cusparse\w*|cufft\w*|curand|cusolver\w*)\.so")
FAKE_NCCL = """
int ncclCommResume(void* comm) { (void)comm; return 42; }  /* in NCCL 2.29+, not in the toolkit's 2.28 */
int ncclGetVersion(int* version) { *version = 99999; return 0; }
int ncclGetErrorString(int result) { return result; }
"""
CONSUMER = """
int ncclCommResume(void* comm);
int consumer_call(void) { return ncclCommResume(0); }
"""
FAKE_CUDART = """
int cudaGetDeviceCount(int* count) { *count = 7; return 0; }
int cudaGetLastError(void) { return 0; }
int cudaDriverGetVersion(int* version) { *version = 99999; return 0; }
"""


def dynamic_entries(path):
    """(NEEDED sonames, SONAME or None) of an ELF file, read with binutils' readelf."""
    out = subprocess.run(["readelf", "-dW", str(path)], check=True, capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    soname = re.findall(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return needed, (soname[0] if soname else None)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """A folder with the stand-ins: libnccl.so.2, libconsumer.so (needs libnccl.so.2, RUNPATH $ORIGIN) and
    libcudart.so.13."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the stand-in libraries")
    d = tmp_path_factory.mktemp("fakes")
    for name, src, soname, extra in [("libnccl.so.2", FAKE_NCCL, "libnccl.so.2", []),
                                     ("libconsumer.so", CONSUMER, "libconsumer.so",
                                      ["-L.", "-l:libnccl.so.2", "-Wl,-rpath,$ORIGIN"]),
                                     ("libcudart.so.13", FAKE_CUDART, "libcudart.so.13", [])]:
        (d / (name + ".c")).write_text(src)
        subprocess.run([cc, "-shared", "-fPIC", "-o", name, name + ".c", f"-Wl,-soname,{soname}", *extra],
                       cwd=d, check=True)
    return d


def run_child(fakes, body, tmp_path):
    """Runs `body` in a child interpreter (FAKES is the stand-ins' folder) under LD_DEBUG=bindings; returns
    the dynamic linker's binding lines."""
    prelude = (f"import ctypes, os, sys\nFAKES = {str(fakes)!r}\n"
               f"sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n")
    log = tmp_path / "ld"
    env = sup.child_env(LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(log))
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"child exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    lines = []
    for f in tmp_path.glob("ld.*"):
        lines += [ln for ln in f.read_text(errors="replace").splitlines() if "binding file" in ln]
    assert lines, "LD_DEBUG=bindings wrote nothing"
    return lines


def crossing_bindings(lines, fakes):
    """Binding lines from a strata object to a stand-in, or from a stand-in to a strata object."""
    pkg, fk = str(PACKAGE_DIR), str(fakes)
    out = []
    for ln in lines:
        m = re.search(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]", ln)
        if m and ((m.group(1).startswith(pkg) and m.group(2).startswith(fk))
                  or (m.group(1).startswith(fk) and m.group(2).startswith(pkg))):
            out.append(ln.strip())
    return out


# A tiny engine step in the child: the extension's code runs, not only its loading.
ENGINE_STEP = """
import strata_support as sup
tokens = os.path.join(os.environ["CHILD_TMP"], "train.bin")
sup.write_llmc_tokens(tokens, [i % 256 for i in range(4096)])
engine = sup.new_engine(sup.demo_config())
step, = sup.run_steps(engine, engine.token_loader(tokens), 1)
assert step.loss == step.loss and step.loss > 0, step
"""


def test_extension_needs_no_shared_cuda_soname():
    """The extension's DT_NEEDED names no soname another package ships (libnccl.so.2, libcudnn.so.9, ...)."""
    ext = pathlib.Path(strata._strata.__file__)
    needed, _ = dynamic_entries(ext)
    assert [n for n in needed if SHARED_CUDA_SONAME.match(n)] == [], f"{ext} needs {needed}"


def test_private_copies_have_private_names():
    """Each private copy beside the extension has its st_ soname and needs only st_ copies of CUDA libraries."""
    copies = sorted(PACKAGE_DIR.glob("st_*.so*"))
    if not copies:
        pytest.skip("no private CUDA libraries: the extension is built without the cuda backend")
    for path in copies:
        needed, soname = dynamic_entries(path)
        assert soname == path.name
        assert [n for n in needed if SHARED_CUDA_SONAME.match(n)] == [], f"{path} needs {needed}"


def test_another_nccl_loads_after_strata(fakes, tmp_path):
    """import strata, then a library needing a newer libnccl.so.2 (torch's order of the issue): it gets its
    own, and the two share no symbol."""
    lines = run_child(fakes, """
        import strata
        consumer = ctypes.CDLL(os.path.join(FAKES, "libconsumer.so"))
        assert consumer.consumer_call() == 42
    """, tmp_path)
    assert crossing_bindings(lines, fakes) == []


def test_strata_loads_after_another_nccl_and_global_cudart(fakes, tmp_path, monkeypatch):
    """A libcudart.so.13 loaded RTLD_GLOBAL and a libnccl.so.2 loaded first (torch first), then strata:
    strata loads, trains a step, and binds none of its references to them."""
    monkeypatch.setenv("CHILD_TMP", str(tmp_path))
    lines = run_child(fakes, textwrap.dedent("""
        ctypes.CDLL(os.path.join(FAKES, "libcudart.so.13"), mode=os.RTLD_GLOBAL)
        consumer = ctypes.CDLL(os.path.join(FAKES, "libconsumer.so"))
        import strata
    """) + ENGINE_STEP + "assert consumer.consumer_call() == 42\n", tmp_path)
    assert crossing_bindings(lines, fakes) == []
