#!/usr/bin/env python3
"""The CPU time (user + sys of the compiler) of compiling translation units.

    python3 tools/compile_cpu_time.py BUILD_DIR [STRIDE [BASE_BUILD_DIR]]

Reads BUILD_DIR/compile_commands.json (a build directory configured without
ccache, which would answer from its cache), takes every STRIDE-th
translation unit in path order (STRIDE 1: all of them), compiles each once,
one at a time, into a scratch object, and prints each one's CPU seconds,
then the sum. CPU time, not wall time: other work on the machine slows the
wall clock more than the compiler's CPU time.

With BASE_BUILD_DIR (the same configuration of another checkout, e.g. a git
worktree at an earlier commit) each translation unit is compiled in both
trees, alternately base first and last, and the two columns and their ratio
are printed: the load of a shared machine moves a single figure by 30%,
both columns of a pair alike. docs/PERFORMANCE.md's build-time section:

    git worktree add /tmp/before <commit>
    cmake --preset release -B /tmp/before/build/measure
    cmake --preset release -B build/measure
    python3 tools/compile_cpu_time.py build/measure 8 /tmp/before/build/measure
"""
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile


def translation_units(build_dir):
    """{path relative to the source tree: compile_commands.json entry}."""
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    root = os.path.commonpath([e["file"] for e in entries])
    return {os.path.relpath(e["file"], root): e for e in entries}


def cpu_seconds(entry, out):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    if os.path.basename(args[0]) == "ccache":
        sys.exit(f"{entry['directory']} compiles through ccache: configure a build directory without it")
    args[args.index("-o") + 1] = out
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, cwd=entry["directory"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    if not 2 <= len(sys.argv) <= 4:
        sys.exit("usage: compile_cpu_time.py BUILD_DIR [STRIDE [BASE_BUILD_DIR]]")
    units = translation_units(sys.argv[1])
    stride = int(sys.argv[2]) if len(sys.argv) >= 3 else 1
    base = translation_units(sys.argv[3]) if len(sys.argv) == 4 else None
    chosen = sorted(units)[::stride]
    if base is not None:
        chosen = [path for path in chosen if path in base]
    total = base_total = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "tu.o")
        for i, path in enumerate(chosen):
            if base is None:
                seconds = cpu_seconds(units[path], out)
                print(f"{seconds:7.2f}  {path}", flush=True)
            elif i % 2 == 0:
                base_seconds = cpu_seconds(base[path], out)
                seconds = cpu_seconds(units[path], out)
            else:
                seconds = cpu_seconds(units[path], out)
                base_seconds = cpu_seconds(base[path], out)
            if base is not None:
                base_total += base_seconds
                print(f"{base_seconds:7.2f} {seconds:7.2f}  {path}", flush=True)
            total += seconds
    if base is None:
        print(f"{total:7.2f}  total CPU seconds, {len(chosen)} of {len(units)} translation units")
    else:
        print(f"{base_total:7.2f} {total:7.2f}  total CPU seconds (base, this), {len(chosen)} of {len(units)} "
              f"translation units: {total / base_total:.2f} of the base")


if __name__ == "__main__":
    main()
