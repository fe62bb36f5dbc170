"""Hypothesis strategies for valid trace records, shared by the trace tests."""

from __future__ import annotations

from hypothesis import strategies as st

from libra.trace.records import FINISHES, FINISHES_WITH_TRAILING_TOOL, OUTCOMES, Trajectory, Turn

ids = st.text(min_size=1, max_size=12)
tool_names = st.sampled_from(["bash", "python", "search", "édit", "a\u2028b"]) | st.text(min_size=1, max_size=6)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
latency = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.integers(0, 10**6).map(float)


@st.composite
def tool_turn(draw: st.DrawFn) -> Turn:
    return Turn(
        gen_tokens=draw(st.integers(0, 10**7)),
        tool=draw(tool_names),
        tool_latency_s=draw(latency),
        tool_tokens=draw(st.integers(0, 10**7)),
        outcome=draw(st.none() | st.sampled_from(OUTCOMES)),
    )


@st.composite
def trajectory(draw: st.DrawFn, max_step: int = 6) -> Trajectory:
    finish = draw(st.none() | st.sampled_from(FINISHES))
    turns = draw(st.lists(tool_turn(), min_size=0, max_size=5))
    if finish in FINISHES_WITH_TRAILING_TOOL and draw(st.booleans()):
        turns.append(draw(tool_turn()))
    else:
        turns.append(Turn(draw(st.integers(0, 10**7)), None))
    return Trajectory(
        id=draw(ids),
        step=draw(st.integers(0, max_step)),
        prompt_tokens=draw(st.integers(1, 10**7)),
        turns=tuple(turns),
        group=draw(st.none() | st.text(max_size=5)),
        reward=draw(st.none() | finite),
        finish=finish,
    )


trajectory_lists = st.lists(trajectory(), min_size=0, max_size=25, unique_by=lambda t: t.id)
