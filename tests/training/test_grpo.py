"""GRPO maths against numbers worked out by hand (each hand computation is in a comment)."""

from __future__ import annotations

import math

import pytest
import torch

from training.grpo import (
    AGGREGATIONS,
    RATIO_LEVELS,
    GRPOSettings,
    aggregate,
    clipped_surrogate,
    entropy_from_logits,
    group_advantages,
    grpo_loss,
    importance_ratio,
    kl_k3,
    sft_loss,
    token_logprobs,
    trainable_turns,
    truncated_is_weight,
    zero_variance_groups,
)
from training.types import Turn

LN2, LN5 = math.log(2.0), math.log(5.0)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # [2, 3]: row 0 has 2 tokens, row 1 has 1; N = 3


def close(actual, expected, tol=1e-5):
    return torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        rtol=tol,
        atol=tol,
    )


# --- group advantages ------------------------------------------------------------------------------


def test_group_advantages_two_groups_of_two():
    # group a = [1, 0]: mean 0.5, sample std sqrt((0.25 + 0.25) / 1) = sqrt(0.5) = 0.707107
    # -> (1 - 0.5) / 0.707107 = +0.707107 and -0.707107; group b = [1, 0] likewise.
    adv = group_advantages([1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"])
    close(adv, [0.707107, -0.707107, 0.707107, -0.707107])


def test_group_advantages_scale_single_and_flat_groups():
    # keys interleaved, tuple keys as the trainer uses them: (role, task)
    a, b, c = ("executor", "t1"), ("executor", "t2"), ("meta_thinker", "t1")
    rewards = [0.0, 3.0, 2.0, 3.0, 4.0, 7.0]
    keys = [a, b, a, b, a, c]
    # a = [0, 2, 4]: mean 2, sample std sqrt((4 + 0 + 4) / 2) = 2 -> scaled [-1, 0, 1], unscaled [-2, 0, 2]
    # b = [3, 3]: flat -> 0, 0;  c = [7]: group of one -> 0
    close(group_advantages(rewards, keys), [-1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    assert group_advantages(rewards, keys, scale=False) == [-2.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    # flat groups are exactly 0 even when the float mean is not exact: mean(0.1, 0.1, 0.1) != 0.1
    assert group_advantages([0.1, 0.1, 0.1], ["k"] * 3) == [0.0, 0.0, 0.0]


def test_trainable_turns_drop_flat_groups_and_turns_without_generated_tokens():
    def turn(role, group, reward, mask=(1,)):
        return Turn(role, group, (1,), (2,) * len(mask), mask, (0.0,) * len(mask), reward)

    turns = [
        turn("executor", "a", 1.0),
        turn("executor", "a", 0.0),
        turn("executor", "a", 0.0, mask=(0,)),  # only observation tokens: nothing to learn from
        turn("meta_thinker", "a", 1.0),  # (meta_thinker, a) = [1, 1]: flat
        turn("meta_thinker", "a", 1.0),
        turn("executor", "b", 0.5),  # a group of one: flat
    ]
    # (executor, a) = [1, 0, 0] varies: its two turns with a generated token train, in order
    assert trainable_turns(turns, filter_zero_variance=True) == turns[:2]
    assert trainable_turns(turns, filter_zero_variance=False) == turns[:2] + turns[3:]


def test_trainable_turns_by_outcome_drop_groups_all_right_or_all_wrong():
    def turn(group, reward, correct):
        return Turn("meta_thinker", group, (1,), (2,), (1,), (0.0,), reward, correct=correct)

    turns = [
        turn("mixed", 1.0, True),  # right and wrong: trained both ways
        turn("mixed", -0.25, False),
        turn("wrong", -0.25, False),  # all wrong, a format penalty apart: rewards vary, outcomes do not
        turn("wrong", -0.5, False),
        turn("right", 1.0, True),  # all right, a penalty apart
        turn("right", 0.75, True),
        turn("flat", 1.0, True),  # all right and equal: dropped either way
        turn("flat", 1.0, True),
    ]
    assert trainable_turns(turns, filter_zero_variance=True) == turns[:6]
    assert trainable_turns(turns, filter_zero_variance=True, by="outcome") == turns[:2]
    assert trainable_turns(turns, filter_zero_variance=False, by="outcome") == turns
    with pytest.raises(ValueError, match="needs graded turns"):
        trainable_turns([turn("x", 1.0, None)], filter_zero_variance=True, by="outcome")
    with pytest.raises(ValueError, match="must be one of"):
        trainable_turns(turns, filter_zero_variance=True, by="accuracy")
    with pytest.raises(ValueError, match="zero_variance_of must be one of"):
        GRPOSettings(zero_variance_of="accuracy")
    with pytest.raises(ValueError, match="set grpo.filter_zero_variance=true"):
        GRPOSettings(zero_variance_of="outcome", filter_zero_variance=False)


def test_group_advantages_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in length"):
        group_advantages([1.0, 2.0], ["a"])


def test_zero_variance_groups():
    # a = [1, 1] flat, b = [0, 1] varies, c = [5] alone (no signal either)
    assert zero_variance_groups([1.0, 1.0, 0.0, 1.0, 5.0], ["a", "a", "b", "b", "c"]) == {"a", "c"}
    # within eps counts as equal
    assert zero_variance_groups([1.0, 1.0 + 1e-9], ["a", "a"], eps=1e-6) == {"a"}
    assert zero_variance_groups([1.0, 1.1], ["a", "a"], eps=1e-6) == set()


# --- logits -> per-token quantities ------------------------------------------------------------------


def test_token_logprobs_by_hand_and_with_temperature():
    # logits [0, ln2, ln5]: exp = [1, 2, 5], sum 8 -> p = [1/8, 2/8, 5/8]
    logits = torch.tensor([[[0.0, LN2, LN5], [0.0, LN2, LN5]]])  # [1, 2, 3]
    targets = torch.tensor([[2, 0]])
    close(token_logprobs(logits, targets), [[math.log(5 / 8), math.log(1 / 8)]])
    # temperature 2: logits / 2 -> exp = [1, sqrt 2, sqrt 5], sum 4.650282
    # -> log p(2) = ln 2.236068 - ln 4.650282 = 0.804719 - 1.536928 = -0.732209, log p(0) = -1.536928
    close(token_logprobs(logits, targets, temperature=2.0), [[-0.732209, -1.536928]])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)


def test_token_logprobs_matches_full_log_softmax_and_has_grad():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.bfloat16, requires_grad=True)  # [B, T, V]
    targets = torch.randint(0, 11, (3, 5))  # [B, T]
    out = token_logprobs(logits, targets, temperature=0.7)
    full = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert out.shape == (3, 5) and out.dtype == torch.float32
    close(out, full)
    out.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_entropy_from_logits():
    # uniform over 4 -> ln 4 = 1.386294
    # p = [1/8, 2/8, 5/8]: H = (1/8) ln 8 + (1/4) ln 4 + (5/8) ln(8/5)
    #                        = 0.259930 + 0.346574 + 0.293752 = 0.900256
    uniform = torch.zeros(1, 1, 4)
    skewed = torch.tensor([[[0.0, LN2, LN5]]])
    close(entropy_from_logits(uniform), [[math.log(4.0)]])
    close(entropy_from_logits(skewed), [[0.900256]])
    # a huge temperature flattens anything towards uniform: ln 3
    close(entropy_from_logits(skewed, temperature=1e6), [[math.log(3.0)]])


def test_kl_k3():
    # lp = ln 0.5, ref = ln 0.25: d = ref - lp = -ln 2 -> exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    # lp = ln 0.25, ref = ln 0.5: d = ln 2 -> 2 - 0.693147 - 1 = 0.306853;  equal -> 0
    lp = torch.tensor([[math.log(0.5), math.log(0.25), -1.3]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -1.3]])
    close(kl_k3(lp, ref), [[0.193147, 0.306853, 0.0]])
    torch.manual_seed(0)
    assert (kl_k3(torch.randn(4, 7), torch.randn(4, 7)) >= 0).all()


# --- ratio, surrogate, aggregation -------------------------------------------------------------------


def test_importance_ratio_token_level():
    # lp - old = [ln 2, 0, -ln 2] -> [2, 1, 0.5]; a masked token has ratio 1 whatever its values
    lp = torch.tensor([[LN2, 0.0, -LN2], [0.3, 40.0, 0.0]])
    old = torch.zeros(2, 3)
    close(
        importance_ratio(lp, old, torch.tensor([[1, 1, 1], [1, 0, 0]]), "token"),
        [[2, 1, 0.5], [1.349859, 1, 1]],
    )


def test_importance_ratio_turn_and_sequence_levels():
    # row log-ratios, mask MASK (row 0: 2 tokens, row 1: 1 token), third row all masked
    lp = torch.tensor([[0.2, 0.4, 9.9], [0.6, 9.9, 9.9], [9.9, 9.9, 9.9]])
    old = torch.zeros(3, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # turn: row 0 mean (0.2 + 0.4) / 2 = 0.3 -> e^0.3 = 1.349859 on every token;
    #       row 1 mean 0.6 -> e^0.6 = 1.822119; row 2 has no tokens -> 1
    turn = importance_ratio(lp, old, mask, "turn")
    close(turn, [[1.349859] * 3, [1.822119] * 3, [1.0] * 3])
    close(importance_ratio(lp, old, mask, "sequence"), turn)  # no episode ids: one row = one sequence
    # sequence, rows 0 and 1 in episode 7: (0.2 + 0.4 + 0.6) / 3 = 0.4 -> e^0.4 = 1.491825;
    # row 2 alone in episode 3 with no tokens -> 1
    seq = importance_ratio(lp, old, mask, "sequence", episode_ids=torch.tensor([7, 7, 3]))
    close(seq, [[1.491825] * 3, [1.491825] * 3, [1.0] * 3])
    with pytest.raises(ValueError, match="ratio level"):
        importance_ratio(lp, old, mask, "word")


def test_importance_ratio_gradients_flow_through_logprobs_only():
    lp = torch.tensor([[0.2, 0.4, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    # turn: r = exp((lp0 + lp1) / 2) on 3 tokens; d(sum r)/d lp0 = 3 * r / 2 = 1.5 * 1.349859 = 2.024788
    importance_ratio(lp, old, mask, "turn").sum().backward()
    close(lp.grad, [[2.024788, 2.024788, 0.0]])
    assert old.grad is None


def test_clipped_surrogate():
    ratio = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]])
    # eps 0.2 / 0.28 -> clip(ratio) = [0.8, 1.0, 1.28]
    # A = +1: min([0.5, 1, 1.5], [0.8, 1, 1.28]) = [0.5, 1, 1.28] -> loss [-0.5, -1, -1.28]; clipped [F, F, T]
    # A = -2: min([-1, -2, -3], [-1.6, -2, -2.56]) = [-1.6, -2, -3] -> loss [1.6, 2, 3]; clipped [T, F, F]
    loss, clipped = clipped_surrogate(ratio, torch.tensor([1.0, -2.0]), eps_low=0.2, eps_high=0.28)
    close(loss, [[-0.5, -1.0, -1.28], [1.6, 2.0, 3.0]])
    assert clipped.tolist() == [[False, False, True], [True, False, False]]
    # per-token advantages [B, T] work the same
    loss_bt, _ = clipped_surrogate(ratio, torch.tensor([[1.0] * 3, [-2.0] * 3]), 0.2, 0.28)
    close(loss_bt, loss)


def test_aggregations_on_a_2x3_example():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # token-mean: (1 + 2 + 4) / 3 = 7/3;  seq-mean-token-mean: mean(1.5, 4) = 2.75;  dr-grpo: 7 / (2 * 4)
    close(aggregate(per_token, MASK, "token-mean"), 7 / 3)
    close(aggregate(per_token, MASK, "seq-mean-token-mean"), 2.75)
    close(aggregate(per_token, MASK, "dr-grpo", max_tokens=4), 0.875)
    # a row without tokens is left out of the row mean: mask [[1, 1, 0], [0, 0, 0]] -> 1.5, 1.5, 3/8
    empty_row = torch.tensor([[1, 1, 0], [0, 0, 0]])
    close(aggregate(per_token, empty_row, "seq-mean-token-mean"), 1.5)
    close(aggregate(per_token, empty_row, "token-mean"), 1.5)
    close(aggregate(per_token, empty_row, "dr-grpo", max_tokens=4), 0.375)
    for mode in ("token-mean", "seq-mean-token-mean"):  # nothing to train on -> 0, not NaN
        close(aggregate(per_token, torch.zeros(2, 3), mode), 0.0)


def test_aggregate_errors_name_the_problem():
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(torch.ones(2, 3), MASK, "dr-grpo")
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean.*dr-grpo"):
        aggregate(torch.ones(2, 3), MASK, "sum")


# --- the whole loss -----------------------------------------------------------------------------------

SETTINGS = {
    "eps_low": 0.2,
    "eps_high": 0.28,
    "beta": 0.0,
    "ratio_level": "token",
    "aggregation": "token-mean",
}


def test_grpo_loss_numbers_and_metrics():
    # ratios on masked tokens: 1.5, 1, 0.5 (the masked 7.0 would be e^7 but must not show); A = [1, -1]
    # row 0: ratio 1.5, A 1 -> clipped to 1.28, loss -1.28 (clipped); ratio 1 -> loss -1
    # row 1: ratio 0.5, A -1 -> min(-0.5, -0.8) = -0.8, loss 0.8 (clipped)
    # token-mean = (-1.28 - 1 + 0.8) / 3 = -0.493333; clip_fraction 2/3; ratio mean 1
    lp = torch.tensor([[math.log(1.5), 0.0, 7.0], [math.log(0.5), 0.0, 0.0]])
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    loss, m = grpo_loss(lp, old, None, adv, MASK, **SETTINGS)
    close(loss, -0.493333)
    expected = {"loss": -0.493333, "kl": 0.0, "clip_fraction": 2 / 3, "ratio_mean": 1.0}
    expected |= {"tis_weight_mean": 1.0, "tis_capped_fraction": 0.0, "tokens": 3.0}
    assert m.keys() == expected.keys()
    close([m[k] for k in expected], list(expected.values()))
    # with ref = 0: k3 at d = ref - lp = [-ln 1.5, 0, ln 2] = [0.666667 + 0.405465 - 1, 0, 2 - 0.693147 - 1]
    #   = [0.072132, 0, 0.306853] -> kl mean 0.378985 / 3 = 0.126328
    # beta 0.1: loss = -0.493333 + 0.1 * 0.126328 = -0.480700
    ref = torch.zeros(2, 3)
    loss, m = grpo_loss(lp, old, ref, adv, MASK, **(SETTINGS | {"beta": 0.1}))
    close(loss, -0.480700)
    close(m["kl"], 0.126328)
    # the KL is reported even when it is not in the loss
    loss0, m0 = grpo_loss(lp, old, ref, adv, MASK, **SETTINGS)
    close(loss0, -0.493333)
    close(m0["kl"], 0.126328)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(lp, old, None, adv, MASK, **(SETTINGS | {"beta": 0.1}))


def test_truncated_is_weight_by_hand():
    # trainer / rollout per masked token: 0.5 / 0.25 = 2 -> capped at 1.5; 0.25 / 0.5 = 0.5; 1 / 1 = 1
    trainer = torch.tensor([[math.log(0.5), math.log(0.25), 9.0], [0.0, 0.0, 0.0]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.5), 0.0], [0.0, 0.0, 0.0]])
    close(truncated_is_weight(trainer, rollout, MASK, cap=1.5), [[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]])
    # turn level: row 0's mean log weight (ln 2 - ln 2) / 2 = 0 -> 1 on both tokens
    close(truncated_is_weight(trainer, rollout, MASK, cap=1.5, level="turn"), torch.ones(2, 3))
    # no gradient flows into the weight
    lp = trainer.clone().requires_grad_(True)
    assert not truncated_is_weight(lp, rollout, MASK, cap=1.5).requires_grad


def test_grpo_loss_with_truncated_importance_sampling():
    # The ratio against the trainer's own logprobs is 1 (nothing clipped); rollout logprobs differ:
    # weights w = [min(e^0.5, 2), e^-1, e^1 -> 2 capped] = [1.648721, 0.367879, 2]; A = [1, -1]
    # per-token loss -A * w = [-1.648721, -0.367879, 2] -> token-mean (-1.648721 - 0.367879 + 2) / 3
    #   = -0.005533; d/d lp_t = -A_t * w_t / 3 = [-0.549574, -0.122626, 0.666667]
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    rollout = torch.tensor([[-1.5, -1.0, 0.0], [-1.5, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, m = grpo_loss(lp, lp.detach(), None, adv, MASK, rollout_logprobs=rollout, tis_cap=2.0, **SETTINGS)
    close(loss, -0.005533)
    loss.backward()
    close(lp.grad, [[-0.549574, -0.122626, 0.0], [0.666667, 0.0, 0.0]])
    close([m["clip_fraction"], m["tis_weight_mean"], m["tis_capped_fraction"]], [0.0, 4.016600 / 3, 1 / 3])
    with pytest.raises(ValueError, match="rollout_logprobs"):
        grpo_loss(lp, lp.detach(), None, adv, MASK, tis_cap=2.0, **SETTINGS)


@pytest.mark.parametrize("level", ["token", "turn", "sequence"])
def test_grpo_loss_gradient_at_ratio_one(level):
    # lp == old -> ratio 1, nothing clipped; token-mean loss = -sum_t A_t * r_t / N with N = 3.
    # token: d/d lp_t = -A / N.  turn: each of a row's n tokens carries r = exp(mean), so
    # d/d lp_s = -(n * A * r / n) / N = -A / N as well; sequence (one row per episode here) is turn.
    # A = [1, -2] -> [[-1/3, -1/3, 0], [2/3, 0, 0]]
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]], requires_grad=True)
    loss, _ = grpo_loss(
        lp, lp.detach().clone(), None, torch.tensor([1.0, -2.0]), MASK, **(SETTINGS | {"ratio_level": level})
    )
    loss.backward()
    close(lp.grad, [[-1 / 3, -1 / 3, 0.0], [2 / 3, 0.0, 0.0]])


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("level", RATIO_LEVELS)
def test_masked_tokens_contribute_nothing(aggregation, level):
    torch.manual_seed(0)
    lp, old, ref = torch.randn(2, 3) * 0.1, torch.randn(2, 3) * 0.1, torch.randn(2, 3) * 0.1
    adv = torch.tensor([0.7, -1.2])
    kwargs = SETTINGS | {"beta": 0.05, "ratio_level": level, "aggregation": aggregation, "max_tokens": 3}
    ids = torch.tensor([0, 0])
    loss, metrics = grpo_loss(lp, old, ref, adv, MASK, episode_ids=ids, **kwargs)
    off = MASK == 0
    lp2, old2, ref2 = lp.masked_fill(off, 30.0), old.masked_fill(off, -30.0), ref.masked_fill(off, 5.0)
    loss2, metrics2 = grpo_loss(lp2, old2, ref2, adv, MASK, episode_ids=ids, **kwargs)
    close(loss2, loss)
    assert metrics2 == pytest.approx(metrics)


def test_sft_loss():
    # masked lp = [ln 0.5, ln 0.25, ln 1] -> NLL mean (0.693147 + 1.386294 + 0) / 3 = 0.693147
    lp = torch.tensor([[math.log(0.5), math.log(0.25), -99.0], [0.0, -99.0, -99.0]])
    close(sft_loss(lp, MASK), 0.693147)


def test_settings_validate_with_the_setting_name():
    assert GRPOSettings().loss_kwargs()["ratio_level"] == "token"
    bad = [
        ({"ratio_level": "word"}, "ratio_level.*token.*turn.*sequence"),
        ({"aggregation": "sum"}, "aggregation.*token-mean"),
        ({"aggregation": "dr-grpo"}, "max_tokens"),
        ({"eps_low": 1.0}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"beta": -1.0}, "beta"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tis_cap": 0.5}, "tis_cap.*null"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            GRPOSettings(**kwargs)
    assert GRPOSettings(aggregation="dr-grpo", max_tokens=256).loss_kwargs()["max_tokens"] == 256
