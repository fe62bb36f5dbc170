"""The held-out evaluation ``libra-run`` prints before and after RL: episodes driven together
follow the same rules as one at a time, results are reproducible, and new weights change them."""

from __future__ import annotations

from runtime_markers import needs_torch

pytestmark = needs_torch

KINDS = {"math": 1.0, "math2": 1.0, "search": 1.0}


def _eval(state=None, n: int = 6, temperature: float = 0.0) -> dict[str, float]:
    from libra.runtime.heldout import heldout_eval
    from libra.runtime.tiny_model import DEFAULT_DIR

    return heldout_eval(DEFAULT_DIR, state, n, 999, KINDS, temperature, 40, 4, 512)


def test_batched_episodes_match_one_at_a_time() -> None:
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.episode import Episode
    from libra.runtime.evaluate import run_episode
    from libra.runtime.heldout import run_episodes
    from libra.runtime.protocol import prompt_text
    from libra.runtime.tasks import TaskSet
    from libra.runtime.tiny_model import DEFAULT_DIR, encode
    from libra.runtime.tools import ToolBox

    eng = TorchEngine(DEFAULT_DIR, seed=0)
    tools = ToolBox()
    tasks = TaskSet(KINDS, seed=5).batch(0, 5)

    def eps() -> list[Episode]:
        return [Episode(f"e{i}", 0, f"g{i}", t, encode(eng.tokenizer, prompt_text(t.question)), 4, 40, 512, 0.0, seed=i)
                for i, t in enumerate(tasks)]

    together = run_episodes(eng, eps(), tools, batch=3)
    eng.drop([e.traj_id for e in together])
    alone = [run_episode(eng, e, tools) for e in eps()]
    assert [e.context for e in together] == [e.context for e in alone]
    assert [e.reward for e in together] == [e.reward for e in alone]
    assert all(e.done for e in together)


def test_heldout_eval_is_reproducible_and_sees_new_weights() -> None:
    import torch

    a, b = _eval(), _eval()
    assert {k: v for k, v in a.items() if k != "eval_s"} == {k: v for k, v in b.items() if k != "eval_s"}
    assert a["n"] == 6 and 0.0 <= a["reward"] <= 1.0 and 0.0 <= a["used_tool"] <= 1.0
    kinds = [k for k in a if k.startswith("reward_")]
    assert kinds and set(kinds) <= {"reward_math", "reward_math2", "reward_search"}
    from transformers import AutoModelForCausalLM

    from libra.runtime.tiny_model import DEFAULT_DIR

    sd = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR).state_dict()
    gen = torch.Generator().manual_seed(0)
    noise = {k: torch.randn(v.shape, generator=gen) if v.dim() == 2 else v for k, v in sd.items()}  # an untrained policy
    c = _eval(noise)
    assert c["reward"] == 0.0 and c["well_formed_calls"] < a["well_formed_calls"]
