#!/usr/bin/env python3
"""An independent reading of a libfsdp2 trace: checks its structure and recomputes
`fsdp2-trace summary --json` from the events, then compares.

    trace_reference.py TRACE SUMMARY_JSON RANKS STEP_FROM STEP_TO

Definitions (docs/tracing.md, "Reading it"): an operation belongs to step N when its
args.step is N (else when it starts inside the step's slice); compute is the union of
forward/backward/optimizer/user slices of the rank minus its wait slices (the thread
blocked on an event inside an enclosing module's forward); communication is all_gather,
reduce_scatter, all_reduce (and broadcast, barrier for the step's union); hidden is the
part covered by compute. Exits 1 naming the first disagreement."""
import json
import sys

COMPUTE = {"forward", "backward", "optimizer", "user"}
COMM = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"}
MEM_KEYS = ["sharded_params", "sharded_grads", "unsharded_params", "unsharded_grads",
            "reduce_scatter", "optimizer_state", "post_forward_params"]
TOL_MS = 1e-6


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def subtract(xs, ys):
    """xs minus ys, both sorted disjoint unions."""
    out = []
    for a, b in xs:
        for c, d in ys:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append([a, c])
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append([a, b])
    return out


def intersect(xs, ys):
    """Length of the intersection of two unions of intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def fail(msg):
    print("trace_reference: " + msg)
    sys.exit(1)


def main():
    trace_path, summary_path, ranks, step_from, step_to = sys.argv[1:6]
    ranks, step_from, step_to = int(ranks), int(step_from), int(step_to)
    trace = json.load(open(trace_path))
    summary = json.load(open(summary_path))
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    counters = sorted((e for e in events if e["ph"] == "C"), key=lambda e: e["ts"])
    if sorted({e["pid"] for e in slices}) != list(range(ranks)):
        fail(f"ranks in the trace {sorted({e['pid'] for e in slices})}, want 0..{ranks - 1}")

    got = {(s["rank"], s["step"]): s for s in summary["steps"]}
    for rank in range(ranks):
        mine = [e for e in slices if e["pid"] == rank]
        busy = union([(e["ts"], e["ts"] + e["dur"]) for e in mine if e["cat"] in COMPUTE])
        waits = union([(e["ts"], e["ts"] + e["dur"]) for e in mine if e["cat"] == "wait"])
        compute = subtract(busy, waits)
        for step in range(step_from, step_to):
            win = [e for e in mine if e["cat"] == "step" and e["name"] == f"step {step}"]
            if len(win) != 1:
                fail(f"rank {rank}: {len(win)} slices 'step {step}'")
            w0, w1 = win[0]["ts"], win[0]["ts"] + win[0]["dur"]

            def belongs(e):
                s = e.get("args", {}).get("step")
                return s == step if s is not None else w0 <= e["ts"] <= w1

            comm = [e for e in mine if e["cat"] in COMM and belongs(e)]
            if ranks > 1 and not any(e["cat"] == "all_gather" for e in comm):
                fail(f"rank {rank} step {step}: no all-gather")
            u = union([(e["ts"], e["ts"] + e["dur"]) for e in comm])
            want = {
                "step_ms": (w1 - w0) / 1e3,
                "compute_ms": intersect(compute, [[w0, w1]]) / 1e3,
                "comm_ms": length(u) / 1e3,
                "hidden_ms": intersect(u, compute) / 1e3,
            }
            want["exposed_ms"] = want["comm_ms"] - want["hidden_ms"]
            s = got.get((rank, step))
            if s is None:
                fail(f"the summary has no rank {rank} step {step}")
            for key, value in want.items():
                if abs(s[key] - value) > TOL_MS:
                    fail(f"rank {rank} step {step}: {key} {s[key]} != {value}")
            modules = {}
            for e in comm:
                if e["cat"] not in ("all_gather", "reduce_scatter", "all_reduce"):
                    continue
                m = modules.setdefault(e["args"].get("module", ""), [0.0, 0.0, 0.0])
                d = e["dur"] / 1e3
                m[0 if e["cat"] == "all_gather" else 1] += d
                m[2] += intersect([[e["ts"], e["ts"] + e["dur"]]], compute) / 1e3
            listed = {m["module"]: m for m in s["modules"]}
            for name, (ag, rs, hidden) in modules.items():
                m = listed.get(name)
                if m is None:
                    fail(f"rank {rank} step {step}: module '{name}' missing from the summary")
                for key, value in (("all_gather_ms", ag), ("reduce_scatter_ms", rs),
                                   ("hidden_ms", hidden), ("exposed_ms", ag + rs - hidden)):
                    if abs(m[key] - value) > TOL_MS:
                        fail(f"rank {rank} step {step} {name}: {key} {m[key]} != {value}")
            # Peak bytes in use: the counter in effect at each moment of the window.
            mine_c = [c for c in counters if c["pid"] == rank]
            before = [c for c in mine_c if c["ts"] <= w0]
            inside = [c for c in mine_c if w0 < c["ts"] <= w1]
            totals = [sum(c["args"].get(k, 0) for k in MEM_KEYS) for c in before[-1:] + inside]
            if not totals:
                fail(f"rank {rank} step {step}: no memory counter in effect")
            if s["peak"]["bytes"] != max(totals):
                fail(f"rank {rank} step {step}: peak {s['peak']['bytes']} != {max(totals)}")
            if sum(s["peak"]["categories"][k] for k in MEM_KEYS) != max(totals):
                fail(f"rank {rank} step {step}: the peak's categories do not add up")
    print(f"trace_reference: {ranks} ranks x steps {step_from}..{step_to - 1} agree")


if __name__ == "__main__":
    main()
