"""GAE and the value heads: hand-worked numbers, the heads' fit, the trainer's value pass, checkpoints."""

import pytest
import torch

from tests.tiny_model import build_tiny_backbone
from tests.training.turns import chat_ids
from training.backbone import AdapterConfig
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.grpo import GRPOSettings, advantages
from training.trainer import PolicyTrainer
from training.types import Turn
from training.value import ValueHeads, ValueSettings, check_estimator, explained_variance, gae, turn_gae

ROLES = ("meta_thinker", "executor")


def test_gae_by_hand():
    # rewards 0, 0, 1; values 0.5, 0.6, 0.8; gamma 1, lambda 0.9:
    # delta_2 = 1 + 0 - 0.8 = 0.2                         A_2 = 0.2
    # delta_1 = 0 + 0.8 - 0.6 = 0.2                       A_1 = 0.2 + 0.9 * 0.2 = 0.38
    # delta_0 = 0 + 0.6 - 0.5 = 0.1                       A_0 = 0.1 + 0.9 * 0.38 = 0.442
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.8], gamma=1.0, lam=0.9)
    assert adv == pytest.approx([0.442, 0.38, 0.2])
    assert ret == pytest.approx([0.942, 0.98, 1.0])
    # gamma 0.5, lambda 1: the discounted return minus the value, 0.25 - 0.5 and 0.5 - 0.6
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.8], gamma=0.5, lam=1.0)
    assert adv == pytest.approx([-0.25, -0.1, 0.2])
    assert ret == pytest.approx([0.25, 0.5, 1.0])
    # lambda 0: the one-step TD errors
    adv, _ = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.8], gamma=1.0, lam=0.0)
    assert adv == pytest.approx([0.1, 0.2, 0.2])
    with pytest.raises(ValueError, match="2 rewards and 1 values"):
        gae([0.0, 1.0], [0.5], gamma=1.0, lam=1.0)


def turn(role: str, episode: int, reward: float) -> Turn:
    return Turn(role, "task", (1, 2), (3,), (1,), (-0.5,), reward, episode)


def test_turn_gae_on_a_toy_episode():
    """Two episodes, turns in play order: a plan, the executor's work, a reflection, a second round's
    work. Each (episode, role) is its own trajectory, rewarded once, at its last turn."""
    turns = [
        turn("meta_thinker", 0, 1.0),  # plan, V 0.5
        turn("executor", 0, 0.8),  # round 1, V 0.4
        turn("meta_thinker", 0, 1.0),  # reflection, V 0.2
        turn("executor", 0, 0.8),  # round 2, V 0.6
        turn("meta_thinker", 1, 0.0),  # the second episode: one plan, V 0.3
        turn("executor", 1, 0.0),  # its work, V 0.1
    ]
    values = [0.5, 0.4, 0.2, 0.6, 0.3, 0.1]
    adv, ret = turn_gae(turns, values, gamma=1.0, lam=0.5)
    # meta-thinker of episode 0: delta_1 = 1 - 0.2 = 0.8, delta_0 = 0.2 - 0.5 = -0.3
    #   A_1 = 0.8, A_0 = -0.3 + 0.5 * 0.8 = 0.1
    # executor of episode 0: delta_1 = 0.8 - 0.6 = 0.2, delta_0 = 0.6 - 0.4 = 0.2; A_0 = 0.2 + 0.1 = 0.3
    # episode 1: one turn each, A = reward - V
    assert adv == pytest.approx([0.1, 0.3, 0.8, 0.2, -0.3, -0.1])
    assert ret == pytest.approx([0.6, 0.7, 1.0, 0.8, 0.0, 0.0])


def test_explained_variance_by_hand():
    assert explained_variance([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert explained_variance([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0)
    # errors 1, 0, -1 (mean 0, variance 2/3) against targets' variance 2/3 -> 0; a constant offset is free
    assert explained_variance([0.0, 2.0, 4.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0)
    assert explained_variance([6.0, 7.0, 8.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert explained_variance([0.0, 0.0], [1.0, 1.0]) == 0.0


def test_settings_are_checked():
    with pytest.raises(ValueError, match="value.lam must be in"):
        ValueSettings(lam=1.5)
    with pytest.raises(ValueError, match="filter_zero_variance=false"):
        GRPOSettings(advantage="gae")
    with pytest.raises(ValueError, match="reflection_credit=episode"):
        GRPOSettings(advantage="gae", filter_zero_variance=False, reflection_credit="round")
    GRPOSettings(advantage="gae", filter_zero_variance=False)
    with pytest.raises(ValueError, match="not taken from rewards alone"):
        advantages([1.0], [("r", "t")], "gae")


def test_a_head_learns_a_linear_value():
    """A target that is a linear function of the features is learnt: loss down, and from the second fit on
    the values the advantages would be taken with explain most of the target."""
    torch.manual_seed(0)
    heads = ValueHeads(["executor"], 8, ValueSettings(lr=0.05, fit_steps=100))
    x = torch.randn(32, 8)
    y = (x @ torch.linspace(-1, 1, 8) * 0.3 + 0.5).tolist()
    first = heads.fit("executor", x, y)
    assert first["value/executor/loss_after"] < 0.2 * first["value/executor/loss_before"]
    assert first["value/executor/explained_variance"] == 0.0  # a zero head: every state valued at 0
    second = heads.fit("executor", x, y)
    assert second["value/executor/explained_variance"] > 0.8


def fresh_trainer(tokenizer, value=None):
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, lora_b_std=0.05
    )
    return PolicyTrainer(backbone, {r: 1e-3 for r in ROLES}, value=value)


def test_the_value_pass_reads_each_prompts_last_state_under_its_roles_adapter(tokenizer):
    trainer = fresh_trainer(tokenizer, ValueSettings())
    prompts = [
        chat_ids(tokenizer, "a short task"),
        chat_ids(tokenizer, "a somewhat longer task to pad against"),
    ]
    turns = [
        Turn("executor", "t", prompts[0], (5,), (1,), (-1.0,), 1.0, 0),
        Turn("meta_thinker", "t", prompts[1], (5,), (1,), (-1.0,), 0.0, 0),
        Turn("executor", "t", prompts[1], (5,), (1,), (-1.0,), 0.0, 1),
    ]
    features = trainer.state_features(turns)
    assert features.shape == (3, 64) and features.dtype == torch.float32
    decoder = trainer.model.get_base_model().model
    for t, f in zip(turns, features, strict=True):  # one prompt alone, no padding: the same state
        trainer.backbone.activate(t.role)
        with torch.no_grad():
            alone = decoder(input_ids=torch.tensor([t.prompt_ids])).last_hidden_state[0, -1]
        assert torch.allclose(f, alone, atol=1e-5)
    assert not torch.allclose(features[1], features[2])  # one prompt, two adapters: two states
    values, _ = trainer.state_values(turns)
    assert values == [0.0, 0.0, 0.0]  # zero heads at the start
    adapters = [p.detach().clone() for r in ROLES for p in trainer.backbone.trainable_parameters(r)]
    metrics = trainer.value_step(turns, features, [1.0, 0.0, 0.0])
    assert set(metrics) >= {"value/executor/loss_after", "value/meta_thinker/loss_after"}
    assert metrics["value/executor/loss_after"] < metrics["value/executor/loss_before"]
    after = [p.detach() for r in ROLES for p in trainer.backbone.trainable_parameters(r)]
    assert all(torch.equal(a, b) for a, b in zip(adapters, after, strict=True))  # heads only
    moved, _ = trainer.state_values(turns)
    assert moved[0] > moved[2]  # the rewarded executor state is now valued higher


def test_value_heads_round_trip_through_a_checkpoint(tokenizer, tmp_path):
    trainer = fresh_trainer(tokenizer, ValueSettings())
    features = torch.randn(4, 64)
    trainer.values.fit("executor", features, [1.0, 0.0, 1.0, 0.0])
    save_checkpoint(tmp_path, 1, trainer, {})
    other = fresh_trainer(tokenizer, ValueSettings())
    load_checkpoint(tmp_path / "step-000001", other)
    assert torch.equal(
        other.values.predict("executor", features), trainer.values.predict("executor", features)
    )
    assert other.values.state()["optimizer"]["state"]  # Adam's moments came back too
    plain = fresh_trainer(tokenizer)
    save_checkpoint(tmp_path / "plain", 1, plain, {})
    with pytest.raises(CheckpointError, match="no value heads"):
        load_checkpoint(tmp_path / "plain" / "step-000001", fresh_trainer(tokenizer, ValueSettings()))


def estimator_turns(tokenizer) -> list[Turn]:
    prompts = [chat_ids(tokenizer, f"task number {k}") for k in range(3)]
    return [
        Turn("executor", "a", prompts[0], (5, 6), (1, 1), (-1.0, -1.0), 1.0, 0),
        Turn("meta_thinker", "a", prompts[1], (7,), (1,), (-1.0,), 0.0, 0),
        Turn("executor", "b", prompts[2], (8,), (1,), (-1.0,), 0.0, 1),
    ]


def test_the_trainers_value_heads_conform(tokenizer):
    check_estimator(fresh_trainer(tokenizer, ValueSettings()).value_estimator(), estimator_turns(tokenizer))


class ReadsTheReward:
    """An estimator that peeks at what a turn earned: no value of its state."""

    def estimate(self, turns):
        return [float(t.reward) for t in turns]

    def learn(self, turns, returns):
        return {}


class LearnsNothing:
    def estimate(self, turns):
        return [0.0 for _ in turns]

    def learn(self, turns, returns):
        return {}


@pytest.mark.parametrize(
    ("estimator", "rule"),
    [
        (ReadsTheReward(), "depends on what it wrote or earned"),
        (LearnsNothing(), "did not move the estimates"),
    ],
)
def test_the_conformance_check_catches_a_broken_estimator(tokenizer, estimator, rule):
    with pytest.raises(AssertionError, match=rule):
        check_estimator(estimator, estimator_turns(tokenizer))


def test_a_gae_runs_heads_load_from_its_checkpoint_and_value_prompts_as_the_trainer_does(tokenizer, tmp_path):
    """load_value_heads + prompt_states (what planner.value=head reads) give the trainer's state_values."""
    from training.checkpoint import load_value_heads
    from training.value import prompt_states

    trainer = fresh_trainer(tokenizer, ValueSettings())
    turns = estimator_turns(tokenizer)
    features = trainer.state_features(turns)
    trainer.value_step(turns, features, [1.0, 0.5, 0.0])
    save_checkpoint(tmp_path / "checkpoints", 3, trainer, {})
    heads = load_value_heads(tmp_path)  # the run folder: its newest checkpoint
    assert sorted(heads.heads) == sorted(ROLES)
    expected, _ = trainer.state_values(turns)
    backbone = trainer.backbone
    for t, value in zip(turns, expected, strict=True):
        backbone.activate(t.role)
        hidden = prompt_states(backbone.model, backbone.pad_id, [t.prompt_ids], backbone.device)
        assert float(heads.predict(t.role, hidden)[0]) == pytest.approx(value, abs=1e-5)
    plain = fresh_trainer(tokenizer)
    save_checkpoint(tmp_path / "plain", 1, plain, {})
    with pytest.raises(CheckpointError, match=r"planner.value_heads=.*no value heads .*grpo.advantage=gae"):
        load_value_heads(tmp_path / "plain")
    with pytest.raises(CheckpointError, match=r"^planner.value_heads=.*missing does not exist"):
        load_value_heads(tmp_path / "missing")
