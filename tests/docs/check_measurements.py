#!/usr/bin/env python3
"""Measured figures live in the performance pages (docs/performance.md and the
docs/performance-*.md pages it links), each with the command that produced it; the other
pages of docs/ give the reasoning in words and link there. This catches, in the prose of
those other pages (fenced code and inline code left out), the shapes an inline
measurement takes:

- a time or a rate set against another figure: "35 µs against 62", "25 ms instead of
  8.5", "9.5 GB/s against 6.5" (units ns, µs, us, ms, GB/s, GiB/s, MB/s, MiB/s; plain
  seconds are left out, since the planner's estimates and the timeouts are given in them);
- a ratio or share of speed: "4× slower", "4–8% faster";
- a ratio against another implementation: "1.50× Open MPI", "0.17× PyTorch".

Design constants ("busy-polls for 20 µs", "a 1 MiB threshold") and computed estimates do
not take these shapes.

    check_measurements.py REPO_ROOT
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_links import prose  # noqa: E402  (the same reading of the pages' prose)

NUMBER = r"\d+(?:\.\d+)?"
SHAPES = [
    ("a timing or rate against another figure",
     re.compile(NUMBER + r"\s*(?:ns|µs|us|ms|GB/s|GiB/s|MB/s|MiB/s)\b[^.;()]{0,40}?"
                r"\b(?:against|instead of)\s+(?:about\s+)?\d")),
    ("a measured speed-up or slow-down",
     re.compile(NUMBER + r"\s*(?:%|×|x)\s+(?:faster|slower)\b")),
    ("a ratio against another implementation",
     re.compile(NUMBER + r"\s*×\s+(?:Open MPI|MPI|PyTorch|fully_shard|memcpy)")),
]
PERFORMANCE_PAGE = re.compile(r"^performance(?:-[\w-]+)?\.md$")

# The shapes against lines they must and must not catch, so that a change to them that
# stops catching the figures this rule exists for, or starts catching constants, fails.
MUST_CATCH = [
    "(2 ranks, a 1 MiB all-gather in 35 µs against 62)",
    "take 5.1 ms instead of 7.5.",
    "(2 ranks, 64 MiB: 9.5 GB/s against 6.5)",
    "4.2 GB/s busbw that way against 5.5",
    "TCP over loopback: 4× slower",
    "(2 ranks, 64–256 MiB: 4–8% faster in the same processes)",
    "1.28–1.50× Open MPI in the same processes",
]
MUST_PASS = [
    "busy-polls for 20 µs, then yields; a yield that took > 2 µs",
    "the rendezvous threshold is 1 MiB (unless `UCX_RNDV_THRESH` says otherwise)",
    "gathers within a host (0.28 s instead of 2.83 s)",
    "switches when the other way costs 10% less",
    "at most every 100 ms, a rank checks",
    "Over PCIe-class links (20 GB/s per rank) the step's 10.7 GB sent",
]


def catches(line):
    return [what for what, shape in SHAPES if shape.search(line)]


def self_check():
    wrong = [f"misses: {line}" for line in MUST_CATCH if not catches(line)]
    wrong += [f"catches a constant: {line}" for line in MUST_PASS if catches(line)]
    return wrong


def main():
    root = os.path.realpath(sys.argv[1])
    problems = self_check()
    docs = os.path.join(root, "docs")
    pages = sorted(f for f in os.listdir(docs)
                   if f.endswith(".md") and not PERFORMANCE_PAGE.match(f))
    for name in pages:
        with open(os.path.join(docs, name), encoding="utf-8") as f:
            lines = prose(f.read())
        for number, line in enumerate(lines, 1):
            for what in catches(line):
                problems.append(f"docs/{name}:{number}: {what} outside the performance pages "
                                f"(move it to docs/performance.md with its command): "
                                f"{line.strip()}")
    for p in problems:
        print(p)
    print(f"{len(pages)} pages checked for inline measurements: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
