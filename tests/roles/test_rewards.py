import pytest

from roles import EXECUTOR, META_THINKER, Outcome, RewardSpec, role_reward
from roles.spec import RoleConfigError, RoleSpec, check_roles

SPEC = RewardSpec(
    correct=1.0,
    wrong=0.0,
    format_penalty=0.2,
    tool_error_penalty=0.05,
    max_tool_error_penalty=0.2,
    leak_penalty=0.5,
)


@pytest.mark.parametrize(
    ("kind", "outcome", "expected"),
    [
        (EXECUTOR, Outcome(correct=True, format_ok=True), 1.0),
        (EXECUTOR, Outcome(correct=True, format_ok=False), 0.8),
        (EXECUTOR, Outcome(correct=False, format_ok=False), -0.2),
        (EXECUTOR, Outcome(correct=True, format_ok=True, tool_errors=2), 0.9),
        (EXECUTOR, Outcome(correct=True, format_ok=True, tool_errors=9), 0.8),  # capped at 0.2
        (META_THINKER, Outcome(correct=True, format_ok=True), 1.0),
        (META_THINKER, Outcome(correct=True, format_ok=True, leaked=True), 0.5),
        (META_THINKER, Outcome(correct=False, format_ok=False, leaked=True), -0.7),
        (META_THINKER, Outcome(correct=True, format_ok=True, tool_errors=3), 1.0),  # not its tools
    ],
)
def test_role_reward_by_hand(kind, outcome, expected):
    assert role_reward(kind, SPEC, outcome) == pytest.approx(expected)


def test_role_spec_rejects_unknown_placeholder_and_kind():
    with pytest.raises(RoleConfigError, match="roles.x.user_template"):
        RoleSpec(name="x", kind=EXECUTOR, system_prompt="s", user_template="{questoin}")
    with pytest.raises(RoleConfigError, match="kind"):
        RoleSpec(name="x", kind="planner", system_prompt="s")
    with pytest.raises(RoleConfigError, match="reflect_template"):
        RoleSpec(name="m", kind=META_THINKER, system_prompt="s")


def test_check_roles_needs_an_executor_and_one_meta_thinker():
    meta = RoleSpec(name="m", kind=META_THINKER, system_prompt="s", reflect_template="{work}")
    with pytest.raises(RoleConfigError, match="executor"):
        check_roles([meta])
    ex = RoleSpec(name="e", kind=EXECUTOR, system_prompt="s")
    with pytest.raises(RoleConfigError, match="at most one"):
        check_roles(
            [meta, RoleSpec(name="m2", kind=META_THINKER, system_prompt="s", reflect_template="{work}"), ex]
        )
    check_roles([meta, ex])
