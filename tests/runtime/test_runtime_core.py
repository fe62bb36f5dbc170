"""Pure parts of the runtime: transcript parsing, tasks and rewards, GRPO advantages, config,
episode rules and plan pinning (no torch or ray needed)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from libra.errors import UserError
from libra.planner.plan import Bucket, Plan, RolloutInstance, TrainConfig
from libra.runtime.config import KEYS, RunConfig, load_config
from libra.runtime.engines.base import TurnResult
from libra.runtime.episode import Episode
from libra.runtime.grpo import group_advantages
from libra.policies.pinned import PlanPin, pin_plan
from libra.runtime.protocol import parse_answer, parse_tool_call, prompt_text
from libra.runtime.tasks import KINDS, TaskSet, corpus_facts, demo_completion, reward
from libra.runtime.tools.base import ToolResult


def test_parse_tool_call_and_answer() -> None:
    c = parse_tool_call("<tool_call>python\nprint(1+1)</tool_call>")
    assert c is not None and (c.name, c.args) == ("python", "print(1+1)")
    assert parse_tool_call("<answer>2</answer><|im_end|>") is None
    bad = parse_tool_call("garbage</tool_call>")
    assert bad is not None and bad.name == "invalid"
    assert parse_answer("x<answer> 42 </answer>y<answer>7</answer>") == "7"
    assert parse_answer("no answer") is None


def test_tasks_are_seeded_and_demos_earn_reward() -> None:
    ts = TaskSet({k: 1.0 for k in KINDS}, seed=3)
    a, b = ts.batch(5, 12), ts.batch(5, 12)
    assert a == b and ts.batch(6, 12) != a
    rng = random.Random(0)
    for t in a:
        demo = "".join(text for text, _ in demo_completion(t, rng, use_tool=True))
        assert reward(t, demo) == 1.0
        if t.kind == "search":
            country = t.question.rstrip("?").split()[-1]
            assert corpus_facts()[(country, "capital")] == t.answer
    with pytest.raises(UserError, match="unknown kind"):
        TaskSet({"poetry": 1.0})


def test_group_advantages() -> None:
    adv = group_advantages([1, 0, 1, 0, 1, 1], ["a", "a", "b", "b", "c", "c"])
    assert np.allclose(adv[:4], [1, -1, 1, -1], atol=1e-4)
    assert np.all(adv[4:] == 0)  # a group with equal rewards teaches nothing


def _episode() -> Episode:
    t = TaskSet({"math": 1}, seed=0).batch(0, 1)[0]
    return Episode("e0", 0, "g", t, [1, 2, 3], max_tool_calls=2, max_new_tokens=8, max_context=64)


def test_episode_multi_turn_rules() -> None:
    ep = _episode()
    dec = {10: "<tool_call>python\nprint(2)</tool_call>", 11: "<answer>2</answer><|im_end|>"}
    call = ep.on_generation(TurnResult("e0", (10,), (0.0,), "stop", 3, 0, 0, 0), lambda ids: dec[ids[0]])
    assert call is not None and call.name == "python"
    ep.on_tool_result(ToolResult("2", "ok", 0.01), [20, 21], "\n<tool_response>2</tool_response>\n")
    assert ep.gen_mask == [0, 0, 0, 1, 0, 0] and not ep.done
    assert ep.request().context == (1, 2, 3, 10, 20, 21)
    assert ep.on_generation(TurnResult("e0", (11,), (0.0,), "stop", 0, 6, 0, 0), lambda ids: dec[ids[0]]) is None
    tr = ep.to_trajectory()
    assert tr.finish == "stop" and [t.tool for t in tr.turns] == ["python", None] and tr.turns[0].tool_tokens == 2


def test_episode_tool_limit_and_length() -> None:
    ep = _episode()
    for _ in range(2):
        ep.on_generation(TurnResult("e0", (10,), (0.0,), "stop", 0, 0, 0, 0), lambda ids: "<tool_call>search\nx</tool_call>")
        ep.on_tool_result(ToolResult("r", "ok", 0.0), [5], "r")
    assert ep.finish == "tool_limit"
    ep2 = _episode()
    ep2.on_generation(TurnResult("e0", (9,) * 8, (0.0,) * 8, "length", 0, 0, 0, 0), lambda ids: "blah")
    assert ep2.finish == "length"


def test_config_yaml_toml_and_overrides(tmp_path) -> None:
    y = tmp_path / "r.yaml"
    y.write_text("steps: 5\ndevices: 6\ntasks: {math: 2}\n")
    cfg = load_config(str(y), {"steps": 2, "policy": None})
    assert (cfg.steps, cfg.devices, cfg.tasks) == (2, 6, {"math": 2})
    t = tmp_path / "r.toml"
    t.write_text('engine = "torch"\nsplit = "2:2"\n')
    assert load_config(str(t)).split_pair() == (2, 2)
    assert set(KEYS) == set(RunConfig.__dataclass_fields__)


@pytest.mark.parametrize("text, match", [
    ("stepz: 1\n", "unknown key"), ("devices: 1\n", "devices"), ("engine: tgi\n", "engine"),
    ("split: '3:3'\ndevices: 4\n", "split"), ("bucket_bounds: [90, 10]\n", "bucket_bounds"), ("faults: [{kill: disk}]\n", "faults"),
    ("steps: [\n", "cannot parse"),
])
def test_config_errors_name_the_key(tmp_path, text: str, match: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(UserError, match=match):
        load_config(str(p))


def test_pin_plan_split_and_buckets() -> None:
    plan = Plan(3, 1, TrainConfig(1, 1, 1), tuple(RolloutInstance(i, 1, 0, 0, i) for i in range(3)), (Bucket(0, 1, 0, None),))
    p = pin_plan(plan, PlanPin((2, 2), (40,), per_node=4))
    assert (p.n_rollout_gpus, p.n_train_gpus, p.train.dp) == (2, 2, 2)
    assert [b.max_context for b in p.buckets] == [40, None]
    assert sorted(i.bucket for i in p.instances) == [0, 1]
    assert prompt_text("q").startswith("<|im_start|>user\nq")
    from libra.runtime.policyglue import describe_plan

    line = describe_plan(p)  # the run's per-step plan log line
    assert line.startswith("split 2:2; rollout instances TP 1/1; buckets b0 TP1 [0, 40), b1 TP1 [40, inf); training TP1 PP1 DP2")


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys) -> None:
    from libra.runtime.cli import main

    p = tmp_path / "r.yaml"
    p.write_text("devices: 1\n")
    assert main(["--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "devices" in err and "Traceback" not in err
    assert main(["--config", str(tmp_path / "missing.toml")]) == 2


def test_every_flag_parses_to_the_type_its_key_takes() -> None:
    """Flags arrive as text; list keys (even those defaulting to None) are JSON, numbers numbers."""
    from libra.runtime.cli import _parser

    a = _parser().parse_args(["--bucket-bounds", "[40, 96]", "--eval-temperature", "0", "--tasks", '{"search": 1}', "--lr", "1e-4",
                              "--no-streaming"])
    cfg = load_config(None, {k: getattr(a, k) for k in KEYS})
    assert cfg.bucket_bounds == [40, 96] and cfg.eval_temperature == 0.0 and cfg.tasks == {"search": 1} and cfg.lr == 1e-4
    assert cfg.streaming is False


def test_max_context_beyond_the_models_window_is_a_config_error(tmp_path) -> None:
    pytest.importorskip("transformers")
    from libra.errors import UserError
    from libra.runtime.loop import Runner

    with pytest.raises(UserError, match="max_position_embeddings 1024"):
        Runner(load_config(None, {"max_context": 4096, "out": str(tmp_path / "run")}))
