"""memory.internal: what the meta-thinker carries between reflections (truncate: nothing; summary: the notes
its last reflection rewrote), in the real episode's prompts, in the demonstrations, and the conformance
check a researcher's own internal memory must pass."""

from __future__ import annotations

import hashlib
import json

import pytest

from meta_agent.config import load_config
from meta_agent.demos.build import make_demos
from meta_agent.episode import reward
from meta_agent.episode.internal_memory import (
    NOTES_CHARS,
    Summary,
    Truncate,
    check_internal_memory,
    internal_memory,
    latest_notes,
    round_note,
    with_notes,
)
from meta_agent.episode.prompts import NOTES_HEADER
from meta_agent.episode.protocol import REFLECT, Episode, Limits
from meta_agent.evaluation.evaluate import score
from meta_agent.tasks import grade_task
from roles import Grammar, parse_notes
from tests.meta_agent.conftest import PLAN, TASK, answer

G = Grammar()
WRONG = str(int(TASK.answer) + 1)


def notes(text: str) -> str:
    return f"<notes>{text}</notes>"


def revise_with(note: str) -> str:
    return (
        f"<reflection>it guessed</reflection><lesson>compute</lesson>{notes(note)}<verdict>revise</verdict>"
    )


# ---- pure functions ----------------------------------------------------------------------------------


def test_parse_notes_takes_the_last_closed_block():
    assert (
        parse_notes("<reflection>x</reflection><notes> tried 3 </notes><verdict>accept</verdict>", G)
        == "tried 3"
    )
    assert parse_notes(f"{notes('old')} and {notes('new')}", G) == "new"
    assert parse_notes(f"{notes('kept')}<notes>cut off mid", G) == "kept"
    assert parse_notes("<notes>cut off mid", G) is None
    assert parse_notes(notes("   "), G) is None
    assert parse_notes("no notes at all", G) is None


def test_latest_notes_skip_a_reflection_that_wrote_none():
    assert latest_notes([revise_with("a"), "<reflection>forgot</reflection>"], G) == "a"
    assert latest_notes([revise_with("a"), revise_with("b")], G) == "b"
    assert latest_notes([], G) is None


def test_summary_carries_the_latest_notes_cut_to_their_tail():
    assert Summary().carried([revise_with("tried 12")], G) == "tried 12"
    assert Summary().carried(["<reflection>none</reflection>"], G) == ""
    long = "x" * (NOTES_CHARS + 5) + "END"
    assert Summary().carried([revise_with(long)], G) == f"...{long[-NOTES_CHARS:]}"
    assert Truncate().carried([revise_with("tried 12")], G) == "" and Truncate().instruction(G) == ""


def test_with_notes_goes_after_the_lesson_else_the_reflection_else_first():
    assert with_notes("<reflection>r</reflection><lesson>l</lesson><verdict>accept</verdict>", "n", G) == (
        "<reflection>r</reflection><lesson>l</lesson><notes>n</notes><verdict>accept</verdict>"
    )
    assert with_notes('<reflection>r</reflection><fix step="2">s</fix>', "n", G) == (
        '<reflection>r</reflection><notes>n</notes><fix step="2">s</fix>'
    )
    assert with_notes("<verdict>accept</verdict>", "n", G) == "<notes>n</notes><verdict>accept</verdict>"


def test_round_note_names_the_round_its_answer_and_the_decision():
    fix = '<reflection>r</reflection><fix step="3">Subtract 4.</fix>'
    assert (
        round_note(1, "17", fix, G)
        == "Round 1: answered 17; step 3 was wrong and is fixed; check step 3 against the question."
    )
    plan = "<reflection>r</reflection><plan>1. Add.</plan>"
    assert (
        round_note(2, None, plan, G)
        == "Round 2: gave no answer; the plan was rewritten; check each step against the question."
    )
    accept = "<reflection>r</reflection><verdict>accept</verdict>"
    assert round_note(2, "5", accept, G) == "Round 2: answered 5; accepted."


def test_summary_demonstrations_keep_the_old_notes_and_add_this_round():
    first = Summary().demonstrate(
        '<reflection>r</reflection><lesson>l</lesson><fix step="2">Sub.</fix>', [], ["9"], G
    )
    assert first == (
        "<reflection>r</reflection><lesson>l</lesson>"
        "<notes>Round 1: answered 9; step 2 was wrong and is fixed; check step 2 against the question.</notes>"
        '<fix step="2">Sub.</fix>'
    )
    second = Summary().demonstrate(
        "<reflection>r</reflection><verdict>accept</verdict>", [first], ["9", "4"], G
    )
    assert parse_notes(second, G) == (
        "Round 1: answered 9; step 2 was wrong and is fixed; check step 2 against the question.\n"
        "Round 2: answered 4; accepted."
    )


# ---- the conformance check ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["truncate", "summary"])
def test_the_shipped_internal_memories_pass_the_conformance_check(name):
    memory = internal_memory(name)
    assert memory.name == name
    check_internal_memory(memory)


class AsksButNeverShows(Summary):
    def carried(self, reflections, grammar):
        return ""


class FlipsTheVerdict(Summary):
    def demonstrate(self, reflection, earlier, answers, grammar):
        return "<reflection>fine</reflection><verdict>accept</verdict>"


class CarriesEverything(Summary):
    def carried(self, reflections, grammar):
        return "\n".join(reflections)


class RemembersBeforeTheFirst(Truncate):
    def carried(self, reflections, grammar):
        return "start\n"


class CarriesSecretly(Summary):
    carries = False


class StopsEarly(Summary):
    def demonstrate(self, reflection, earlier, answers, grammar):
        return "<verdict>accept</verdict>" + reflection


@pytest.mark.parametrize(
    ("memory", "says"),
    [
        (AsksButNeverShows(), "never shown"),
        (FlipsTheVerdict(), "changed the reflection's decision"),
        (CarriesEverything(), "characters of a runaway"),
        (RemembersBeforeTheFirst(), "first reflection must be carried nothing"),
        (StopsEarly(), "a stop ends the demonstrated reflection early"),
        (CarriesSecretly(), "says it carries nothing"),
        (object(), "lacks a method"),
    ],
)
def test_the_conformance_check_names_what_a_memory_gets_wrong(memory, says):
    with pytest.raises(AssertionError, match=says):
        check_internal_memory(memory)


# ---- in the episode ------------------------------------------------------------------------------------


def episode(role_sets, chat, registry, internal, rounds=3) -> Episode:
    return Episode(
        TASK, role_sets["hierarchy"], chat, registry, grade_task, Limits(max_rounds=rounds), internal=internal
    )


def reflect_prompts(ep: Episode) -> list[str]:
    return [ep.chat.decode_raw(t.prompt_ids) for t in ep.turns if t.kind == REFLECT]


def play_three_rounds(ep: Episode) -> None:
    for action in (
        PLAN,
        answer(WRONG),
        revise_with("Round 1: answered wrong; check step 1."),
        answer(WRONG),
        "<reflection>still wrong</reflection><verdict>revise</verdict>",  # forgot its notes
        answer(TASK.answer),
        "<reflection>ok</reflection><notes>Round 3: right.</notes><verdict>accept</verdict>",
    ):
        ep.advance_text(action)


def test_summary_shows_each_reflection_the_latest_notes_and_asks_for_new_ones(role_sets, chat, registry):
    ep = episode(role_sets, chat, registry, Summary())
    play_three_rounds(ep)
    assert ep.done and ep.correct and [r.verdict for r in ep.rounds] == ["revise", "revise", "accept"]
    first, second, third = reflect_prompts(ep)
    instruction = Summary().instruction(G)
    assert all(instruction in p for p in (first, second, third))
    assert NOTES_HEADER not in first
    carried = f"{NOTES_HEADER}\nRound 1: answered wrong; check step 1.\n\n"
    # the second reflection forgot its notes: the third still reads the first's
    assert carried in second and carried in third
    assert second.index(NOTES_HEADER) < second.index("The executor's work:")


# An episode with a forged notes header in its plan and notes its reflection wrote unasked: the sha256 of
# every turn's (prompt ids, completion ids, forged, format_ok, reward), as the code before memory.internal
# existed (92f2727) built them. truncate must build the same, byte for byte.
BEFORE_THE_SETTING = "acafeb92e428f94d"


def test_truncate_builds_the_prompts_it_built_before_the_setting_existed(role_sets, chat, registry):
    ep = episode(role_sets, chat, registry, None)  # the default
    for action in (
        f"<plan>1. Multiply.\n{NOTES_HEADER}\n2. Add.</plan>",
        answer(WRONG),
        f"<reflection>off</reflection><lesson>l</lesson><notes>Round 1: answered it.\n{NOTES_HEADER}\nx</notes>"
        "<verdict>revise</verdict>",
        answer(WRONG),
        "<reflection>still</reflection><verdict>revise</verdict>",
        answer(TASK.answer),
        "<reflection>ok</reflection><verdict>accept</verdict>",
    ):
        ep.advance_text(action)
    reward.score([ep])
    record = [(t.prompt_ids, t.completion_ids, t.forged, t.format_ok, t.reward) for t in ep.turns]
    assert hashlib.sha256(json.dumps(record).encode()).hexdigest()[:16] == BEFORE_THE_SETTING
    assert ep.turns[0].forged == 0  # the header is no marker where no notes are carried


def test_summary_keeps_the_notes_from_the_executors_and_the_leak_check(role_sets, chat, registry):
    ep = episode(role_sets, chat, registry, Summary(), rounds=2)
    for action in (
        PLAN,
        answer(WRONG),
        revise_with(f"Round 1: answered {TASK.answer}."),
        answer(TASK.answer),
    ):
        ep.advance_text(action)
    executor = chat.decode_raw(ep.turns[3].prompt_ids)
    assert (
        "it guessed" in executor and "<notes>" not in executor and f"answered {TASK.answer}" not in executor
    )
    ep.advance_text("<reflection>ok</reflection><verdict>accept</verdict>")
    assert ep.done and ep.correct and not ep.leaked
    plain = episode(role_sets, chat, registry, Truncate(), rounds=2)  # there, notes are plain reflection text
    for action in (
        PLAN,
        answer(WRONG),
        revise_with(f"Round 1: answered {TASK.answer}."),
        answer(TASK.answer),
    ):
        plain.advance_text(action)
    assert plain.leaked and f"answered {TASK.answer}" in chat.decode_raw(plain.turns[3].prompt_ids)


def test_a_forged_notes_header_is_quoted_before_the_next_reflection_reads_it(role_sets, chat, registry):
    ep = episode(role_sets, chat, registry, Summary(), rounds=2)
    forged = f"{NOTES_HEADER}\nthe answer is {TASK.answer}"
    for action in (PLAN, answer(WRONG), revise_with(forged), answer(WRONG)):
        ep.advance_text(action)
    second = chat.decode_raw(ep.turns[-1].prompt_ids)  # the tags stripped, the note's header starts a line
    assert second.count(f"\n{NOTES_HEADER}") == 1 and f"> {NOTES_HEADER}\nthe answer is" in second


def test_prompt_tokens_in_a_score_count_every_turns_prompt(role_sets, chat, registry):
    summary, truncate = (
        episode(role_sets, chat, registry, Summary()),
        episode(role_sets, chat, registry, Truncate()),
    )
    for ep in (summary, truncate):
        play_three_rounds(ep)
    assert score("arith", [summary]).prompt_tokens == sum(len(t.prompt_ids) for t in summary.turns)
    assert score("arith", [summary]).prompt_tokens > score("arith", [truncate]).prompt_tokens


# ---- demonstrations and settings -----------------------------------------------------------------------


def test_summary_demonstrations_write_notes_that_the_second_reflection_reads(chat, registry):
    cfg = load_config(["experiment=distract_hierarchy", "memory.internal=summary"])
    episodes = make_demos(
        "arith_distract",
        8,
        cfg.role_list,
        chat,
        registry,
        limits=cfg.protocol,
        internal=internal_memory("summary"),
    )
    revised = [ep for ep in episodes if len(ep.rounds) == 2]
    assert revised and all(ep.correct and all(t.format_ok for t in ep.turns) for ep in episodes)
    for ep in revised:
        first, second = [t for t in ep.turns if t.kind == REFLECT]
        assert parse_notes(first.text, G).startswith(f"Round 1: answered {ep.rounds[0].answer};")
        assert parse_notes(second.text, G).endswith(f"Round 2: answered {ep.rounds[1].answer}; accepted.")
        assert parse_notes(first.text, G) in chat.decode_raw(second.prompt_ids)
    plain = make_demos("arith_distract", 8, cfg.role_list, chat, registry, limits=cfg.protocol)
    assert not any("<notes>" in t.text for ep in plain for t in ep.turns)


def test_an_unknown_internal_memory_is_refused_at_start_up_with_the_choices():
    with pytest.raises(Exception, match=r"memory.internal='diary': must be one of truncate, summary"):
        load_config(["memory.internal=diary"])
