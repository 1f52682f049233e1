"""The preference losses agree with TRL's DPOTrainer (the bench extra) on the same pairs and the same
reference logprobs: TRL's own forward pass and loss on one side, meta-agent's collate, token_logprobs
and preference_loss on the other."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_model import build_tiny_model
from tests.training.turns import chat_ids
from training.batch import collate, completion_logits
from training.grpo import token_logprobs
from training.preference import PreferenceSettings, preference_loss
from training.types import Turn

PAIRS = [  # (prompt, chosen completion, rejected completion), as token ids of the tiny model's tokenizer
    ("task 0", [30, 31, 32], [40, 41]),
    ("task one", [50], [60, 61, 62, 63]),
]
REFS = [(-21.5, -14.0), (-9.0, -30.25)]  # reference logprobs of each pair's chosen and rejected completion


@pytest.mark.parametrize(("loss", "trl_loss"), [("dpo", "sigmoid"), ("ipo", "ipo")])
def test_the_loss_agrees_with_trls_dpo_trainer(tokenizer, tmp_path, loss, trl_loss):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    model = build_tiny_model(tokenizer, seed=0)
    examples = [
        {
            "prompt_ids": list(chat_ids(tokenizer, prompt)),
            "chosen_ids": chosen,
            "rejected_ids": rejected,
            "ref_chosen_logps": ref_c,
            "ref_rejected_logps": ref_r,
        }
        for (prompt, chosen, rejected), (ref_c, ref_r) in zip(PAIRS, REFS, strict=True)
    ]
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        loss_type=[trl_loss],
        beta=0.3,
        precompute_ref_log_probs=True,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    # The trainer needs a data set to be built; the loss below is of our batch, collated by TRL's collator
    placeholder = Dataset.from_list([{"prompt": "a", "chosen": "b", "rejected": "c"}])
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=placeholder, processing_class=tokenizer)
    batch = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id)(examples)
    with torch.no_grad():
        theirs = float(trainer.compute_loss(trainer.model, batch))

    def turn(prompt, completion):
        ids = chat_ids(tokenizer, prompt)
        return Turn("r", "g", ids, tuple(completion), (1,) * len(completion), (0.0,) * len(completion))

    turns = [turn(p, c) for p, c, _ in PAIRS] + [turn(p, r) for p, _, r in PAIRS]
    batch = collate(turns, tokenizer.pad_token_id)
    with torch.no_grad():
        logps = (
            token_logprobs(completion_logits(trainer.model, batch), batch.targets) * batch.loss_mask
        ).sum(-1)
    n = len(PAIRS)
    refs = torch.tensor(REFS)
    losses, _ = preference_loss(
        logps[:n], logps[n:], refs[:, 0], refs[:, 1], batch.loss_mask[:n].sum(-1), batch.loss_mask[n:].sum(-1),
        PreferenceSettings(loss=loss, beta=0.3),
    )  # fmt: skip
    assert float(losses.mean()) == pytest.approx(theirs, rel=1e-5)
