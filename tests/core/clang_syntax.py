#!/usr/bin/env python3
"""The library's sources must also compile with clang (Debian 12's clang 14), which users may build
with and which the JIT may use (DSK_JIT_CXX): each source under SOURCE_DIR in the build's
compile_commands.json is checked by CLANGXX -fsyntax-only with the build's own flags (templates
are instantiated, warnings stay errors where the build makes them so), on every CPU.

Usage: clang_syntax.py COMPILE_COMMANDS_JSON CLANGXX SOURCE_DIR
Prints each failing source with clang's diagnostics and exits 1 if any failed."""
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def clang_command(entry, clangxx):
    """The entry's compile command with clang, checking syntax instead of writing an object."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    kept, skip_next = [clangxx], False
    for arg in args[1:]:
        if skip_next:
            skip_next = False
        elif arg in ("-o", "-c"):
            skip_next = True  # the output object, and the source (added back below)
        else:
            kept.append(arg)
    return kept + ["-fsyntax-only", entry["file"]]


def check(entry, clangxx):
    run = subprocess.run(clang_command(entry, clangxx), cwd=entry["directory"],
                         capture_output=True, text=True)
    return entry["file"], run.returncode, run.stderr


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    database, clangxx, source_dir = sys.argv[1], sys.argv[2], os.path.realpath(sys.argv[3])
    with open(database) as f:
        entries = [e for e in json.load(f)
                   if os.path.realpath(e["file"]).startswith(source_dir + os.sep)]
    if not entries:
        sys.exit(f"no source under {source_dir} in {database}")
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda e: check(e, clangxx), entries))
    failed = [r for r in results if r[1] != 0]
    for source, _, diagnostics in failed:
        print(f"{source}: does not compile with {clangxx}\n{diagnostics}")
    print(f"{len(entries)} sources checked with {clangxx}, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
