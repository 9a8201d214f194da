#!/usr/bin/env python3
"""Size limits of kvmem's library code: no function body over MAX_FUNCTION
lines and no file over MAX_FILE lines in base/, storage/, engine/, server/
and client/ (tools/ may keep longer table-printing code).

    python3 tools/check_sizes.py [ROOT] [--report]

A function is a brace block opened at namespace level (or at class level in
a header) after a line that is not a namespace, class, struct, enum or
initialiser; its length counts the lines from its signature's first line to
its closing brace. --report lists the largest, also when within limits.
Exit 1 with one line per violation, 0 when clean.
"""
import os
import re
import sys

MAX_FUNCTION = 80
MAX_FILE = 500
FOLDERS = ("base", "storage", "engine", "server", "client")
SCOPE = re.compile(r"\b(namespace|class|struct|enum|union)\b[^;()]*$")


def strip(text):
    """Removes comments and string/char literals, keeping line breaks."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(signature start, first line, last line) of each function body."""
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    found = []
    stack = []        # Open braces: True for a scope (namespace/class) one.
    header = []       # Characters since the last ';', '{' or '}' in scope.
    header_line = None
    start = None
    no = 1
    for ch in text:
        if ch == "\n":
            no += 1
        in_scope = all(stack)
        if ch == "{":
            sig = "".join(header).strip()
            is_scope = in_scope and bool(SCOPE.search(sig))
            if in_scope and not is_scope and re.search(r"\)", sig) and \
                    not re.search(r"=\s*$", sig):
                start = (header_line or no, " ".join(sig.split())[:60])
            stack.append(is_scope)
            header, header_line = [], None
        elif ch == "}":
            if stack:
                stack.pop()
            if all(stack) and start is not None:
                found.append((start[1], start[0], no))
                start = None
            header, header_line = [], None
        elif ch == ";" and in_scope:
            header, header_line = [], None
        elif in_scope:
            if header_line is None and not ch.isspace():
                header_line = no
            header.append(ch)
    return found, text.count("\n")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    report = "--report" in sys.argv
    root = args[0] if args else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    errors, sizes = [], []
    for top in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                funcs, total = functions(path)
                if total > MAX_FILE:
                    errors.append(f"{rel}: {total} lines (limit {MAX_FILE})")
                for head, first, last in funcs:
                    n = last - first + 1
                    sizes.append((n, f"{rel}:{first}: {head}"))
                    if n > MAX_FUNCTION:
                        errors.append(f"{rel}:{first}: function of {n} lines "
                                      f"(limit {MAX_FUNCTION}): {head}")
    for e in errors:
        print(e)
    if report:
        for n, where in sorted(sizes, reverse=True)[:15]:
            print(f"  {n:4d}  {where}")
    print(f"check_sizes: {len(sizes)} functions, {len(errors)} over the "
          f"limits (function {MAX_FUNCTION} lines, file {MAX_FILE})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
