#!/usr/bin/env python3
"""Lists the C++ and CUDA functions longer than a limit (docs/design.md, "Short functions").

    tools/function_lengths.py [--limit 150] [--top N] [paths...]   (default: engine app kernels cli)

Functions still over the limit are listed in OVER_LIMIT with their length today: each is to be
split by its algorithm's steps and then removed from the list; none may grow meanwhile, and no
other function may pass the limit.

A function is a brace block opened at namespace or class scope after a header that holds a
parenthesis (a definition, a lambda bound at namespace scope); its length runs from the header's
first line to the closing brace. Comments and string literals are skipped. Exit status 1 when a
function is over the limit (the CTest `function_lengths` runs it), 0 otherwise. Generated tables
(files named *_table*.*) are left out.
"""
import argparse
import os
import re
import sys

# (file, function): lines today, for a function over the limit that is work left (none now:
# every function is at most 150 lines; a new entry needs a reason in its comment).
OVER_LIMIT = {}

SOURCE = re.compile(r".*\.(cpp|h|cu|cuh)$")
SCOPE = re.compile(r"^\s*(template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern)\b")


def strip(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c if j < n else "")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    # Preprocessor lines (and their continuations) are no part of a header.
    text = re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    line_of = [0] * (len(text) + 1)
    line = 1
    for k, ch in enumerate(text):
        line_of[k] = line
        if ch == "\n":
            line += 1
    stack = []  # per open brace: 'scope', 'function' or 'inner'
    header_start = 0
    starts = []
    for k, ch in enumerate(text):
        if ch in ";}":
            if ch == "}" and stack:
                kind = stack.pop()
                if kind[0] == "function":
                    yield kind[1], line_of[kind[2]], line_of[k]
            header_start = k + 1
        elif ch == "{":
            inside = any(s[0] in ("function", "inner") for s in stack)
            header = text[header_start:k]
            if inside:
                stack.append(("inner",))
            elif SCOPE.match(header.replace("\n", " ")) or "(" not in header:
                stack.append(("scope",))
            else:
                # Top-level '=' outside parentheses: an initializer (a table), not a body.
                depth, assigns = 0, False
                for m, hc in enumerate(header):
                    if hc == "(":
                        depth += 1
                    elif hc == ")":
                        depth -= 1
                    elif hc == "=" and depth == 0 and "operator" not in header[max(0, m - 10):m]:
                        assigns = "[" not in header  # a lambda bound at namespace scope counts
                if assigns:
                    stack.append(("inner",))
                else:
                    first = header_start + len(header) - len(header.lstrip())
                    names = [x for x in re.findall(r"([~\w:]+)\s*\(", header)
                             if not x.startswith("__")]  # __launch_bounds__(...) and the like
                    stack.append(("function", names[0] if names else "?", first))
            header_start = k + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--top", type=int, default=0, help="also list the N longest")
    ap.add_argument("paths", nargs="*", default=["engine", "app", "kernels", "cli"])
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for p in a.paths:
        p = os.path.join(root, p)
        walk = [(p, [], [os.path.basename(p)])] if os.path.isfile(p) else os.walk(p)
        for d, _, names in walk:
            for nm in names:
                f = os.path.join(d if os.path.isdir(d) else os.path.dirname(d), nm)
                if not SOURCE.match(nm) or "_table" in nm or not os.path.isfile(f):
                    continue
                for name, b, e in functions(f):
                    found.append((e - b + 1, os.path.relpath(f, root), b, name))
    found.sort(reverse=True)
    over = [x for x in found if x[0] > a.limit]
    for n, f, b, name in found[: max(a.top, len(over))]:
        known = OVER_LIMIT.get((f, name))
        mark = "" if n <= a.limit else " (listed: %d)" % known if known else " NEW"
        print(f"{n:5d}  {f}:{b}  {name}{mark}")
    bad = [x for x in over if x[0] > OVER_LIMIT.get((x[1], x[3]), a.limit)]
    for n, f, b, name in bad:
        known = OVER_LIMIT.get((f, name))
        why = f"grew from {known}" if known else f"is over {a.limit}"
        print(f"function_lengths: {f}:{b} {name} has {n} lines and {why}", file=sys.stderr)
    print(f"function_lengths: {len(over)} function(s) over {a.limit} lines, "
          f"{len(OVER_LIMIT)} listed as work left", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
