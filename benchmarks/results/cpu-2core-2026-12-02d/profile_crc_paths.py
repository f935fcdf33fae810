# One thread, in process: benchmarks/bench_export.profile_stages for SpecForge with the native
# writer + CRC (hscapture._files.crc32) and with ISA-L (the bounce path), twice each, 30 samples.
# Run from the project root with the .venv active: python benchmarks/results/cpu-2core-2026-12-02d/profile_crc_paths.py
import sys, os, shutil, tempfile, zlib
sys.path.insert(0, "benchmarks")
import bench_export as B
from hscapture import _tensor_files as T, _files
src = tempfile.mkdtemp(dir="/dev/shm"); out = tempfile.mkdtemp(dir="/dev/shm")
B.build(src, 30, 512, 2048)
native = T._crc32
from isal.isal_zlib import crc32 as ic
for name, f in [("native", native), ("isal-bounce", ic), ("native", native), ("isal-bounce", ic)]:
    T._crc32 = f
    r = B.profile_stages(src, out, "specforge", reps=5)
    print(name, {k: round(v, 3) for k, v in r.items()})
shutil.rmtree(src); shutil.rmtree(out)
