"""Demonstration episodes: scripted ideal actions played through the real episode, calculator and grader."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from meta_agent.config import load_config
from meta_agent.demos.build import (
    GENERIC_PLAN,
    DemoError,
    Segment,
    arith_actions,
    arith_ops,
    check_lines,
    demo_path,
    distract_actions,
    gsm8k_actions,
    make_demos,
    plan_text,
    play_demo,
    read_demos,
    write_demos,
)
from meta_agent.episode.protocol import Limits
from meta_agent.episode.runner import EpisodeFactory
from meta_agent.tasks import Task, grade, grade_task, load_tasks, make_arith_tasks
from roles import Grammar, states_answer

N = 20
BROKEN = Task(
    "gsm8k/train/broken",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "72",
    "gsm8k",
    {
        "solution": "Natalia sold 48/2 = <<48/2=25>>25 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72.\n#### 72"
    },
)


@pytest.fixture(scope="module")
def demos(role_sets, chat, registry):
    """N arith and N gsm8k demonstrations of the default hierarchy, built once."""
    roles = role_sets["hierarchy"]
    return {name: make_demos(name, N, roles, chat, registry) for name in ("arith", "gsm8k")}


def masked_text(chat, turn, mask: int) -> str:
    return chat.decode([i for i, m in zip(turn.completion_ids, turn.mask, strict=True) if m == mask])


@pytest.mark.parametrize("name", ["arith", "gsm8k"])
def test_demos_grade_correct_with_real_tool_results_and_no_leak(demos, chat, role_sets, name):
    episodes = demos[name]
    assert len(episodes) == N
    assert len({ep.task.id for ep in episodes}) == N
    meta = next(r for r in role_sets["hierarchy"] if r.name == "meta_thinker")
    for ep in episodes:
        assert ep.done and ep.correct and not ep.truncated and not ep.leaked
        assert grade(ep.final_answer, ep.task.answer)
        assert [t.kind for t in ep.turns] == ["plan", "execute", "reflect"]
        plan, execute, reflect = ep.turns
        assert not states_answer(plan.text, ep.task.answer, meta.grammar)
        assert ep.rewards["meta_thinker"] == meta.reward.correct  # no leak and no format penalty
        assert ep.rewards["executor"] == 1.0 and ep.tool_errors == 0
        assert execute.tool_calls and all(c.name == "calculator" and c.ok for c in execute.tool_calls)
        observed = masked_text(chat, execute, 0)
        assert observed.count("<tool_result>") == len(execute.tool_calls)
        assert all(c.output in observed for c in execute.tool_calls)
        assert "<tool_result>" not in masked_text(chat, execute, 1)
        assert execute.text.endswith(f"<answer>{ep.task.answer}</answer>")
        assert "<verdict>accept</verdict>" in reflect.text and ep.lesson


def test_arith_shows_both_styles_and_plans_name_the_operations(demos):
    styles = {len(ep.turns[1].tool_calls) == 1 for ep in demos["arith"]}
    assert styles == {True, False}, "both one-call and step-by-step demonstrations"
    assert {ep.task.meta["steps"] for ep in demos["arith"]} == {2, 3, 4}
    for ep in demos["arith"]:
        ops = [kind for kind, _ in arith_ops(ep.task.meta["expression"])]
        plan = ep.plan
        assert plan.startswith("1. Multiply") and plan.count("\n") == len(ops)
        assert ("divide" in plan.lower()) == ("div" in ops)
        assert ("subtract" in plan.lower()) == any(k.startswith("sub") for k in ops)


def test_arith_script_writes_numbers_as_the_question_does():
    task = next(t for t in make_arith_tasks("train", 50, steps=3) if "/" in t.meta["expression"])
    one = arith_actions(task, style="one_call")
    call = json.loads(one.work[0].text.split("<tool_call>")[1].split("</tool_call>")[0])
    written = call["arguments"]["expression"]
    for number in (w.strip("()") for w in written.split() if w.strip("()")[:1].isdigit()):
        assert number in task.question
    assert one.work[0].result == task.answer and one.answer == task.answer
    steps = arith_actions(task, style="steps")
    assert len(steps.work) == len(arith_ops(task.meta["expression"])) + 1
    assert [s.result for s in steps.work][-2:] == [task.answer, None]
    assert arith_actions(task, seed=3) == arith_actions(task, seed=3)
    with pytest.raises(ValueError, match="style"):
        arith_actions(task, style="mental")


def test_gsm8k_script_follows_the_annotations():
    task = load_tasks("gsm8k", "train", limit=1)[0]  # Natalia: 48/2 = 24, 48+24 = 72
    script = gsm8k_actions(task)
    assert [s.result for s in script.work] == ["24", "72", None]
    assert script.work[0].text.startswith("Natalia sold 48/2 clips in May.\n<tool_call>")
    assert '"expression": "48+24"' in script.work[1].text
    assert script.work[-1].text == "<answer>72</answer>"
    assert "24" not in script.plan and "72" not in script.plan
    assert script.plan.startswith("<plan>1. Divide: Natalia sold ? clips in May.")


def test_gsm8k_rows_that_cannot_be_scripted_are_skipped(role_sets, chat, registry, tmp_path):
    assert gsm8k_actions(BROKEN) is None  # 48/2 is not 25
    six = "\n".join(f"Step {i}: {i}+1 = <<{i}+1={i + 1}>>{i + 1}." for i in range(1, 7)) + "\n#### 7"
    assert gsm8k_actions(Task("t", "q", "7", "gsm8k", {"solution": six})) is None  # > 4 calls
    assert gsm8k_actions(Task("t", "q", "7", "gsm8k", {"solution": six}), max_calls=6) is not None
    with pytest.raises(ValueError, match="solution"):
        gsm8k_actions(Task("t", "q", "7", "gsm8k"))

    rows = [{"question": BROKEN.question, "answer": BROKEN.meta["solution"]}]
    rows += [
        {"question": t.question, "answer": t.meta["solution"]} for t in load_tasks("gsm8k", "train", limit=2)
    ]
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    episodes = make_demos("gsm8k", 5, role_sets["hierarchy"], chat, registry, data_dir=tmp_path)
    assert [ep.task.id for ep in episodes] == [
        "gsm8k/train/1",
        "gsm8k/train/2",
    ]  # row 0 skipped, file ran out


def test_round_trip_equals_training_turns(demos, tmp_path):
    episodes = demos["arith"][:3] + demos["gsm8k"][:3]
    path = write_demos(episodes, tmp_path / "demos" / "mixed.jsonl")
    expected = [turn for i, ep in enumerate(episodes) for turn in ep.training_turns(i)]
    assert read_demos(path) == expected
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == len(expected) and all(set(r["logprobs"]) == {0.0} for r in rows)
    assert rows[0]["text"].startswith("<plan>") and "<tool_result>" in rows[1]["text"]


def test_read_demos_names_the_path_of_a_missing_or_bad_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        read_demos(tmp_path / "nowhere.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "executor"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*KeyError"):
        read_demos(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        read_demos(bad)
    bad.write_text("\n \n")
    with pytest.raises(ValueError, match=r"bad.jsonl is empty.*meta-agent demos"):
        read_demos(bad)


def test_read_demos_names_a_role_outside_the_configured_ones(demos, tmp_path):
    path = write_demos(demos["arith"][:2], tmp_path / "demos.jsonl")
    assert len(read_demos(path, roles=["meta_thinker", "executor"])) == 6
    with pytest.raises(
        ValueError, match=r"demos.jsonl:1: role 'meta_thinker' is not a configured role \(executor\)"
    ):
        read_demos(path, roles=["executor"])


def test_demo_path_tells_files_from_generators(tmp_path):
    assert demo_path("arith") is None and demo_path("gsm8k") is None
    assert demo_path("math500") is None  # neither: make_demos names it
    assert demo_path("runs/demos/missing.jsonl") == Path("runs/demos/missing.jsonl")
    (tmp_path / "demos.txt").write_text("")
    assert demo_path(str(tmp_path / "demos.txt")) == tmp_path / "demos.txt"


def test_single_agent_plays_the_executor_alone(role_sets, chat, registry):
    for name in ("arith", "gsm8k"):
        episodes = make_demos(name, 4, role_sets["single_agent"], chat, registry, seed=1)
        assert len(episodes) == 4
        for ep in episodes:
            assert ep.correct and [t.kind for t in ep.turns] == ["execute"] and ep.plan is None
            assert ep.rewards == {"executor": 1.0}


def test_two_executors_checker_repeats_one_call(role_sets, chat, registry):
    for name in ("arith", "gsm8k"):
        for ep in make_demos(name, 4, role_sets["two_executors"], chat, registry):
            assert ep.correct and not ep.leaked
            assert [(t.role, t.kind) for t in ep.turns] == [
                ("meta_thinker", "plan"),
                ("solver", "execute"),
                ("checker", "execute"),
                ("meta_thinker", "reflect"),
            ]
            solver, checker = ep.turns[1], ep.turns[2]
            (check,) = checker.tool_calls
            assert check.output == solver.tool_calls[-1].output
            assert checker.answer == ep.task.answer
            if name == "arith":
                expression = json.loads(check.arguments)["arguments"]["expression"]
                assert expression.replace(",", "").replace(" ", "") == ep.task.meta["expression"]


def test_demos_fit_the_roles_generation_budgets(demos, role_sets, chat):
    budget = {r.name: r.sampling.max_new_tokens for r in role_sets["hierarchy"]}
    for ep in demos["arith"] + demos["gsm8k"]:
        for turn in ep.turns:
            # Each generated segment (between tool results) must fit one generation of its role.
            segments = turn.text.split("</tool_result>\n")
            assert all(len(chat.encode(s)) <= budget[turn.role] for s in segments), turn.text


def test_play_demo_raises_when_the_protocol_goes_off_script(role_sets, chat, registry):
    task = make_arith_tasks("train", 1, steps=3)[0]
    script = arith_actions(task, style="steps")
    tight = EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task, Limits(max_tool_calls=1))
    with pytest.raises(DemoError, match=task.id):
        play_demo(script, task, tight)
    factory = EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task)
    wrong = replace(script, work=(Segment("<answer>1</answer>"),))
    with pytest.raises(DemoError, match="not correct"):
        play_demo(wrong, task, factory)
    early = replace(script, plan="<plan>a</plan> and more</plan>")
    with pytest.raises(DemoError, match="would stop"):
        play_demo(early, task, factory.new)
    with pytest.raises(ValueError, match="played on task"):
        play_demo(script, make_arith_tasks("train", 2, steps=3)[1], factory)


def test_plan_text_avoids_stating_small_answers():
    grammar = Grammar()
    assert plan_text(["Add.", "Answer."], "7", grammar) == "<plan>1. Add.\n2. Answer.</plan>"
    # Step numbers are no leak, so a small answer keeps the numbered plan.
    assert plan_text(["Add.", "Answer."], "2", grammar) == "<plan>1. Add.\n2. Answer.</plan>"
    assert plan_text(["Add the 12 apples."], "12", grammar) == f"<plan>{GENERIC_PLAN}</plan>"
    assert plan_text(["Add the apples. " * 60], "12", grammar) == f"<plan>{GENERIC_PLAN}</plan>"


def test_make_demos_rejects_unknown_sources(role_sets, chat, registry):
    with pytest.raises(ValueError, match=r"sft.source=math500 is neither .* nor a .jsonl file"):
        make_demos("math500", 1, role_sets["hierarchy"], chat, registry)


@pytest.fixture(scope="module")
def distract_config():
    return load_config(["experiment=distract_hierarchy"])


@pytest.fixture(scope="module")
def distract(distract_config, chat, registry):
    cfg = distract_config
    return make_demos("arith_distract", 8, cfg.role_list, chat, registry, limits=cfg.protocol)


def assert_within_budgets(episodes, cfg, chat) -> None:
    """160 demonstrations, each right and untruncated, every generation (each segment between tool
    results) within its role's max_new_tokens under `cfg`."""
    budget = {r.name: r.sampling.max_new_tokens for r in cfg.role_list}
    assert len(episodes) == 160 and all(ep.correct and not ep.truncated for ep in episodes)
    for ep in episodes:
        for turn in ep.turns:
            segments = turn.text.split("</tool_result>\n")
            assert all(len(chat.encode(s)) <= budget[turn.role] for s in segments), turn.text


def test_distract_demos_fit_the_experiments_budgets(distract_config, chat, registry):
    """Every demonstration the experiment's SFT makes (160 a seed) fits its episode budget, and each
    generation its role's: seed 13 once had a 780-token episode and reflections of 174 tokens."""
    cfg = distract_config
    for seed in (0, 13):
        episodes = make_demos(
            "arith_distract", 160, cfg.role_list, chat, registry, seed=seed, limits=cfg.protocol
        )
        assert_within_budgets(episodes, cfg, chat)


def test_distract_demos_catch_the_mistake_and_revise(distract_config, chat, registry):
    """About half revise: round 1 goes wrong (the executor adds the distractor, or the plan has a step
    backwards), the reflection quotes what went wrong and revises, round 2 is right and accepted; the
    mistaken turns are played but have nothing to learn."""
    cfg = distract_config
    episodes = make_demos("arith_distract", 24, cfg.role_list, chat, registry, limits=cfg.protocol)
    revised = [ep for ep in episodes if len(ep.rounds) == 2]
    assert 0 < len(revised) < len(episodes)
    for ep in episodes:
        assert ep.done and ep.correct and not ep.truncated and not ep.leaked and ep.tool_errors == 0
    mistakes = set()
    for ep in revised:
        distractor = f"{ep.task.meta['distractors'][0]:,}"
        assert [(t.kind, t.round) for t in ep.turns] == [
            ("plan", 0),
            ("execute", 0),
            ("reflect", 0),
            ("execute", 1),
            ("reflect", 1),
        ]
        plan, first, reflect = ep.turns[:3]
        assert not ep.rounds[0].correct and ep.rounds[1].correct
        assert ep.rounds[0].verdict == "revise" and ep.rounds[1].verdict == "accept"
        assert set(first.mask) == {0} and reflect.text.endswith("</fix>") and "<plan>" not in reflect.text
        assert distractor not in json.dumps([c.arguments for c in ep.turns[3].tool_calls])
        first_plan, second_plan = ep.rounds[0].plan, ep.rounds[1].plan
        if "of the plan says" in reflect.text:  # a step backwards: the plan is the mistake
            mistakes.add("operation")
            assert set(plan.mask) == {0}
            # The fix rewrote that one step: the plans differ in exactly one line.
            changed = [a != b for a, b in zip(first_plan.split("\n"), second_plan.split("\n"), strict=True)]
            assert sum(changed) == 1
        else:
            mistakes.add("distractor")
            assert any(plan.mask) and distractor in first.tool_calls[-1].arguments
            assert distractor in reflect.text
            assert second_plan.startswith(first_plan + "\n") and f"Leave out {distractor}" in second_plan
        learned = [(t.role, t.kind, t.round) for t in ep.turns if any(t.mask)]
        assert [(t.role, len(t.loss_mask)) for t in ep.training_turns(0)] == [
            (t.role, len(t.mask)) for t in ep.turns if any(t.mask)
        ]
        assert ("executor", "execute", 0) not in learned  # the mistake is not taught
    assert mistakes == {"distractor", "operation"}
    for ep in episodes:
        if len(ep.rounds) == 1:
            assert ep.rounds[0].verdict == "accept" and [t.kind for t in ep.turns] == [
                "plan",
                "execute",
                "reflect",
            ]


def test_an_operation_mistake_is_a_step_backwards_read_against_its_sentence(distract_config, chat, registry):
    """Worked by hand: 476,984 x 507 = 241,830,888; the depot ships out 1,660, so minus 1,660 is
    241,829,228, / 892 = 271,109. Planned backwards (Add 1,660) the executor reaches 241,832,548 / 892,
    which is no whole number; the reflection quotes step 2 and the shipping sentence, and revises."""
    cfg = distract_config
    task = Task(
        "arith_distract/train/by-hand",
        "A depot holds 476,984 crates with 507 bolts in each crate. The depot ships out 1,660 bolts. "
        "The depot's trucks drove 7,791 kilometres last year. All the bolts are then split equally among "
        "892 workshops. How many bolts does each workshop get?",
        "271109",
        "arith_distract",
        {"expression": "(476984*507-1660)/892", "distractors": [7791]},
    )
    script = distract_actions(task, style="steps", revise=True, mistake="operation")
    steps = "1. Multiply 476,984 by 507.\n2. {}\n3. Divide by 892.\n4. Use one calculator call per step and "
    steps += "answer with the last result."
    assert script.revision.plan == "<plan>" + steps.format("Add 1,660.") + "</plan>"
    assert [seg.result for seg in script.revision.work] == [
        "241830888",
        "241832548",
        "60458137/223 ≈ 271112.7219730941704",
        None,
    ]
    assert script.revision.reflection == (
        '<reflection>Step 2 of the plan says "Add 1,660.", but the question says "The depot ships out 1,660 '
        'bolts." That means "Subtract 1,660."</reflection><lesson>Check each step against its sentence: add '
        'what the question adds, subtract what it takes away.</lesson><fix step="2">Subtract 1,660.</fix>'
    )
    factory = EpisodeFactory(cfg.role_list, chat, registry, grade_task, cfg.protocol)
    ep = play_demo(script, task, factory)
    assert ep.correct and [r.answer for r in ep.rounds] == ["60458137/223 ≈ 271112.7219730941704", "271109"]
    assert ep.rounds[1].plan == steps.format("Subtract 1,660.")  # the fix applied to the backwards plan
    assert [any(t.mask) for t in ep.turns] == [False, False, True, True, True]
    with pytest.raises(ValueError, match="mistake must be one of"):
        distract_actions(task, revise=True, mistake="arithmetic")


def test_distract_demos_round_trip_without_the_caught_mistake(distract, tmp_path):
    path = write_demos(distract, tmp_path / "distract.jsonl")
    assert read_demos(path) == [turn for i, ep in enumerate(distract) for turn in ep.training_turns(i)]


def test_a_revision_needs_a_second_round_and_a_lone_executor_never_revises(role_sets, chat, registry):
    task = load_tasks("arith_distract", "train", limit=1)[0]
    one_round = EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task, Limits(max_rounds=1))
    with pytest.raises(DemoError, match="protocol.max_rounds >= 2"):
        play_demo(distract_actions(task, revise=True), task, one_round)
    alone = make_demos("arith_distract", 6, role_sets["single_agent"], chat, registry)
    assert all(ep.correct and [t.kind for t in ep.turns] == ["execute"] for ep in alone)
    once = make_demos(
        "arith_distract", 6, role_sets["hierarchy"], chat, registry, limits=Limits(max_rounds=1)
    )
    assert all(ep.correct and len(ep.rounds) == 1 for ep in once)  # no second round: no revision shown
    checked = make_demos(
        "arith_distract", 4, role_sets["two_executors"], chat, registry, limits=Limits(max_rounds=2)
    )
    assert all(ep.correct and len(ep.rounds) == 1 for ep in checked)  # a checker would get round 1 right


def test_check_lines_read_each_step_against_its_sentence_and_the_work_against_the_plan():
    question = "It has 5 boxes of 3. It gets 2 more. It had 9 visits. It gives away 4."
    truth = [("mul", (5, 3)), ("add", (2,)), ("sub", (4,))]
    backwards = [("mul", (5, 3)), ("sub", (2,)), ("add", (4,))]
    assert check_lines(question, backwards, truth, [5, 3, 2, 4], distractors=(9,)).split("\n") == [
        'Step 1, "Multiply 5 by 3.": "It has 5 boxes of 3." Agrees.',
        'Step 2, "Subtract 2.": "It gets 2 more." Backwards: the question adds it.',
        'Step 3, "Add 4.": "It gives away 4." Backwards: the question takes it away.',
        'Not in the plan: 9, "It had 9 visits." The asked quantity does not depend on it.',
        "The numbers of the question in the work: 5, 3, 2 and 4, all in the plan.",
    ]
    assert check_lines(question, truth, truth, [5, 3, 2, 9, 4, 2], distractors=(9,)).split("\n")[1:] == [
        'Step 2, "Add 2.": "It gets 2 more." Agrees.',
        'Step 3, "Subtract 4.": "It gives away 4." Agrees.',
        'Not in the plan: 9, "It had 9 visits." The asked quantity does not depend on it.',
        'The numbers of the question in the work: 5, 3, 2, 9 and 4; 9 is in no step: "It had 9 visits."',
    ]
    left_out = [("mul", (5, 3)), ("sub", (4,))]  # the plan lacks "Add 2."
    assert check_lines(question, left_out, truth, [5, 3, 4], distractors=(9,)).split("\n")[1:] == [
        'Step 2, "Subtract 4.": "It gives away 4." Agrees.',
        'Not in the plan: 2, "It gets 2 more." Left out: the question adds it.',
        'Not in the plan: 9, "It had 9 visits." The asked quantity does not depend on it.',
        "The numbers of the question in the work: 5, 3 and 4, all in the plan.",
    ]


FOUND = {"backwards": "Backwards: the question", "distractor": "is in no step", "missing": "Left out:"}


@pytest.fixture(scope="module")
def check_config():
    return load_config(["experiment=distract_check_hierarchy"])


def test_check_demos_open_every_reflection_alike_and_fit_the_budgets(check_config, chat, registry):
    """sft.source=arith_distract_check: every reflection, accepting or revising, is the same check from
    its first words; the line that found something (a step backwards, a number in no step) is the only
    difference, and the verdict follows it. Each fits its experiment's budgets (seeds 0 and 13)."""
    cfg = check_config
    for seed in (0, 13):
        episodes = make_demos(
            "arith_distract_check", 160, cfg.role_list, chat, registry, seed=seed, limits=cfg.protocol
        )
        assert_within_budgets(episodes, cfg, chat)
        kinds = set()
        for ep in episodes:
            for turn, rnd in zip([t for t in ep.turns if t.kind == "reflect"], ep.rounds, strict=True):
                assert turn.text.startswith('<reflection>Step 1, "Multiply ')
                found = any(x in turn.text for x in ("Backwards: the question", "is in no step", "Left out:"))
                assert found == (rnd.verdict == "revise") == (not rnd.correct), turn.text
                if found:
                    kinds.add(next(k for k, x in FOUND.items() if x in turn.text))
                    step = re.search(r"So step (\d+) is backwards", turn.text)
                    if step:  # the fix is of the step the check found backwards
                        assert f'<fix step="{step[1]}">' in turn.text
                else:
                    assert "So the answer stands.</reflection>" in turn.text
        assert kinds == set(FOUND)
