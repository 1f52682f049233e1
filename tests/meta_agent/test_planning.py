"""Tree search over the meta-thinker's plans (meta_agent.evaluation.planning): the selection rule by hand, and
whole searches on real episodes with a scripted backend whose plans differ in how often they work."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meta_agent.analysis.stats import majority, normal_answer
from meta_agent.config import load_config
from meta_agent.episode.protocol import Limits
from meta_agent.episode.runner import EpisodeFactory, play
from meta_agent.errors import SettingError
from meta_agent.evaluation.planning import (
    Node,
    PlannerSettings,
    Search,
    SearchResult,
    check_planner,
    choose,
    episode_value,
    leaf_state,
    majority_answer,
    may_widen,
    priors,
    puct,
    search,
    searched_plans,
    searches,
    select,
)
from meta_agent.tasks import grade_task
from tests.meta_agent.conftest import TASK, TASKS, answer
from training.types import GenerationResult

GOOD = "<plan>1. Multiply the crates by the bolts. 2. Add the rest.</plan>"
GUESS = "<plan>Guess.</plan>"
ACCEPT = "<reflection>fine</reflection><lesson>check</lesson><verdict>accept</verdict>"
REVISE = "<reflection>a guess</reflection><lesson>compute</lesson>" + GOOD


def node(logprob: float, visits: int = 0, value_sum: float = 0.0) -> Node:
    return Node("plan", text="p", logprob=logprob, visits=visits, value_sum=value_sum)


def test_priors_are_the_softmax_of_mean_logprobs():
    assert priors([node(math.log(3)), node(0.0)]) == pytest.approx([0.75, 0.25])
    assert priors([]) == []


def test_puct_by_hand():
    # parent N = 4; children: Q 0.5 (n 3, P 0.25) and Q 0 (n 1, P 0.75), c = 1
    # 0.5 + 0.25 * 2 / 4 = 0.625 against 0 + 0.75 * 2 / 2 = 0.75: the second
    a, b = node(0.0, visits=3, value_sum=1.5), node(math.log(3), visits=1)
    parent = Node("root", visits=4, children=[a, b])
    assert puct(parent, 1.0) is b
    assert puct(parent, 0.1) is a  # 0.5125 against 0.075: the value decides
    # a pending simulation through b counts as a visit of value 0: 0.75 * 2 / 3 = 0.5 < 0.625
    b.pending, parent.pending = 1, 0
    assert puct(parent, 1.0) is a


def test_progressive_widening_and_selection():
    root = Node("root")
    assert may_widen(root, 0.5)  # no child yet
    root.children.append(node(0.0, visits=1, value_sum=1.0))
    root.visits = 1
    assert not may_widen(root, 0.5)  # ceil(1 ** 0.5) = 1 child
    root.visits = 2
    assert may_widen(root, 0.5)  # ceil(2 ** 0.5) = 2
    root.visits = 1
    path = select(root, PlannerSettings())  # root full: down to the plan, which has no child yet
    assert path == [root, root.children[0]] and root.pending == 1 and root.children[0].pending == 1
    assert may_widen(root, 0.5)  # the pending simulation counts: ceil(2 ** 0.5) = 2


def test_values_without_the_answer_key(make_episode):
    ep = make_episode(limits=Limits(max_rounds=1))
    for action in (GOOD, answer("555,491"), ACCEPT):
        ep.advance_text(action)
    assert episode_value(ep, ["555491", "7", "555,491", None], "votes") == pytest.approx(2 / 3)
    assert episode_value(ep, ["555491"], "verdict") == 1.0
    root = Node("root", children=[node(0.0, visits=3), node(0.0, visits=1)])
    root.children[0].answers = ["7", "555,491", "555491"]
    assert choose(root) == (root.children[0], "555,491")  # the majority's first sample, as it wrote it


class Scripted:
    """Plans GOOD or GUESS by the request's seed (GUESS less likely under the policy: lower logprobs);
    the executor answers right under GOOD and 7 under GUESS; a reflection on 7 revises to GOOD in the
    first round, and accepts otherwise."""

    def __init__(self, chat, plans=(GUESS, GOOD, GOOD)):
        self.chat = chat
        self.plans = plans
        self.requests = 0

    def generate(self, requests):
        out = []
        for r in requests:
            self.requests += 1
            prompt = self.chat.decode_raw(r.prompt_ids)
            if r.sampling.stop == ("</plan>",):
                text = self.plans[r.seed % len(self.plans)]
            elif "</answer>" in r.sampling.stop:
                shown = prompt.rsplit("Plan from the meta-thinker:", 1)[-1]
                text = answer("7") if "Guess." in shown.split("\n\n")[0] else answer("555491")
            else:
                work = prompt.rsplit("Its final answer:", 1)[-1]
                text = REVISE if work.strip().startswith("7") and "a guess" not in prompt else ACCEPT
            ids = tuple(self.chat.encode(text))
            lp = -2.0 if text == GUESS else -0.1
            out.append(GenerationResult(ids, (lp,) * len(ids), text, "stop"))
        return out


@pytest.fixture
def factory(role_sets, chat, registry):
    return EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task, Limits(max_rounds=2))


def tree_visits(node: Node) -> int:
    return node.visits + sum(tree_visits(c) for c in node.children)


def test_a_search_grows_plans_and_revisions_and_answers_by_the_best_plan(factory, chat):
    settings = PlannerSettings(name="mcts", simulations=8, parallel=4)
    [result] = search(factory, Scripted(chat), [TASK], settings, seed=0)
    root = result.tree
    assert root.visits == 8 and result.simulations == 8
    assert sum(c.visits for c in root.children) == 8  # every simulation went through a plan
    texts = {c.text for c in root.children}
    assert texts <= {GOOD, GUESS} and len(root.children) == len(texts)  # one node per distinct plan
    assert result.answer == "555491" and result.correct
    assert result.episode.final_answer == "555491"
    guess = next((c for c in root.children if c.text == GUESS), None)
    if guess is not None:  # a guess is revised, its revision a child of the plan
        assert [c.kind for c in guess.children] == ["revision"]
        assert guess.children[0].text == REVISE
    tree = root.as_dict()
    assert tree["visits"] == 8 and tree["children"][0]["answers"]


def test_simulations_from_a_plan_replay_it_and_count_only_new_tokens(factory, chat):
    """With no widening the root keeps one plan: every later simulation replays it and only executes."""
    backend = Scripted(chat, plans=(GOOD,))
    settings = PlannerSettings(name="mcts", simulations=4, parallel=1, widening=0.0)
    [result] = search(factory, backend, [TASK], settings, seed=1)
    [plan] = result.tree.children
    assert plan.visits == 4
    plan_tokens = len(plan.segments[-1].token_ids)
    # each simulation: the executor's answer, then the first round's reflection (accepting)
    simulation_tokens = len(chat.encode(answer("555491"))) + len(chat.encode(ACCEPT))
    assert result.generated_tokens == plan_tokens + 4 * simulation_tokens  # the plan generated once
    assert backend.requests == 1 + 4 * 2  # one plan request; per simulation an execution and a reflection


def test_the_same_seed_searches_the_same_tree(factory, chat):
    settings = PlannerSettings(name="mcts", simulations=6, parallel=3)
    a = search(factory, Scripted(chat), [TASK, TASK], settings, seed=5)
    b = search(factory, Scripted(chat), [TASK, TASK], settings, seed=5)
    assert [r.tree.as_dict() for r in a] == [r.tree.as_dict() for r in b]


def test_a_token_budget_ends_the_search(factory, chat):
    settings = PlannerSettings(name="mcts", simulations=50, parallel=1, max_tokens=40)
    [result] = search(factory, Scripted(chat), [TASK], settings, seed=0)
    assert result.simulations < 50 and result.generated_tokens >= 40


def test_planner_settings_are_checked():
    with pytest.raises(SettingError, match="planner.name must be one of"):
        load_config(["planner.name=beam"])
    with pytest.raises(SettingError, match="planner.simulations must be >= 1"):
        load_config(["planner.simulations=0"])


@pytest.mark.slow  # three CLI runs on the tiny model, about 30 s
def test_eval_and_solve_search_with_the_real_episode_code(tiny_model_dir, tmp_path):
    """meta-agent eval planner.name=mcts: one trace per problem with its tree, the tokens of every
    simulation in eval.json; solve shows the search's episode; best_of_n goes the same way."""
    import json

    from tests.meta_agent.test_cli import run_cli

    common = [
        f"model.path={tiny_model_dir}",
        "roles.meta_thinker.sampling.max_new_tokens=8",
        "roles.executor.sampling.max_new_tokens=8",
        "planner.name=mcts",
        "planner.simulations=3",
        "planner.parallel=2",
        "memory.path=null",
    ]
    run_dir = tmp_path / "eval"
    proc = run_cli(
        "eval", *common, "eval.limit=2", "eval.episodes_per_batch=4", f"run_dir={run_dir}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 2
    for trace in traces:
        assert trace["simulations"] == 3 and trace["search"]["visits"] == 3
        assert sum(c["visits"] for c in trace["search"]["children"]) == 3
    scores = json.loads((run_dir / "eval.json").read_text())["0"]["arith"]
    assert scores["total"] == 2
    assert scores["generated_tokens"] > sum(t["generated_tokens"] for tr in traces for t in tr["turns"])
    solved = run_cli(
        "solve", "What is 2 + 3?", *common, "adapters=null", f"run_dir={tmp_path / 's'}", cwd=tmp_path
    )
    assert solved.returncode == 0, solved.stderr + solved.stdout
    assert "searched 3 episodes over" in solved.stdout
    best_dir = tmp_path / "best"
    common[3] = "planner.name=best_of_n"
    proc = run_cli("eval", *common, "eval.limit=2", f"run_dir={best_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    traces = [json.loads(line) for line in (best_dir / "traces.jsonl").read_text().splitlines()]
    assert [t["simulations"] for t in traces] == [3, 3] and traces[0]["search"]["visits"] == 3
    # without a meta-thinker: no plans to show, the majority of the executor's episodes
    alone = [c for c in common if not c.startswith("roles.meta_thinker")]
    single = [*alone, "roles=single_agent", "adapters=null", f"run_dir={tmp_path / 'single'}"]
    solved = run_cli("solve", "What is 2 + 3?", *single, cwd=tmp_path)
    assert solved.returncode == 0, solved.stderr + solved.stdout
    assert "searched 3 episodes over 0 plans; the answer is their majority" in solved.stdout


def test_a_search_answers_once_per_problem_and_needs_a_meta_thinker():
    with pytest.raises(SettingError, match="eval.samples=1"):
        load_config(["planner.name=mcts", "eval.samples=4"])
    with pytest.raises(SettingError, match="these roles have none"):
        load_config(["planner.name=mcts", "roles=single_agent"])


def test_votes_are_revalued_as_answers_come_in(factory, chat):
    """A node's value is the mean share of its simulations' answers among all the problem's answers now,
    not when each was backed up (the first simulation's answer was then the only one: share 1)."""
    settings = PlannerSettings(name="mcts", simulations=6, parallel=3)
    [result] = search(factory, Scripted(chat), [TASK], settings, seed=0)
    root = result.tree
    counted = [a for a in root.answers if a is not None]
    share = {a: counted.count(a) / len(counted) for a in counted}

    def check(node):
        expected = sum(share.get(a, 0.0) for a in node.answers)
        assert node.value_sum == pytest.approx(expected)
        for c in node.children:
            check(c)

    check(root)


def test_a_later_chunk_samples_as_one_search_of_all_problems(factory, chat):
    settings = PlannerSettings(name="mcts", simulations=3, parallel=3)
    whole = search(factory, Scripted(chat), [TASK, TASK], settings, seed=2)
    second = search(factory, Scripted(chat), [TASK], settings, seed=2, first_problem=1)
    assert second[0].tree.as_dict() == whole[1].tree.as_dict()


def test_a_wave_spends_what_the_token_budget_has_left():
    from meta_agent.evaluation.planning import wave_size

    free = PlannerSettings(simulations=10, parallel=4)
    assert [wave_size(free, done, 0) for done in (0, 8, 10)] == [4, 2, 0]
    tight = PlannerSettings(simulations=10, parallel=4, max_tokens=1000)
    assert wave_size(tight, 0, 0) == 1  # nothing measured yet: one simulation
    assert wave_size(tight, 1, 100) == 4  # 900 left at 100 a simulation: a whole wave fits
    assert wave_size(tight, 1, 240) == 1  # 760 left at 240: 3.2, fewer than a wave: one at a time
    assert wave_size(tight, 4, 880) == 1  # 120 left at 220: 0.55 of one, the nearest end is past it
    assert wave_size(tight, 4, 920) == 0  # 80 left at 230: 0.35 of one, the nearest end is before it
    with pytest.raises(ValueError, match="planner.temperature must be > 0"):
        PlannerSettings(temperature=0.0)


# ---- searched plans as the meta-thinker's demonstrations ----------------------------------------------


class AlwaysSeven(Scripted):
    """Every executor answers 7 (wrong), whatever the plan: no search can choose a right answer."""

    def generate(self, requests):
        out = super().generate(requests)
        for i, r in enumerate(requests):
            if "</answer>" in r.sampling.stop:
                ids = tuple(self.chat.encode(answer("7")))
                out[i] = GenerationResult(ids, (-0.1,) * len(ids), answer("7"), "stop")
        return out


def test_searched_plans_keep_the_meta_thinkers_turns_of_right_answers_only(factory, chat):
    settings = PlannerSettings(name="mcts", simulations=4, parallel=2)
    [right] = search(factory, Scripted(chat), [TASK], settings, seed=0)
    [wrong] = search(factory, AlwaysSeven(chat), [TASK], settings, seed=0)
    leak = "<plan>1. The answer is 555491.</plan>"
    [leaked] = search(factory, Scripted(chat, plans=(leak,)), [TASK], settings, seed=0)
    assert right.correct and not wrong.correct and leaked.correct and leaked.episode.leaked
    kept = searched_plans([right, wrong, leaked], "meta_thinker")
    assert kept == [right.episode]
    ep = kept[0]
    assert all(not any(t.mask) for t in ep.turns if t.role == "executor")
    learned = ep.learned_turns
    assert learned and {t.role for t in learned} == {"meta_thinker"} and learned[0].kind == "plan"
    assert learned[0].text in (GOOD, GUESS)  # a plan the search chose, the revision after a guess with it


class KnowsTheAnswers(Scripted):
    """Plans GOOD and answers each question right, from the answers of the problems it was given."""

    def __init__(self, chat, tasks):
        super().__init__(chat, plans=(GOOD,))
        self.answers = {t.question: t.answer for t in tasks}

    def generate(self, requests):
        out = super().generate(requests)
        for i, r in enumerate(requests):
            prompt = self.chat.decode_raw(r.prompt_ids)
            if "</answer>" in r.sampling.stop:
                right = next(a for q, a in self.answers.items() if q in prompt)
                ids = tuple(self.chat.encode(answer(right)))
                out[i] = GenerationResult(ids, (-0.1,) * len(ids), answer(right), "stop")
        return out


def test_search_demos_write_the_plans_that_sft_reads_back(role_sets, chat, registry, tmp_path):
    from types import SimpleNamespace

    from meta_agent.demos.build import read_demos, write_demos
    from meta_agent.learning.sft import search_demos
    from meta_agent.tasks import load_tasks

    cfg = load_config(["planner.name=mcts", "planner.simulations=2", "planner.parallel=2", "sft.examples=3"])
    tasks = load_tasks(cfg.train.task, "train", limit=3, seed=cfg.seed)
    roles = role_sets["hierarchy"]
    factory = EpisodeFactory(roles, chat, registry, grade_task, Limits(max_rounds=2))
    system = SimpleNamespace(
        roles=roles, factory=factory, backend=KnowsTheAnswers(chat, tasks), backbone=None
    )
    episodes = search_demos(cfg, system)
    assert [ep.task.id for ep in episodes] == [t.id for t in tasks]
    turns = read_demos(write_demos(episodes, tmp_path / "searched.jsonl"), roles=[r.name for r in roles])
    # per problem the meta-thinker's plan and the reflection that accepted (one before the last round)
    assert [t.role for t in turns] == ["meta_thinker"] * 6
    assert [chat.decode_raw(t.completion_ids) for t in turns] == [GOOD, ACCEPT] * 3


def test_demos_by_search_need_trained_roles_with_a_meta_thinker(tmp_path):
    from tests.meta_agent.test_cli import run_cli

    proc = run_cli("demos", "planner.name=mcts", f"run_dir={tmp_path / 'r'}", cwd=tmp_path)
    assert proc.returncode != 0
    assert (
        "planner.name=mcts searches with trained roles: give them with adapters=RUN"
        in proc.stderr + proc.stdout
    )
    single = run_cli(
        "demos",
        "planner.name=best_of_n",
        "roles=single_agent",
        "adapters=x",
        f"run_dir={tmp_path / 's'}",
        cwd=tmp_path,
    )
    assert single.returncode != 0
    assert "writes the meta-thinker's plans, and these roles have none" in single.stderr + single.stdout


# ---- planner.value=head: the value of the state after a plan, from a value function -------------------


def test_the_head_values_the_first_executor_state_after_the_last_plan_or_revision(factory, chat):
    seen = []

    def values(states):
        seen.extend(states)
        # a value function that likes GOOD plans: what a trained head would learn on this task
        return [
            1.0
            if "Multiply the crates" in chat.decode_raw(ids).rsplit("Plan from the meta-thinker:", 1)[-1]
            else 0.0
            for _, ids in states
        ]

    settings = PlannerSettings(name="mcts", simulations=8, parallel=4, value="head", value_heads="unused")
    [result] = search(factory, Scripted(chat, plans=(GUESS, GOOD)), [TASK], settings, seed=0, values=values)
    assert len(seen) == 8 and {role for role, _ in seen} == {"executor"}
    good = next(c for c in result.tree.children if c.text == GOOD)
    guess = next(c for c in result.tree.children if c.text == GUESS)
    # a guess is revised to the good plan: its simulations are valued at their revision's state
    assert good.value == 1.0 and guess.children and guess.children[0].value == 1.0
    assert result.answer == "555491"
    with pytest.raises(ValueError, match="values=head_values"):
        search(factory, Scripted(chat), [TASK], settings, seed=0)


def test_leaf_state_by_hand(factory, chat):
    settings = PlannerSettings(name="mcts", simulations=1, parallel=1)
    [planned] = search(factory, Scripted(chat, plans=(GOOD,)), [TASK], settings, seed=0)
    [revised] = search(factory, Scripted(chat, plans=(GUESS,)), [TASK], settings, seed=0)
    for result, rounds in ((planned, 1), (revised, 2)):
        path = [result.tree]
        while path[-1].children:
            path.append(path[-1].children[0])
        assert len(path) == rounds + 1
        from meta_agent.evaluation.planning import Simulation

        sim = Simulation(0, path, result.episode, 0, [], 0)
        role, ids = leaf_state(sim)
        executor = [t for t in result.episode.turns if t.kind == "execute"][rounds - 1]
        assert role == "executor" and ids == tuple(executor.prompt_ids)


def test_value_head_needs_a_checkpoint_to_read_them_from():
    with pytest.raises(
        SettingError, match=r"planner.value=head .* planner.value_heads=\.\.\. \(or adapters=\.\.\.\)"
    ):
        load_config(["planner.name=mcts", "planner.value=head"])
    cfg = load_config(["planner.name=mcts", "planner.value=head", "adapters=runs/gae"])
    assert cfg.planner.value_heads == "runs/gae"


# ---- the Planner interface: best_of_n, a researcher's own planner, the conformance check ---------------


OTHER = TASKS[1]


@pytest.fixture
def one_round(role_sets, chat, registry):
    """No revision: a guessed plan's 7 stays the episode's answer, so samples disagree."""
    return EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task, Limits(max_rounds=1))


def test_best_of_n_answers_the_majority_of_the_samples_eval_draws(one_round, chat):
    """best_of_n's N episodes are the ones `eval.samples=N` plays (the same seeds), every one from the
    question; its answer is their majority, its tree the plans they wrote."""
    n = 5
    settings = PlannerSettings(name="best_of_n", simulations=n, parallel=2)
    results = search(one_round, Scripted(chat), [TASK, OTHER], settings, seed=3)
    sampled = [one_round.new(t, final_reflection=False) for t in (TASK, OTHER) for _ in range(n)]
    play(sampled, Scripted(chat), seed=3)
    for p, r in enumerate(results):
        mine = sampled[p * n : (p + 1) * n]
        answers = [normal_answer(ep.final_answer) for ep in mine]
        assert len(set(answers)) == 2, "the scripted samples should disagree"
        assert r.answer == mine[majority(answers)].final_answer  # as the sample wrote it
        assert r.correct == (normal_answer(r.answer) == normal_answer(r.task.answer))
        assert r.generated_tokens == sum(t.generated_tokens for ep in mine for t in ep.turns)
        assert r.tree.visits == n and sum(c.visits for c in r.tree.children) == n
        plans = [ep.turns[0].text for ep in mine]
        assert {c.text: c.visits for c in r.tree.children} == {t: plans.count(t) for t in set(plans)}


def test_best_of_n_is_refused_another_value():
    with pytest.raises(SettingError, match="planner.name=best_of_n answers by the majority"):
        load_config(["planner.name=best_of_n", "planner.value=verdict"])
    with pytest.raises(SettingError, match="eval.samples=1"):
        load_config(["planner.name=best_of_n", "eval.samples=4"])
    assert load_config(["planner.name=best_of_n", "roles=single_agent"]).planner.name == "best_of_n"


def test_the_majority_answer_is_given_as_its_first_sample_wrote_it():
    """Votes compare answers without spaces, commas and a final period; the answer given back is the first
    sample of the winning kind, unchanged: a code answer keeps its lines and indentation."""
    assert majority_answer(["99", "1,234.", "1234", None]) == "1,234."
    assert majority_answer([None, None]) is None
    code = ["def f(x):\n    return x + 1", "def g():\n    pass", "def f(x):\n  return x+1"]
    assert majority_answer(code) == "def f(x):\n    return x + 1"


def test_best_of_n_is_refused_the_tree_search_settings():
    """c_puct and widening steer the search down the tree; best-of-N has none, so setting them is a mistake."""
    with pytest.raises(
        SettingError, match=r"planner.c_puct=2.0: only the tree search .* reads this; .*leave it out"
    ):
        load_config(["planner.name=best_of_n", "planner.c_puct=2.0"])
    with pytest.raises(
        SettingError,
        match=r"planner.c_puct=0.5 and planner.widening=1.0: only the tree search .* reads these",
    ):
        load_config(["planner.name=best_of_n", "planner.c_puct=0.5", "planner.widening=1.0"])
    tree = load_config(["planner.name=mcts", "planner.c_puct=2.0", "planner.widening=1.0"]).planner
    assert (tree.c_puct, tree.widening) == (2.0, 1.0)
    assert load_config(["planner.name=best_of_n", "planner.c_puct=1.0"]).planner.c_puct == 1.0  # the default


class FirstEpisode:
    """A researcher's own planner, written against the Planner protocol alone: one episode per problem at
    the roles' own temperatures, sampled with the seeds of the problem's index."""

    name = "first_episode"
    parallel = 1

    def search(self, factory, backend, tasks, *, seed, first_problem=0):
        episodes = [factory.new(t, final_reflection=False) for t in tasks]
        play(episodes, backend, seed=seed, first_index=first_problem)
        out = []
        for t, ep in zip(tasks, episodes, strict=True):
            root = Node("root", visits=1, answers=[ep.final_answer])
            answer = ep.final_answer
            tokens = sum(turn.generated_tokens for turn in ep.turns)
            out.append(SearchResult(t, answer, answer is not None and ep.correct, ep, 1, tokens, root))
        return out


def test_the_built_in_planners_and_a_researchers_own_pass_the_conformance_check(factory, one_round, chat):
    for name in ("mcts", "best_of_n"):
        planner = Search(PlannerSettings(name=name, simulations=6, parallel=3))
        check_planner(planner, factory, Scripted(chat), [TASK, OTHER, TASK], seed=1)
    check_planner(FirstEpisode(), one_round, Scripted(chat), [TASK, OTHER, TASK], seed=1)
    # and goes where the built-in ones go: chunked as eval and demos chunk them
    chunks = list(searches(FirstEpisode(), one_round, Scripted(chat), [TASK, OTHER, TASK], 2, seed=1))
    assert [len(c) for c in chunks] == [2, 1]
    whole = FirstEpisode().search(one_round, Scripted(chat), [TASK, OTHER, TASK], seed=1)
    assert [r.answer for c in chunks for r in c] == [r.answer for r in whole]


class Broken(FirstEpisode):
    """FirstEpisode with one promise broken, by name."""

    def __init__(self, flaw):
        self.flaw, self.calls = flaw, 0

    def search(self, factory, backend, tasks, *, seed, first_problem=0):
        self.calls += 1
        if self.flaw == "ignores first_problem":
            first_problem = 0
        out = super().search(factory, backend, tasks, seed=seed, first_problem=first_problem)
        if self.flaw == "reads the answer key":  # abstains where the gold answer says it is wrong
            out = [r if r.correct else replace(r, answer=None, correct=False) for r in out]
        if self.flaw == "out of order":
            out = out[::-1]
        if self.flaw == "varies":
            out = [replace(r, generated_tokens=r.generated_tokens + self.calls) for r in out]
        if self.flaw == "shows another episode":
            out = [replace(r, answer="12", correct=False) for r in out]
        if self.flaw == "miscounts":
            out = [replace(r, simulations=2) for r in out]
        if self.flaw == "leaves a simulation pending":
            for r in out:
                r.tree.pending = 1
        if self.flaw == "abstains and shows an answer":
            out = [replace(r, answer=None, correct=False) for r in out]
        return out


@pytest.mark.parametrize(
    ("flaw", "caught"),
    [
        ("reads the answer key", "the answers changed with the answer key"),
        ("out of order", "results out of order"),
        ("varies", "the same seed searched differently"),
        ("ignores first_problem", "a later chunk"),
        ("shows another episode", "the shown episode answers"),
        ("miscounts", "the root counts 1 visits for 2 simulations"),
        ("leaves a simulation pending", "still counts 1 pending"),
        ("abstains and shows an answer", "the shown episode answers .*, the search chose None"),
    ],
)
def test_the_conformance_check_catches_a_broken_planner(one_round, chat, flaw, caught):
    with pytest.raises(AssertionError, match=caught):
        # a backend that answers every problem right, for the planner that abstains where it is told wrong
        backend = KnowsTheAnswers(chat, TASKS[:3]) if flaw == "reads the answer key" else Scripted(chat)
        check_planner(Broken(flaw), one_round, backend, TASKS[:3], seed=1)


def test_the_conformance_check_names_a_missing_member(one_round, chat):
    class NoParallel:
        name = "x"

        def search(self, factory, backend, tasks, *, seed, first_problem=0):
            return []

    with pytest.raises(AssertionError, match="lacks a member of the Planner protocol"):
        check_planner(NoParallel(), one_round, Scripted(chat), [TASK, OTHER])
