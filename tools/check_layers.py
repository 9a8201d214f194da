#!/usr/bin/env python3
"""The include-boundary check: fails when a source file includes across a
forbidden edge of kvmem's layers (ARCHITECTURE.md, "Layers").

    python3 tools/check_layers.py [ROOT]

Every #include "..." or <...> of every .h/.cc under the checked folders is
matched against the rules of the folder the file is in. A project include
("base/...", "engine/...", ...) must be in the folder's allowed list; a
third-party include (grpc, protobuf, FAISS, RocksDB, the generated kvmem/v1
code) must not be in its forbidden list. Exit 1 with one line per violation,
0 when clean. .ci/run and ctest (layer_check) run it.
"""
import os
import re
import sys

# Project folders an include can name (its first path component).
PROJECT = ("base/", "storage/", "engine/", "server/", "client/", "tools/",
           "tests/", "kvmem/v1/", "proto/")
ENGINE_PUBLIC = ("engine/memory_engine.h", "engine/types.h",
                 "engine/stream_config.h")
GRPC = ("grpc/", "grpcpp/", "grpc++/", "google/protobuf/", "kvmem/v1/",
        "proto/")

# folder -> (allowed project include prefixes, forbidden third-party
# prefixes). The first matching folder (longest first) rules a file.
RULES = {
    "base/": (("base/",), GRPC + ("faiss/", "rocksdb/")),
    "storage/": (("base/", "storage/"), GRPC + ("faiss/",)),
    "engine/": (("base/", "engine/", "storage/cold_store.h"),
                GRPC + ("rocksdb/",)),
    "server/": (("base/", "server/", "storage/") + ENGINE_PUBLIC +
                ("kvmem/v1/",), ("faiss/", "rocksdb/")),
    "client/cpp/": (("client/cpp/", "kvmem/v1/"),
                    ("faiss/", "rocksdb/", "google/protobuf/util/")),
}
# Includes of FAISS stay inside the index part of the engine.
ONLY_IN = {"faiss/": ("engine/index/", "tools/", "tests/"),
           "rocksdb/": ("storage/", "tools/", "tests/")}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def rule_for(path):
    for folder in sorted(RULES, key=len, reverse=True):
        if path.startswith(folder):
            return folder, RULES[folder]
    return None, None


def check_file(root, path):
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
    errors, checked = [], 0
    for top in ("base", "storage", "engine", "server", "client", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                checked += 1
                errors.extend(check_file(root, rel.replace(os.sep, "/")))
    for e in errors:
        print(e)
    print(f"check_layers: {checked} files, {len(errors)} forbidden includes")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
