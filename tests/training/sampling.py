"""Whether a backend's samples follow the trainer's policy, not just report its logprobs.

A backend can report log_softmax(logits / T) of every token it samples and still sample from another
distribution (a wrong temperature, a generator reused across steps or requests). For tokens drawn from
q_t, log q_t(x_t) - E_q_t[log q_t] has mean zero given the tokens before it, so its sum over a sequence
has mean zero over sequences whatever their lengths: `surprise_z` is that mean over many seeded samples
in standard errors. A sampler off the policy moves it by many of them (the tests show how far).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from training.backbone import Backbone
from training.batch import collate, completion_logits
from training.types import GenerationRequest, GenerationResult, Turn


def policy_logits(backbone: Backbone, adapter: str | None, prompt, completion) -> torch.Tensor:
    """The trainer's logits predicting each completion token after `prompt`, [K, V], with role `adapter`
    (None: the bare backbone)."""
    n = len(completion)
    turn = Turn(adapter or "none", "g", tuple(prompt), tuple(completion), (1,) * n, (0.0,) * n)
    batch = collate([turn], backbone.tokenizer.pad_token_id)
    backbone.model.eval()
    with torch.no_grad():
        if adapter is None:
            with backbone.disabled_adapters():
                return completion_logits(backbone.model, batch)[0]
        backbone.activate(adapter)
        return completion_logits(backbone.model, batch)[0]


def sequence_surprise(
    backbone: Backbone, request: GenerationRequest, result: GenerationResult, temperature: float
) -> float:
    """Sum over the completion of log q(x_t) - E_q[log q] under the trainer's policy at `temperature`."""
    logits = policy_logits(backbone, request.adapter, request.prompt_ids, result.token_ids)
    logq = torch.log_softmax(logits.float() / temperature, dim=-1)  # [K, V]
    picked = logq.gather(-1, torch.tensor(result.token_ids).unsqueeze(-1)).squeeze(-1)
    expected = (logq.exp() * logq).sum(-1)
    return float((picked - expected).sum())


def surprise_z(
    backbone: Backbone,
    requests: Sequence[GenerationRequest],
    results: Sequence[GenerationResult],
    temperature: float,
) -> float:
    """Mean sequence surprise over the samples, in standard errors (about N(0, 1) for on-policy samples)."""
    values = [sequence_surprise(backbone, q, r, temperature) for q, r in zip(requests, results, strict=True)]
    return statistics.mean(values) / (statistics.stdev(values) / len(values) ** 0.5)
