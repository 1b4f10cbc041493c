#!/usr/bin/env python3
"""kvscope-cli render --out X.svg for the plot views, parsed with xml.etree: the document is
well-formed SVG, its plot elements (paths) and labels (<text>) are there, the titles the views
draw are there as text, and nothing of the window around the view (menu bar, tab bar) is.

usage: check_svg.py KVSCOPE_CLI CAPTURE OUT_DIR
"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
# view -> strings that must appear as <text> content
EXPECTED = {
    "error": ["relative error", "keep ratio (log2 axis)"],
    "walk": ["p_i before clipping", "discrepancy vs random signs"],
    "teaching": ["vectors u_i, direction z and the signed prefix sums", "u1", "z"],
    "geometry": [],
    "tokens": ["sink"],
    "theory": ["discrepancy along the evaluati", "budget m (log2 axis)", "alpha, relative"],
}


def main():
    cli, capture, out_dir = sys.argv[1:4]
    os.makedirs(out_dir, exist_ok=True)
    failures = []
    for view, texts in EXPECTED.items():
        out = os.path.join(out_dir, f"cli_{view}.svg")
        r = subprocess.run([cli, "render", capture, "--view", view, "--out", out,
                            "--width", "1200", "--height", "800"],
                           capture_output=True, text=True, timeout=280)
        if r.returncode != 0:
            failures.append(f"{view}: render failed ({r.returncode}): {r.stderr.strip()}")
            continue
        try:
            root = ET.parse(out).getroot()
        except ET.ParseError as e:
            failures.append(f"{view}: not well-formed XML: {e}")
            continue
        if root.tag != NS + "svg":
            failures.append(f"{view}: root is {root.tag}, not svg")
            continue
        paths = root.findall(f".//{NS}path")
        labels = ["".join(t.itertext()) for t in root.findall(f".//{NS}text")]
        if len(paths) < 10:
            failures.append(f"{view}: only {len(paths)} paths")
        if len(labels) < 5:
            failures.append(f"{view}: only {len(labels)} text elements")
        for want in texts:
            if not any(want == l.strip() or want in l for l in labels):
                failures.append(f"{view}: no <text> holding {want!r}")
        for unwanted in ("File", "Help"):
            if any(l.strip() == unwanted for l in labels):
                failures.append(f"{view}: window chrome {unwanted!r} in the figure")
        print(f"{view}: {len(paths)} paths, {len(labels)} texts, {os.path.getsize(out)} bytes")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
