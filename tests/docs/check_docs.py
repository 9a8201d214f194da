#!/usr/bin/env python3
"""Checks README.md and docs/**/*.md against the tree and the built binaries.

  check_docs.py SRC BIN_DIR [--server PATH] [--cli PATH]
  check_docs.py --selftest SRC BIN_DIR [--server PATH] [--cli PATH]

SRC is the repository root, BIN_DIR the build's bin directory (build/bin);
--server and --cli default to BIN_DIR/kvmem-server and BIN_DIR/kvmem.

1. Links: every relative markdown link or image target exists; an #anchor
   names a heading of the target file (GitHub's slugs).
2. Paths: every repository path named in `code` or a code block (starting
   with engine/ server/ storage/ client/ tools/ tests/ deploy/ proto/ base/
   docs/ .ci/ or build/bin/, or a top-level file such as CMakeLists.txt)
   exists; globs and <placeholders> must match something; build/bin/X must
   be an executable in BIN_DIR.
3. Flags: a flag on a command line that runs kvmem-server must be one that
   `kvmem-server --help` prints; on one that runs `kvmem <sub>`, one that
   `kvmem <sub> --help` prints; on one that runs another kvmem binary of
   BIN_DIR, one its --help (or --helpfull) prints. A flag named alone in
   `code` must be printed by kvmem-server, a subcommand, or a kvmem binary
   the docs name. Tables after a marker comment <!-- flags: PROGRAM -->
   have PROGRAM's flags in their first column. Code blocks tagged other
   than sh/bash/shell/console (or untagged) are not command lines: tag
   program output ```text. Flags of other programs (ctest, cmake, curl,
   openssl, nginx, ghz, ...) are not checked: write them with their program
   (`ctest -L unit`), not alone.
4. Config: in ```toml blocks, [server] keys are kvmem-server flags and
   [stream_defaults] keys are the ones `kvmem-server --print_config` lists.

Exit status 0 when everything checks, 1 with one line per problem
(file:line: what), 2 for bad usage.
"""

import argparse
import fnmatch
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

PATH_PREFIXES = ("engine/", "server/", "storage/", "client/", "tools/",
                 "tests/", "deploy/", "proto/", "base/", "docs/", ".ci/",
                 "build/bin/")
TOP_LEVEL_FILES = ("CMakeLists.txt", "ARCHITECTURE.md", "Dockerfile",
                   "README.md")
# Path-looking strings that are not files of this tree. Keep it tiny and say
# why for each.
PATH_ALLOWLIST = {
}
# Flags every absl/gtest/benchmark program takes without printing them.
BUILTIN_FLAGS = {"help", "helpfull", "helpshort", "helppackage", "version",
                 "only_check_args", "flagfile", "fromenv", "tryfromenv",
                 "undefok"}
# Words that precede the program on a command line.
WRAPPERS = {"sudo", "env", "exec", "time", "nohup", "nice", "taskset",
            "setsid", "!", "do", "then", "else"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)"
                  r"(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FLAG_MARKER = re.compile(r"<!--\s*flags:\s*(.+?)\s*-->")
FLAG_TOKEN = re.compile(r"^--([A-Za-z][A-Za-z0-9_-]*)(=.*)?$")
# Blocks checked as command lines; tag program output ```text.
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}


class Problems:
    def __init__(self):
        self.lines = []

    def add(self, where, what):
        self.lines.append(f"{where}: {what}")


# ---------------------------------------------------------------- markdown

class Doc:
    """A markdown file split into prose paragraphs, table rows and code."""

    def __init__(self, root, rel):
        self.rel = rel
        self.path = os.path.join(root, rel)
        with open(self.path, encoding="utf-8") as f:
            self.text = f.read()
        self.lines = self.text.split("\n")
        self.paragraphs = []   # (first line number, [lines])
        self.code = []         # (line number, language, line)
        self.flag_tables = []  # (program, [(line number, row)])
        self._split()

    def _split(self):
        fence = None
        lang = ""
        para, start = [], 0
        marker = None
        table = None

        def flush():
            nonlocal para
            if para:
                self.paragraphs.append((start, para))
            para = []

        for n, line in enumerate(self.lines, 1):
            if fence is not None:
                if re.match(r"^\s*" + re.escape(fence[0]) + "{" +
                            str(len(fence)) + r",}\s*$", line):
                    fence = None
                else:
                    self.code.append((n, lang, line))
                continue
            m = FENCE.match(line)
            if m:
                flush()
                table = None
                fence, lang = m.group(2), m.group(3).lower()
                continue
            fm = FLAG_MARKER.search(line)
            if fm:
                marker = fm.group(1)
            if line.lstrip().startswith("|"):
                flush()
                if table is None and marker is not None:
                    table = (marker, [])
                    self.flag_tables.append(table)
                    marker = None
                if table is not None:
                    table[1].append((n, line))
                self.paragraphs.append((n, [line]))
                continue
            table = None
            if not line.strip():
                flush()
                continue
            if not para:
                start = n
            para.append(line)
        flush()

    def spans(self):
        """(line number, text) of every inline code span in the prose."""
        out = []
        for start, lines in self.paragraphs:
            joined = "\n".join(lines)
            for m in CODE_SPAN.finditer(joined):
                line = start + joined.count("\n", 0, m.start())
                out.append((line, m.group(2).replace("\n", " ").strip()))
        return out

    def links(self):
        """(line number, target) of every link outside code."""
        out = []
        for start, lines in self.paragraphs:
            joined = "\n".join(lines)
            blanked = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), joined)
            for m in LINK.finditer(blanked):
                line = start + blanked.count("\n", 0, m.start())
                out.append((line, m.group(1).strip("<>")))
            for i, l in enumerate(lines):
                r = REF_DEF.match(l)
                if r:
                    out.append((start + i, r.group(1).strip("<>")))
        return out

    def slugs(self):
        seen = {}
        out = set()
        fence = None
        for line in self.lines:
            m = FENCE.match(line)
            if m:
                fence = None if fence else m.group(2)
                continue
            if fence:
                continue
            h = HEADING.match(line)
            if not h:
                continue
            slug = github_slug(h.group(2))
            if slug in seen:
                seen[slug] += 1
                out.add(f"{slug}-{seen[slug]}")
            else:
                seen[slug] = 0
                out.add(slug)
        for a in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", self.text):
            out.add(a)
        return out


def github_slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links
    text = re.sub(r"<[^>]+>", "", text)                          # html
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def markdown_files(root):
    files = ["README.md"] if os.path.exists(os.path.join(root, "README.md")) \
        else []
    for dirpath, _, names in os.walk(os.path.join(root, "docs")):
        for name in sorted(names):
            if name.endswith(".md"):
                files.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(files)


# ------------------------------------------------------------------- links

def check_links(root, docs, problems):
    by_rel = {d.rel: d for d in docs}
    slug_cache = {}

    def slugs_of(rel):
        if rel not in slug_cache:
            d = by_rel.get(rel)
            if d is None:
                d = Doc(root, rel)
            slug_cache[rel] = d.slugs()
        return slug_cache[rel]

    for d in docs:
        for line, target in d.links():
            where = f"{d.rel}:{line}"
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            path, _, anchor = target.partition("#")
            if path.startswith("/"):
                problems.add(where, f"link {target}: use a relative path")
                continue
            rel = os.path.normpath(os.path.join(os.path.dirname(d.rel), path)) \
                if path else d.rel
            if rel.startswith(".."):
                problems.add(where, f"link {target} leaves the repository")
                continue
            full = os.path.join(root, rel)
            if not os.path.exists(full):
                problems.add(where, f"broken link {target}: {rel} does not exist")
                continue
            if anchor and rel.endswith(".md"):
                if anchor not in slugs_of(rel):
                    problems.add(where, f"broken link {target}: no heading "
                                        f"#{anchor} in {rel}")


# ------------------------------------------------------------------- paths

def path_candidates(text):
    """Repository-path-looking tokens in text."""
    out = []
    i, n = 0, len(text)
    starts = [m.start() for m in re.finditer(
        r"(?<![\w./@$-])(?:" + "|".join(re.escape(p) for p in PATH_PREFIXES) +
        r"|(?:" + "|".join(re.escape(f) for f in TOP_LEVEL_FILES) +
        r")(?![\w.]))", text)]
    for s in starts:
        i, depth = s, 0
        while i < n:
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "<":
                j = text.find(">", i)
                if j < 0 or not re.fullmatch(r"[\w-]+", text[i + 1:j]):
                    break
                i = j + 1
                continue
            elif c == "," and depth > 0:
                pass
            elif c.isspace() or c in "`'\"()[]|;:=,&>\\":
                break
            i += 1
        tok = text[s:i].rstrip(".,")
        if tok:
            out.append(tok)
    return out


def expand_braces(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(p[:m.start()] + alt + p[m.end():]))
    return out


def path_exists(root, bin_dir, tok):
    for p in expand_braces(re.sub(r"<[\w-]+>", "*", tok)):
        if p.startswith("build/bin/"):
            name = p[len("build/bin/"):].rstrip("/")
            if not name:
                if not os.path.isdir(bin_dir):
                    return False
                continue
            hits = [os.path.join(bin_dir, x) for x in os.listdir(bin_dir)
                    if fnmatch.fnmatch(x, name)] if os.path.isdir(bin_dir) else []
            if not any(os.path.isfile(h) and os.access(h, os.X_OK)
                       for h in hits):
                return False
            continue
        full = os.path.join(root, p)
        if any(c in p for c in "*?["):
            hits = glob.glob(full, recursive=True)
            if p.endswith("/"):
                hits = [h for h in hits if os.path.isdir(h)]
            if not hits:
                return False
        elif p.endswith("/"):
            if not os.path.isdir(full):
                return False
        elif not os.path.exists(full):
            return False
    return True


def check_paths(root, bin_dir, docs, problems):
    for d in docs:
        texts = [(line, t) for line, t in d.spans()]
        texts += [(line, t) for line, _, t in d.code]
        for line, text in texts:
            for tok in path_candidates(text):
                if tok in PATH_ALLOWLIST:
                    continue
                if not path_exists(root, bin_dir, tok):
                    what = ("is not an executable the build makes "
                            f"(not in {bin_dir})" if tok.startswith("build/bin/")
                            else "does not exist")
                    problems.add(f"{d.rel}:{line}", f"path {tok} {what}")


# ------------------------------------------------------------------- flags

def run_help(cmd):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=60,
                           cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.decode("utf-8", "replace")


class Programs:
    """The flags each kvmem binary prints, asked of the binaries once."""

    def __init__(self, bin_dir, server, cli):
        self.bin_dir = bin_dir
        self.server_bin, self.cli_bin = server, cli
        self._cache = {}
        out = run_help([server, "--help"]) or ""
        self.server = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", out, re.M))
        if not self.server:
            raise SystemExit(f"check_docs: `{server} --help` printed no flags")
        cfg = run_help([server, "--print_config"]) or ""
        section = cfg.split("[stream_defaults]", 1)[-1]
        self.stream_defaults = set(re.findall(
            r"^#?\s*([a-z_]+) = ", section, re.M))
        if not self.stream_defaults:
            raise SystemExit(f"check_docs: `{server} --print_config` printed "
                             "no [stream_defaults]")
        overview = run_help([cli, "--help"]) or ""
        self.subcommands = {}
        for sub in re.findall(r"^  ([a-z]+)\s{2,}", overview, re.M):
            h = run_help([cli, sub, "--help"]) or ""
            self.subcommands[sub] = set(re.findall(
                r"^\s+--([A-Za-z0-9_]+) \(default:", h, re.M))
        if not self.subcommands:
            raise SystemExit(f"check_docs: `{cli} --help` listed no subcommands")
        self.cli_common = set.intersection(*self.subcommands.values())

    def other(self, name):
        """Flags of another binary of bin_dir (None: not one of them)."""
        if name in self._cache:
            return self._cache[name]
        path = os.path.join(self.bin_dir, name)
        flags = None
        if os.path.isfile(path) and os.access(path, os.X_OK):
            out = run_help([path, "--help"]) or ""
            if "--helpfull" in out and "No flags matched" in out:
                out = run_help([path, "--helpfull"]) or ""  # absl
            flags = set(re.findall(r"--([A-Za-z][A-Za-z0-9_]*)", out))
        self._cache[name] = flags
        return flags

    def all_flags(self, names):
        """Flags of kvmem-server, every subcommand, and the binaries named
        (only those: a binary is run with --help only when the docs name it)."""
        flags = set(self.server)
        for f in self.subcommands.values():
            flags |= f
        for name in sorted(names):
            flags |= self.other(name) or set()
        return flags


def normal(name):
    return name.replace("-", "_")


def known(name, flags):
    n = normal(name)
    return (n in flags or n in BUILTIN_FLAGS or
            (n.startswith("no") and n[2:] in flags))


def tokens_of(text):
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=True)
        lex.whitespace_split = False
        return list(lex)
    except ValueError:
        return text.split()


def commands(text, separators="&|;()<>"):
    """[(program, args)] of the shell commands in text."""
    out, cur = [], []
    for t in tokens_of(text):
        if t and all(c in separators for c in t):
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        out.append(cur)
    result = []
    for c in out:
        i = 0
        while i < len(c) and (c[i] in WRAPPERS or
                              re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", c[i])):
            i += 1
        if i < len(c):
            result.append((os.path.basename(c[i]), c[i + 1:]))
    return result


def check_command(prog, args, programs, where, problems):
    """Checks the flags of one command line; False when prog is not ours."""
    flags = [m.group(1) for a in args for m in [FLAG_TOKEN.match(a)] if m]
    if prog == "kvmem-server":
        for f in flags:
            if not known(f, programs.server):
                problems.add(where, f"kvmem-server --{f}: `kvmem-server "
                                    "--help` has no such flag")
        return True
    if prog == "kvmem":
        sub = next((a for a in args if not a.startswith("-")), None)
        if sub is None or not re.fullmatch(r"[a-z]+", sub) or sub == "help":
            allowed, name = programs.cli_common, "kvmem"
            if sub not in (None, "help"):
                return True  # `kvmem demo:` in output, not a command line
        elif sub not in programs.subcommands:
            problems.add(where, f"kvmem {sub}: no such subcommand "
                                "(`kvmem --help` lists them)")
            return True
        else:
            allowed, name = programs.subcommands[sub], f"kvmem {sub}"
        for f in flags:
            if not known(f, allowed):
                problems.add(where, f"{name} --{f}: `{name} --help` has no "
                                    "such flag")
        return True
    if prog.startswith("kvmem"):
        allowed = programs.other(prog)
        if allowed is None:
            return True  # not built here (e.g. the fuzz build's binaries)
        for f in flags:
            if not known(f, allowed):
                problems.add(where, f"{prog} --{f}: `{prog} --help` has no "
                                    "such flag")
        return True
    return False


def invokes_ours(text):
    return re.search(r"(^|[\s/(])kvmem(-server|_\w+)?(\s|$)", text) is not None


def check_flags(docs, programs, problems):
    named = set()
    for d in docs:
        named |= set(re.findall(r"\bkvmem_[a-z0-9_]+", d.text))
    everything = programs.all_flags(
        n for n in named if os.path.isfile(os.path.join(programs.bin_dir, n)))
    for d in docs:
        # Code blocks: shell lines (continuations joined).
        pending, first = "", 0
        for line, lang, text in d.code + [(0, "", "")]:
            if lang not in SHELL_LANGS:
                continue
            if not pending:
                first = line
            if text.rstrip().endswith("\\"):
                pending += text.rstrip()[:-1] + " "
                continue
            full, pending = pending + text, ""
            for prog, args in commands(full.split(" #", 1)[0]):
                check_command(prog, args, programs, f"{d.rel}:{first}", problems)
        # Inline code: a command of ours, or flags named alone.
        for line, span in d.spans():
            where = f"{d.rel}:{line}"
            if invokes_ours(span):
                # Not split at parentheses: a quoted message may hold some.
                for prog, args in commands(span, separators="&|;"):
                    check_command(prog, args, programs, where, problems)
                continue
            cmds = commands(span)
            if cmds and not cmds[0][0].startswith("-"):
                continue  # another program's command line
            for tok in span.replace("[", " ").replace("]", " ").split():
                m = FLAG_TOKEN.match(tok)
                if m and not known(m.group(1), everything):
                    problems.add(where, f"--{m.group(1)}: no kvmem binary's "
                                        "--help has this flag")
        # Flags tables.
        for program, rows in d.flag_tables:
            prog_args = commands(program)
            if not prog_args:
                continue
            prog, args = prog_args[0]
            for line, row in rows:
                cells = row.strip().strip("|").split("|")
                first = re.findall(r"`(--[^`]+)`", cells[0]) if cells else []
                extra = [t for f in first for t in f.replace(",", " ").split()]
                if extra and not check_command(prog, args + extra, programs,
                                               f"{d.rel}:{line}", problems):
                    problems.add(f"{d.rel}:{line}", f"flags table of {program}: "
                                                    "not a kvmem program")


def check_toml(docs, programs, problems):
    settable = programs.server - {"config", "print_config"}
    for d in docs:
        section = None
        for line, lang, text in d.code:
            if lang != "toml":
                continue
            s = re.match(r"^\s*\[([^\]]+)\]", text)
            if s:
                section = s.group(1).strip()
                continue
            k = re.match(r"^\s*([A-Za-z0-9_]+)\s*=", text)
            if not k:
                continue
            key, where = k.group(1), f"{d.rel}:{line}"
            if section == "server" and key not in settable:
                problems.add(where, f"[server] {key} is not a kvmem-server flag")
            elif section == "stream_defaults" and \
                    key not in programs.stream_defaults:
                problems.add(where, f"[stream_defaults] {key} is not a key "
                                    "`kvmem-server --print_config` lists")


# ------------------------------------------------------------------ driver

def check(root, bin_dir, programs):
    problems = Problems()
    docs = [Doc(root, rel) for rel in markdown_files(root)]
    if not docs:
        problems.add(root, "no README.md or docs/*.md")
    check_links(root, docs, problems)
    check_paths(root, bin_dir, docs, problems)
    check_flags(docs, programs, problems)
    check_toml(docs, programs, problems)
    return docs, problems.lines


def selftest(root, bin_dir, programs):
    """Plants each kind of mistake in a copy of the docs; each must be caught,
    and the real docs must pass."""
    _, real = check(root, bin_dir, programs)
    if real:
        print("\n".join(real))
        print("FAIL: the docs themselves do not check")
        return 1
    plants = [
        ("a broken link", "See [the guide](no-such-guide.md).",
         "broken link no-such-guide.md"),
        ("a missing anchor", "See [recall](recall.md#no-such-heading).",
         "no heading #no-such-heading"),
        ("a missing path", "The planner is in `engine/recall/no_such_file.h`.",
         "path engine/recall/no_such_file.h does not exist"),
        ("a missing binary", "Run `build/bin/kvmem_no_such_tool`.",
         "path build/bin/kvmem_no_such_tool is not an executable"),
        ("an unknown server flag",
         "```\nbuild/bin/kvmem-server --data_dir=/tmp/x --no_such_flag=1\n```",
         "kvmem-server --no_such_flag"),
        ("a flag of another subcommand",
         "Try `kvmem stats --cameras=2`.", "kvmem stats --cameras"),
        ("an unknown subcommand", "```\nbuild/bin/kvmem frobnicate\n```",
         "kvmem frobnicate: no such subcommand"),
        ("an unknown flag named alone", "Set `--no_such_knob=3`.",
         "--no_such_knob: no kvmem binary"),
        ("a flags table row",
         "<!-- flags: kvmem-server -->\n| flag | default |\n|---|---|\n"
         "| `--no_such_limit` | 0 |", "kvmem-server --no_such_limit"),
        ("an unknown [server] key",
         "```toml\n[server]\nno_such_key = 1\n```",
         "[server] no_such_key is not a kvmem-server flag"),
        ("an unknown [stream_defaults] key",
         "```toml\n[stream_defaults]\nno_such_default = 1\n```",
         "[stream_defaults] no_such_default"),
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for what, text, expect in plants:
            tree = os.path.join(tmp, "tree")
            shutil.rmtree(tree, ignore_errors=True)
            os.makedirs(tree)
            for name in os.listdir(root):
                if name in ("README.md", "docs") or name.startswith("build"):
                    continue
                os.symlink(os.path.join(root, name), os.path.join(tree, name))
            shutil.copy(os.path.join(root, "README.md"), tree)
            shutil.copytree(os.path.join(root, "docs"),
                            os.path.join(tree, "docs"))
            guide = sorted(g for g in os.listdir(os.path.join(tree, "docs"))
                           if g.endswith(".md"))[0]
            with open(os.path.join(tree, "docs", guide), "a",
                      encoding="utf-8") as f:
                f.write("\n\n" + text + "\n")
            _, found = check(tree, bin_dir, programs)
            hit = [p for p in found if expect in p]
            if hit and all(f"docs/{guide}:" in p for p in found):
                print(f"caught {what}: {hit[0]}")
            else:
                failed += 1
                print(f"FAIL: {what} not reported as '{expect}'; got: {found}")
    print("PASS" if not failed else f"FAIL: {failed} plants not caught")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("bin_dir")
    ap.add_argument("--server")
    ap.add_argument("--cli")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    root = os.path.abspath(a.src)
    bin_dir = os.path.abspath(a.bin_dir)
    server = a.server or os.path.join(bin_dir, "kvmem-server")
    cli = a.cli or os.path.join(bin_dir, "kvmem")
    for b in (server, cli):
        if not os.access(b, os.X_OK):
            print(f"check_docs: {b} is not an executable", file=sys.stderr)
            return 2
    programs = Programs(bin_dir, server, cli)
    if a.selftest:
        return selftest(root, bin_dir, programs)
    docs, problems = check(root, bin_dir, programs)
    for p in problems:
        print(p)
    print(f"check_docs: {len(docs)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
