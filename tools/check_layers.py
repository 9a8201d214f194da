#!/usr/bin/env python3
"""The include-boundary check: fails when a source file includes across a
forbidden edge of kvmem's layers (ARCHITECTURE.md, "Layers").

    python3 tools/check_layers.py [ROOT]

Every #include "..." or <...> of every .h/.cc under the checked folders is
matched against the rules of the folder the file is in. A project include
("base/...", "engine/...", ...) must be in the folder's allowed list; a
third-party include (grpc, protobuf, FAISS, RocksDB, the generated kvmem/v1
code) must not be in its forbidden list. Inside engine/, the folders are
ordered (ENGINE_ORDER): a folder includes only itself and those below it,
and any include cycle between engine folders is reported. Exit 1 with one
line per violation, 0 when clean. .ci/run and ctest (layer_check) run it.
"""
import os
import re
import sys

# Project folders an include can name (its first path component).
PROJECT = ("base/", "storage/", "engine/", "server/", "client/", "tools/",
           "tests/", "kvmem/v1/", "proto/")
ENGINE_PUBLIC = ("engine/memory_engine.h", "engine/types.h",
                 "engine/stream_config.h", "engine/ownership.h")
GRPC = ("grpc/", "grpcpp/", "grpc++/", "google/protobuf/", "kvmem/v1/",
        "proto/")

# folder -> (allowed project include prefixes, forbidden third-party
# prefixes). The first matching folder (longest first) rules a file.
RULES = {
    "base/": (("base/",), GRPC + ("faiss/", "rocksdb/")),
    "storage/": (("base/", "storage/"), GRPC + ("faiss/",)),
    "engine/": (("base/", "engine/", "storage/cold_store.h",
                 "storage/forwarding_store.h"),
                GRPC + ("rocksdb/",)),
    "server/": (("base/", "server/", "storage/") + ENGINE_PUBLIC +
                ("kvmem/v1/",), ("faiss/", "rocksdb/")),
    "client/cpp/": (("client/cpp/", "kvmem/v1/"),
                    ("faiss/", "rocksdb/", "google/protobuf/util/")),
}
# Includes of FAISS stay inside the index part of the engine.
ONLY_IN = {"faiss/": ("engine/index/", "tools/", "tests/"),
           "rocksdb/": ("storage/", "tools/", "tests/"),
           "rados/": ("storage/", "tests/distributed/")}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# The engine's own folders, bottom first (ARCHITECTURE.md, "The engine's
# parts"): a file in one may include its own folder, the folders before it
# and the public headers below; never a folder after it, so no include
# cycle between them can form. The door (memory_engine.*) and the config's
# implementation (stream_config.cc) sit above every folder.
ENGINE_ORDER = ("codec", "index", "accel", "signals", "view", "recall",
                "tiers", "stream")
# What the engine's value types carry; they include no other engine folder
# but codec/dtype.h (the dtype enum, a leaf).
ENGINE_BASE = ("engine/types.h", "engine/stream_config.h")
ENGINE_BASE_MAY_INCLUDE = ENGINE_BASE + ("engine/codec/dtype.h",)


def engine_folder(path):
    """The engine folder of engine/<folder>/..., or None."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == "engine":
        return parts[1]
    return None


def engine_rule(path, inc):
    """Why path may not include inc (both in engine/), or None."""
    if not (path.startswith("engine/") and inc.startswith("engine/")):
        return None
    if path in ENGINE_BASE:
        if inc not in ENGINE_BASE_MAY_INCLUDE:
            return (f"engine's value types may include only "
                    f"{', '.join(ENGINE_BASE_MAY_INCLUDE)}")
        return None
    src, dst = engine_folder(path), engine_folder(inc)
    if src is None:
        return None  # The door and stream_config.cc: above every folder.
    if src not in ENGINE_ORDER:
        return (f"engine/{src}/ is not in the engine's folder order "
                f"({', '.join(ENGINE_ORDER)}): add it to ENGINE_ORDER")
    if dst is None:
        if inc not in ENGINE_BASE:
            return (f"engine/{src}/ may include, of the engine's top level, "
                    f"only {', '.join(ENGINE_BASE)}")
        return None
    if dst not in ENGINE_ORDER:
        return f"engine/{dst}/ is not in the engine's folder order"
    if ENGINE_ORDER.index(dst) > ENGINE_ORDER.index(src):
        return (f"engine/{src}/ may not include engine/{dst}/ (the engine's "
                f"folders, bottom first: {', '.join(ENGINE_ORDER)}; an "
                f"include upward makes a cycle)")
    return None


def engine_cycles(edges):
    """Cycles in the graph of engine folders (folder -> set of folders it
    includes), each as a list of folders, first repeated at the end."""
    cycles, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return cycles


def rule_for(path):
    for folder in sorted(RULES, key=len, reverse=True):
        if path.startswith(folder):
            return folder, RULES[folder]
    return None, None


def check_file(root, path, engine_edges=None):
    errors = []
    folder, rule = rule_for(path)
    with open(os.path.join(root, path), encoding="utf-8",
              errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            where = f"{path}:{lineno}: includes {inc}"
            for lib, homes in ONLY_IN.items():
                if inc.startswith(lib) and not path.startswith(homes):
                    errors.append(f"{where}: {lib[:-1]} only in "
                                  f"{', '.join(homes)}")
            why = engine_rule(path, inc)
            if why:
                errors.append(f"{where}: {why}")
            src, dst = engine_folder(path), engine_folder(inc)
            if (engine_edges is not None and src and dst and src != dst and
                    inc.startswith("engine/")):
                engine_edges.setdefault(src, set()).add(dst)
            if rule is None:
                continue
            allowed, forbidden = rule
            if inc.startswith(PROJECT):
                if not inc.startswith(allowed):
                    errors.append(f"{where}: {folder} may include only "
                                  f"{', '.join(allowed)}")
            elif inc.startswith(forbidden):
                errors.append(f"{where}: {folder} must not include "
                              f"{inc.split('/')[0]}/")
    return errors


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    errors, checked, engine_edges = [], 0, {}
    for top in ("base", "storage", "engine", "server", "client", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                checked += 1
                errors.extend(check_file(root, rel.replace(os.sep, "/"),
                                         engine_edges))
    for cycle in engine_cycles(engine_edges):
        errors.append("include cycle between engine folders: " +
                      " -> ".join(cycle))
    for e in errors:
        print(e)
    print(f"check_layers: {checked} files, {len(errors)} forbidden includes")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
