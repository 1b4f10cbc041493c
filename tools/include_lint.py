#!/usr/bin/env python3
"""The include lint: every arrow between the engine's rooms points down.

The rule is written once, in docs/design.md (the line that starts "Rooms, lowest first:"): a file in
one room of engine/ may include the headers of its own room and of the rooms listed before it, never
of one listed after it. Besides: every engine file sits in a room (none at engine/'s top level), the
engine includes nothing of app/, kernels/, cli/ or tests/ and no GL, ImGui or CUDA header, and app/
and cli/ include nothing of kernels/ (the kernels register themselves with the engine's backend
registry, engine/ops/backend.h).

Usage: tools/include_lint.py [REPO_ROOT]   (exit status 0: clean, 1: arrows listed, 2: no rule found)
"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..'))
design = os.path.join(root, 'docs', 'design.md')
rule = None
with open(design, encoding='utf-8') as f:
    for line in f:
        m = re.match(r'\s*Rooms, lowest first:\s*(.+)$', line)
        if m:
            rule = [r.strip(' `.') for r in m.group(1).split('<')]
            break
if not rule:
    print(f'include_lint: {design} has no line "Rooms, lowest first: a < b < ..."')
    sys.exit(2)
rank = {room: i for i, room in enumerate(rule)}

include_re = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
forbidden_in_engine = re.compile(r'^(app|kernels|cli|tests)/|^(imgui|GL/|GLFW/|cuda|cub/|thrust/)')
problems = []


def sources(top):
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            if name.endswith(('.h', '.cpp', '.inc', '.cu', '.cuh')):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root), path


def includes(path):
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            m = include_re.match(line)
            if m:
                yield number, m.group(1)


for rel, path in sources('engine'):
    parts = rel.split('/')
    if len(parts) < 3:
        problems.append(f'{rel}: not in a room (move it into one of engine/{{{",".join(rule)}}}/)')
        continue
    room = parts[1]
    if room not in rank:
        problems.append(f'{rel}: engine/{room}/ is not a room of docs/design.md ("Rooms, lowest first")')
        continue
    for number, inc in includes(path):
        if forbidden_in_engine.match(inc):
            problems.append(f'{rel}:{number}: the engine includes {inc}')
            continue
        m = re.match(r'engine/([^/]+)/', inc)
        if not m:
            if inc.startswith('engine/'):
                problems.append(f'{rel}:{number}: {inc} is not in a room')
            continue
        target = m.group(1)
        if target not in rank:
            problems.append(f'{rel}:{number}: {inc} is not in a room of docs/design.md')
        elif rank[target] > rank[room]:
            problems.append(f'{rel}:{number}: {room} includes {inc}, a higher room ({target})')

for top in ('app', 'cli'):
    for rel, path in sources(top):
        for number, inc in includes(path):
            if inc.startswith('kernels/'):
                problems.append(f'{rel}:{number}: {top}/ includes {inc} (reach the kernels through '
                                'the backend registry, engine/ops/backend.h)')

for p in problems:
    print(p)
print(f'include_lint: {len(problems)} problem(s); rooms {" < ".join(rule)}')
sys.exit(1 if problems else 0)
