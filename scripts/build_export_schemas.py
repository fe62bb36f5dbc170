"""Rebuild ``libra/export/schemas/*.keys``: the key lists ``libra-sim plan --emit`` validates
its output against, derived from each framework's own example configs and argument parsers.

Why derived and shipped: none of verl, AReaL, slime or NeMo RL installs without a GPU stack
(torch + vLLM/SGLang + Megatron), so the emitted configs cannot be checked with their config
classes in CI; the keys their own example configs (and, for slime, its argparse definitions)
declare are the documented schema. Each list records the repository, commit and files it came
from. Run with checkouts of the four repositories (git directories; ``fetch``-style bare ones work)::

    python scripts/build_export_schemas.py --verl DIR --areal DIR --slime DIR --nemo-rl DIR

Every key an emitter writes must be in its list (tests/test_export_emit.py checks each emitter's
output), so a key renamed upstream shows up when the lists are rebuilt.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parent.parent / "libra" / "export" / "schemas"

#: framework -> (repository, [(schema name, [files])]); a schema is the union of its files' keys
SOURCES: dict[str, tuple[str, list[tuple[str, list[str]]]]] = {
    "verl": ("volcengine/verl", [
        ("verl-ppo_trainer", ["verl/trainer/config/_generated_ppo_trainer.yaml"]),
        ("verl-ppo_megatron_trainer", ["verl/trainer/config/_generated_ppo_megatron_trainer.yaml"]),
        # the experimental layouts' configs extend ppo_trainer (Hydra defaults) with these keys
        ("verl-one_step_off", ["verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml"]),
        ("verl-fully_async", ["verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"]),
    ]),
    "areal": ("inclusionAI/AReaL", [
        ("areal-grpo", ["examples/math/gsm8k_grpo.yaml", "examples/math/gsm8k_grpo_megatron.yaml",
                        "examples/multi_turn_math/gsm8k_grpo_mt.yaml"]),
    ]),
    "nemo-rl": ("NVIDIA-NeMo/RL", [
        ("nemo-rl-grpo", ["examples/configs/grpo_math_1B.yaml", "examples/configs/grpo_math_1B_megatron.yaml",
                          "examples/configs/grpo_math_8B_megatron.yaml"]),
    ]),
}
SLIME_PARSERS = ["slime/utils/arguments.py", "slime/backends/sglang_utils/arguments.py",
                 "slime/backends/megatron_utils/arguments.py"]


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def _flat(d: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if not isinstance(d, dict):
        return out
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if key in ("defaults", "hydra") or key.startswith("hydra."):
            continue
        if isinstance(v, dict) and v:
            out |= _flat(v, key)
        else:
            out.add(key)
    return out


def dataclass_keys(source: str, root: str) -> set[str]:
    """Dotted keys of dataclass ``root`` in ``source`` read without importing it (AReaL's config
    classes import torch): its annotated fields and its bases', recursing into fields whose type
    names another dataclass of the file (``X | None`` too; containers such as ``list[X]`` are
    leaves)."""
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> list[tuple[str, ast.expr]]:
        node = classes[name]
        out: list[tuple[str, ast.expr]] = []
        for b in node.bases:
            if isinstance(b, ast.Name) and b.id in classes:
                out.extend(fields(b.id))
        seen = {f for f, _ in out}
        for st in node.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                if "ClassVar" in ast.unparse(st.annotation):
                    continue
                if st.target.id in seen:
                    out = [(f, a) for f, a in out if f != st.target.id]
                out.append((st.target.id, st.annotation))
        return out

    def nested(ann: ast.expr) -> str | None:
        if isinstance(ann, ast.Name) and ann.id in classes:
            return ann.id
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str) and ann.value in classes:
            return ann.value
        if isinstance(ann, ast.BinOp):  # X | None
            return nested(ann.left) or nested(ann.right)
        return None

    def walk(name: str, prefix: str, depth: int) -> set[str]:
        keys: set[str] = set()
        for f, ann in fields(name):
            sub = nested(ann)
            if sub is not None and depth < 8 and classes[sub].body:
                inner = walk(sub, f"{prefix}{f}.", depth + 1)
                keys |= inner if inner else {prefix + f}
            else:
                keys.add(prefix + f)
        return keys

    return walk(root, "", 0)


def _write(name: str, repo: str, commit: str, files: list[str], keys: set[str], kind: str) -> None:
    head = [f"# {kind} of {repo} at commit {commit}", "# derived from: " + ", ".join(files),
            "# by scripts/build_export_schemas.py; one key per line"]
    (OUT / f"{name}.keys").write_text("\n".join(head + sorted(keys)) + "\n")
    print(f"wrote {OUT / (name + '.keys')}: {len(keys)} keys")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("verl", "areal", "slime", "nemo-rl"):
        ap.add_argument(f"--{name}", required=True, metavar="GIT_DIR")
    args = ap.parse_args()
    dirs = {"verl": args.verl, "areal": args.areal, "slime": args.slime, "nemo-rl": args.nemo_rl}
    OUT.mkdir(parents=True, exist_ok=True)
    for fw, (repo, schemas) in SOURCES.items():
        commit = _git(dirs[fw], "rev-parse", "HEAD").strip()
        for name, files in schemas:
            keys: set[str] = set()
            for f in files:
                keys |= _flat(yaml.safe_load(_git(dirs[fw], "show", f"HEAD:{f}")))
            _write(name, repo, commit, files, keys, "Dotted config keys")
    # AReaL: its GRPO config dataclasses too (areal/api/cli_args.py, what load_expr_config checks keys against)
    d = dirs["areal"]
    commit = _git(d, "rev-parse", "HEAD").strip()
    keys = dataclass_keys(_git(d, "show", "HEAD:areal/api/cli_args.py"), "GRPOConfig")
    _write("areal-grpo-config", "inclusionAI/AReaL", commit, ["areal/api/cli_args.py (GRPOConfig and the dataclasses it nests)"],
           keys, "Dotted keys of the GRPOConfig dataclass")
    # slime: its own argparse flags, plus the Megatron-LM flags its launch scripts pass (Megatron's
    # parser lives in Megatron-LM; slime's scripts are the documented usage)
    d = dirs["slime"]
    commit = _git(d, "rev-parse", "HEAD").strip()
    flags: set[str] = set()
    for f in SLIME_PARSERS:
        flags |= set(re.findall(r'"(--[a-z0-9][a-z0-9-]*)"', _git(d, "show", f"HEAD:{f}")))
    scripts = [p for p in _git(d, "ls-tree", "-r", "--name-only", "HEAD").split() if re.match(r"scripts/(models/)?[^/]+\.sh$", p)]
    for f in scripts:
        flags |= set(re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)", _git(d, "show", f"HEAD:{f}")))
    _write("slime", "THUDM/slime", commit, SLIME_PARSERS + ["scripts/*.sh", "scripts/models/*.sh"], flags, "Launch flags")


if __name__ == "__main__":
    main()
