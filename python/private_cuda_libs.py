"""Gives the extension module strata._strata private copies of the CUDA-side shared libraries it needs.

Run by python/CMakeLists.txt after every link of _strata (the build's interpreter, no third-party module):

  private_cuda_libs.py --patchelf PATCHELF --extension _strata.so LIB...

Note [Private CUDA sonames]: PyTorch's CUDA wheels ship their own libnccl.so.2, libcudnn.so.9 (and the
sub-libraries it dlopens), libcublasLt.so.13 and libnvrtc.so.13, of other versions than the toolkit's that
Strata is built against. The dynamic linker reuses an already loaded library for any later request of
the same soname, a DT_NEEDED entry or a dlopen by name alike, so whichever package came first gave the
other its copies: `import strata` then torch failed with "libtorch_cuda.so: undefined symbol:
ncclCommResume" (torch got the toolkit's older NCCL), and torch first silently gave Strata torch's.
So each such library the extension needs (LIB... lists the candidates; those it does not need are left
alone) is copied beside the extension under a private name: "lib" becomes "st_" (libnccl.so.2 ->
st_nccl.so.2), the same length, because cuDNN and NVRTC dlopen their family by names written in
.rodata ("libcudnn_graph.so", "libnvrtc.so.%d", "libcublasLt.so.13", "libnvrtc-builtins.so.13.0"), and
those strings ("<name>.so" of each copied library; not NCCL's "libnccl-net.so", its plugins) are
rewritten in place. Families come whole: libcudnn.so.9 brings every libcudnn_*.so.9 beside it,
libnvrtc.so.N its libnvrtc-builtins. Each copy's soname, its DT_NEEDED entries within the set
and the extension's DT_NEEDED entries are renamed with patchelf, RUNPATH $ORIGIN; symbol version names
("libcudnn.so.9") are labels and stay. The CUDA runtime is not copied: the extension links it statically
with its symbols kept local (python/CMakeLists.txt), and the driver (libcuda.so.1) stays shared, the one
all CUDA code in a process must use. Which symbols each side binds to: Note [Symbols beside torch] in
python/CMakeLists.txt.

Copies are made once per source library (a manifest beside them records the source's path, size and
mtime); only the extension is patched again after a link. They are build outputs, never in git: together
about 1.3 GB with cuDNN.
"""

import argparse
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys

PRIVATE_PREFIX = "st_"  # replaces "lib": the same length, so names in .rodata can be rewritten in place
MANIFEST = ".private_cuda_libs.json"
MANIFEST_VERSION = 1


def private_name(name):
    """libnccl.so.2 -> st_nccl.so.2."""
    assert name.startswith("lib"), name
    return PRIVATE_PREFIX + name[len("lib"):]


def soname(patchelf, path):
    return subprocess.run([patchelf, "--print-soname", path], check=True, capture_output=True,
                          text=True).stdout.strip()


def needed(patchelf, path):
    return subprocess.run([patchelf, "--print-needed", path], check=True, capture_output=True,
                          text=True).stdout.split()


def family(path):
    """The library and those it loads by name from its own folder: cuDNN's sub-libraries, NVRTC's
    builtins (not the .alt variants, which NVRTC loads only when asked)."""
    real = os.path.realpath(path)
    folder, base = os.path.split(real)
    members = [real]
    m = re.match(r"libcudnn\.so\.(\d+)", base)
    if m:
        members += sorted(glob.glob(os.path.join(folder, f"libcudnn_*.so.{m.group(1)}")))
    m = re.match(r"libnvrtc\.so\.(\d+)", base)
    if m:
        members += sorted(p for p in glob.glob(os.path.join(folder, f"libnvrtc-builtins.so.{m.group(1)}*"))
                          if ".alt." not in p)
    return [os.path.realpath(p) for p in members]


def name_base(soname_):
    """The part of a soname that code writes when it builds the name at run time ("libnvrtc.so.%d"):
    libcudnn_graph.so.9 -> libcudnn_graph.so. Only these are rewritten: NCCL's own "libnccl-net.so"
    (its network plugins, found by name) must keep finding the plugins installed."""
    return soname_[:soname_.index(".so") + len(".so")]


def rodata_ranges(data):
    """(offset, size) of each .rodata* section of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit("private_cuda_libs: not an ELF64 little-endian file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = data[names_off:names_off + names_size]
    out = []
    for h in headers:
        name = names[h[0]:names.index(b"\0", h[0])]
        if name.startswith(b".rodata") and h[1] != 8:  # 8: SHT_NOBITS
            out.append((h[4], h[5]))
    return out


def rewrite_rodata(path, bases):
    """Replaces each base (b"libcudnn_graph.so") by its private name (b"st_cudnn_graph.so") inside
    .rodata; returns the number of strings changed."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    count = 0
    for off, size in rodata_ranges(data):
        section = bytes(data[off:off + size])
        for base in bases:
            new = private_name(base.decode()).encode()
            assert len(new) == len(base)
            count += section.count(base)
            section = section.replace(base, new)
        data[off:off + size] = section
    with open(path, "wb") as f:
        f.write(data)
    return count


def make_copy(patchelf, src, dest, renames, bases):
    tmp = dest + ".tmp"
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o755)
    # One change per patchelf run: patchelf 0.14 given --set-soname and --replace-needed together gave
    # cuDNN's sub-libraries the soname of one they need.
    new_needed = [renames.get(n, n) for n in needed(patchelf, src)]
    for old in needed(patchelf, src):
        if old in renames:
            subprocess.run([patchelf, "--replace-needed", old, renames[old], tmp], check=True)
    subprocess.run([patchelf, "--set-soname", renames[soname(patchelf, src)], tmp], check=True)
    subprocess.run([patchelf, "--set-rpath", "$ORIGIN", tmp], check=True)
    if soname(patchelf, tmp) != os.path.basename(dest) or needed(patchelf, tmp) != new_needed:
        raise SystemExit(f"private_cuda_libs: patchelf left {tmp} with soname {soname(patchelf, tmp)} and "
                         f"needs {needed(patchelf, tmp)}, not {os.path.basename(dest)} and {new_needed}")
    rewrite_rodata(tmp, bases)
    os.replace(tmp, dest)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patchelf", default="patchelf")
    ap.add_argument("--extension", required=True, help="the extension module to give private copies")
    ap.add_argument("libs", nargs="*", help="candidate libraries (the toolkit's NCCL, cuDNN, cuBLASLt, NVRTC)")
    args = ap.parse_args()

    dest_dir = os.path.dirname(os.path.abspath(args.extension))
    ext_needed = needed(args.patchelf, args.extension)
    # The candidates the extension needs, then every member of their families.
    members = {}  # soname -> real path
    for lib in args.libs:
        if soname(args.patchelf, lib) not in ext_needed:
            continue
        for path in family(lib):
            members[soname(args.patchelf, path)] = path
    renames = {name: private_name(name) for name in members}
    bases = sorted({name_base(name).encode() for name in members}, key=len, reverse=True)

    manifest_path = os.path.join(dest_dir, MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    if manifest.get("version") != MANIFEST_VERSION or manifest.get("bases") != [s.decode() for s in bases]:
        manifest = {"version": MANIFEST_VERSION, "bases": [s.decode() for s in bases], "copies": {}}
    for name, src in sorted(members.items()):
        dest = os.path.join(dest_dir, renames[name])
        st = os.stat(src)
        key = [src, st.st_size, st.st_mtime_ns]
        if manifest["copies"].get(renames[name]) == key and os.path.exists(dest):
            continue
        print(f"private_cuda_libs: {src} -> {dest}", flush=True)
        make_copy(args.patchelf, src, dest, renames, bases)
        manifest["copies"][renames[name]] = key
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1)

    replace = []
    for old in ext_needed:
        if old in renames:
            replace += ["--replace-needed", old, renames[old]]
    if replace:
        subprocess.run([args.patchelf, *replace, args.extension], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
