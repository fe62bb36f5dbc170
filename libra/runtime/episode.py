"""One trajectory's state on the driver: its tokens, turns and where it stands in the
generate -> tool -> generate cycle. Pure bookkeeping, shared by the Ray rollout and the
in-process evaluator, so both follow the same multi-turn rules.

Rules: a turn that ends in ``</tool_call>`` calls a tool (its response is appended and the
trajectory continues) unless it is the ``max_tool_calls``-th call, after which the call still
runs and the trajectory ends (``finish="tool_limit"``); ``<|im_end|>`` ends it (``stop``); running
out of ``max_new_tokens`` in a turn or of ``max_context`` ends it (``length``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libra.runtime.engines.base import TurnRequest, TurnResult
from libra.runtime.protocol import ToolCall, parse_tool_call, tool_response_text
from libra.runtime.tasks import Task, reward
from libra.runtime.tools.base import ToolResult
from libra.scheduling.base import TrajectoryObservation
from libra.trace.records import Trajectory, Turn


@dataclass
class Episode:
    """A trajectory in flight (see the module docstring)."""

    traj_id: str
    step: int
    group: str
    task: Task
    prompt_ids: list[int]
    max_tool_calls: int = 4
    max_new_tokens: int = 64
    max_context: int = 1024
    temperature: float = 1.0
    seed: int = 0
    context: list[int] = field(default_factory=list)
    gen_mask: list[int] = field(default_factory=list)  # 1 where the policy generated the token
    turns: list[Turn] = field(default_factory=list)
    text: str = ""  # everything generated and returned, decoded
    finish: str | None = None
    pending_call: ToolCall | None = None
    _gen_tokens: int = 0
    fmt: Any = None  # the chat format (chat_format.for_tokenizer); None: the tiny policy's protocol
    # the engine's log-prob of each generated token (0.0 elsewhere), aligned with ``context``: the
    # behaviour policy's, for the async loop's importance correction (``grpo``)
    behaviour_logp: list[float] = field(default_factory=list)
    # the policy version that generated each turn, in order (``staleness``; the engine reports it)
    turn_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.context:
            self.context = list(self.prompt_ids)
            self.gen_mask = [0] * len(self.prompt_ids)
        if not self.behaviour_logp:
            self.behaviour_logp = [0.0] * len(self.context)

    @property
    def done(self) -> bool:
        return self.finish is not None

    def request(self) -> TurnRequest:
        """The next generation request (the whole context; see ``TurnRequest``)."""
        budget = max(0, min(self.max_new_tokens, self.max_context - len(self.context)))
        return TurnRequest(self.traj_id, tuple(self.context), budget, self.temperature, self.seed * 7919 + len(self.turns))

    def on_generation(self, res: TurnResult, decode: "callable") -> ToolCall | None:  # type: ignore[valid-type]
        """Append a turn's tokens; the tool call to run now, or None when the trajectory ended."""
        self.context += res.tokens
        self.gen_mask += [1] * len(res.tokens)
        lps = list(res.logprobs)
        self.behaviour_logp += lps if len(lps) == len(res.tokens) else [0.0] * len(res.tokens)
        self.turn_versions.append(int(res.extra.get("version", 0)))
        piece = decode(list(res.tokens))
        self.text += piece
        self._gen_tokens = len(res.tokens)
        parse = self.fmt.parse_tool_call if self.fmt is not None else parse_tool_call
        call = parse(piece) if res.finish == "stop" else None
        if call is None:
            self.turns.append(Turn(len(res.tokens), None))
            self.finish = "stop" if res.finish == "stop" else "length"
            return None
        self.pending_call = call
        return call

    def on_tool_result(self, result: ToolResult, response_ids: list[int], response_text: str) -> None:
        """Append the tool's return; ends the trajectory at the tool-call limit or context limit."""
        assert self.pending_call is not None
        self.context += response_ids
        self.gen_mask += [0] * len(response_ids)
        self.behaviour_logp += [0.0] * len(response_ids)
        self.text += response_text
        self.turns.append(Turn(self._gen_tokens, self.pending_call.name, round(result.latency_s, 6), len(response_ids), result.outcome))  # type: ignore[arg-type]
        self.pending_call = None
        if self.calls_done >= self.max_tool_calls:
            self.finish = "tool_limit"
        elif len(self.context) >= self.max_context - 1:
            self.finish = "length"

    @property
    def calls_done(self) -> int:
        """Tool calls that have returned."""
        return sum(1 for t in self.turns if t.tool is not None)

    @property
    def call_ends_trajectory(self) -> bool:
        """The pending call is the ``max_tool_calls``-th: it runs, then the trajectory ends
        (``tool_limit``), so there is nothing to route (the simulator does not route a trailing
        call either)."""
        return self.pending_call is not None and self.calls_done + 1 >= self.max_tool_calls

    def observation(self, index: int, instance: int | None, bucket: int | None, elapsed_s: float) -> TrajectoryObservation:
        """What a real system knows about this trajectory now, in the simulator's semantics
        (``sim/rollout.py``), so a router or a history model fitted on traces sees the same signal
        here as in a replay:

        * a call is starting (``pending_call`` set, routing at call start): ``at_call_start``,
          ``turns_done`` counts the turn that ends with this call, ``last_tool`` is the tool being
          called, ``last_outcome`` the PREVIOUS call's outcome (None before the first; this
          call's is unknown until it returns), ``context_tokens`` the context before its output;
        * otherwise (admission, finish): the completed turns, the last turn's tool and outcome
          (None at admission and after a turn without a tool), the whole context.
        """
        last = self.turns[-1] if self.turns else None
        calling = self.pending_call is not None
        return TrajectoryObservation(
            traj_id=self.traj_id, index=index, step=self.step, group=self.group, prompt_tokens=len(self.prompt_ids),
            context_tokens=len(self.context), turns_done=len(self.turns) + (1 if calling else 0),
            last_tool=self.pending_call.name if self.pending_call is not None else (last.tool if last else None),
            last_outcome=last.outcome if last else None, elapsed_s=elapsed_s, instance=instance, bucket=bucket,
            at_call_start=calling,
        )

    @staticmethod
    def response_text(result: ToolResult) -> str:
        """The text appended after a tool call (the tiny policy's protocol)."""
        return tool_response_text(result.output)

    def tool_text(self, result: ToolResult) -> str:
        """The text appended after this trajectory's tool call, in its chat format."""
        return self.fmt.response_text(result.output) if self.fmt is not None else tool_response_text(result.output)

    @property
    def reward(self) -> float:
        return reward(self.task, self.text)

    def abort(self) -> None:
        """End the trajectory now (it could not be completed)."""
        if self.pending_call is not None:
            self.turns.append(Turn(self._gen_tokens, self.pending_call.name, None, 0, None))
            self.pending_call = None
        if not self.turns:
            self.turns.append(Turn(0, None))
        self.finish = "abort"

    @property
    def sample_version(self) -> int:
        """The policy version of its oldest turn (``staleness.sample_version``)."""
        from libra.runtime.staleness import sample_version

        return sample_version(self.turn_versions)

    def to_trajectory(self) -> Trajectory:
        """The trace record (measured tool latencies, exact token counts, each turn's policy
        version; an aborted trajectory's trailing turn without a generation has none)."""
        from dataclasses import replace

        turns = tuple(replace(t, policy_version=self.turn_versions[i]) if i < len(self.turn_versions) else t
                      for i, t in enumerate(self.turns))
        return Trajectory(self.traj_id, self.step, len(self.prompt_ids), turns, self.group, self.reward, self.finish)  # type: ignore[arg-type]
