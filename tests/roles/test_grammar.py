from roles import (
    Grammar,
    apply_fix,
    parse_executor,
    parse_fix,
    parse_plan,
    parse_reflection,
    plan_steps,
    recover_answer,
    states_answer,
    step_texts,
)

G = Grammar()


def test_tool_call_segment_is_a_call():
    seg = 'First multiply. <tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>'
    step = parse_executor(seg, G, final=False)
    assert step.tool_call == '{"name": "calculator", "arguments": {"expression": "3*4"}}'
    assert step.answer is None


def test_close_tag_without_open_tag_passes_whole_segment_as_bad_call_body():
    step = parse_executor("calculator 3*4</tool_call>", G, final=False)
    assert step.tool_call == "calculator 3*4"


def test_tagged_answer_keeps_format():
    step = parse_executor("So the total is <answer> 1,234 </answer>", G, final=False)
    assert (step.answer, step.answer_tagged, step.tool_call) == ("1,234", True, None)


def test_untagged_answer_recovered_only_when_final():
    assert parse_executor("the result is 42", G, final=False).answer is None
    step = parse_executor("the result is 42.", G, final=True)
    assert (step.answer, step.answer_tagged) == ("42", False)


def test_unclosed_answer_at_end_is_recovered_but_not_tagged():
    step = parse_executor("<answer>17", G, final=True)
    assert (step.answer, step.answer_tagged) == ("17", False)


def test_recover_answer_prefers_boxed():
    assert recover_answer(r"we get 3 then \boxed{\frac{1}{2}} and 7") == r"\frac{1}{2}"
    assert recover_answer("no numbers here") is None
    assert recover_answer("costs -3,500.25 dollars") == "-3,500.25"


def test_plan_tagged_and_untagged():
    assert parse_plan("<plan>1. add 2. multiply</plan>", G) == ("1. add 2. multiply", True)
    assert parse_plan("just add them", G) == ("just add them", False)
    assert parse_plan("   ", G) == (None, False)
    # Out of tokens before the closing tag: the plan still goes to the executor, the format is broken.
    assert parse_plan("<plan>1. add 2. multiply the", G) == ("1. add 2. multiply the", False)


def test_reflection_accepts_by_default_and_revises_with_a_plan():
    out = parse_reflection(
        "<reflection>fine</reflection><lesson>use the tool</lesson><verdict>accept</verdict>", G
    )
    assert (out.reflection, out.lesson, out.verdict, out.plan) == ("fine", "use the tool", "accept", None)
    out = parse_reflection("<reflection>wrong sum</reflection><plan>redo step 2</plan>", G)
    assert (out.verdict, out.plan) == ("revise", "redo step 2")
    out = parse_reflection("rambling without tags", G)
    assert (out.verdict, out.reflection, out.lesson) == ("accept", "rambling without tags", None)
    assert parse_reflection("<verdict>revise</verdict>", G).verdict == "revise"
    cut = parse_reflection("<reflection>fine</reflection><lesson>use the calculator's calculator's", G)
    assert (cut.reflection, cut.lesson, cut.verdict) == ("fine", None, "accept")


def test_a_fix_revises_one_step():
    out = parse_reflection(
        '<reflection>step 2</reflection><lesson>read</lesson><fix step="2">Subtract 5.</fix>', G
    )
    assert (out.verdict, out.plan, out.fix) == ("revise", None, (2, "Subtract 5."))
    assert parse_fix("<fix step=3>2. Add 4.</fix>", G) == (3, "Add 4.")  # unquoted, its own number dropped
    assert parse_fix('<fix step="1">Add 5. Then take 2 - 1.</fix>', G) == (1, "Add 5. Then take 2 - 1.")
    assert parse_fix('<fix step="2">cut off', G) is None  # out of tokens: no fix
    assert parse_fix("<fix>no step</fix>", G) is None
    assert parse_fix('<fix step="2"> </fix>', G) is None
    # A whole plan wins over a fix; an unusable fix leaves a rambling reflection accepting.
    both = parse_reflection('<fix step="1">Add 1.</fix><plan>redo</plan>', G)
    assert (both.plan, both.fix) == ("redo", None)
    assert parse_reflection('<reflection>x</reflection><fix step="">Add</fix>', G).verdict == "accept"
    assert G.fix[1] in G.reflect_stops()


def test_apply_fix_rewrites_or_adds_a_step_as_the_plan_numbers_them():
    plan = "1. Multiply 4 by 5.\n2. Add 1,660.\n3. Divide by 892."
    assert (
        apply_fix(plan, 2, "Subtract 1,660.") == "1. Multiply 4 by 5.\n2. Subtract 1,660.\n3. Divide by 892."
    )
    assert apply_fix(plan, 4, "Leave out 7.") == plan + "\n4. Leave out 7."
    assert apply_fix(plan, 5, "x") is None and apply_fix(plan, 0, "x") is None
    assert apply_fix("Work it out:\n- a\n- b", 3, "c") == "Work it out:\n- a\n- b\n- c"
    assert apply_fix("Work it out:\n- a\n- b", 1, "z") == "Work it out:\n- z\n- b"
    assert apply_fix("free text", 1, "new") == "new" and apply_fix("free text", 2, "x") is None
    assert apply_fix(None, 1, "new") == "new"
    assert plan_steps(plan) == 3 and plan_steps("free text") == 0 and plan_steps("3.5 kg\n2023 was") == 0
    assert apply_fix("• a\n• b", 3, "c") == "• a\n• b\n• c"  # a "•" bullet is a step too


def test_step_texts_are_the_steps_without_their_marks():
    assert step_texts("Work:\n1. Multiply 4 by 5.\n2) Add 3.\n- Divide by 2.\n• Answer.") == [
        "Multiply 4 by 5.",
        "Add 3.",
        "Divide by 2.",
        "Answer.",
    ]
    assert step_texts("free text 2. with a number inside") == [] and step_texts(None) == []


def test_states_answer():
    assert states_answer("<plan>the answer is 1,234</plan>", "1234", G)
    assert states_answer("<answer>5</answer>", None, G)
    assert not states_answer("<plan>multiply 12 by 3 then subtract</plan>", "33", G)
    assert not states_answer("step 12", "1", G)  # a digit inside another number is no leak


def test_step_numbers_and_the_questions_own_numbers_are_no_leak():
    plan = "<plan>\n1. Add the apples.\n2. Subtract 3 eaten ones.\n3. Answer.</plan>"
    assert not states_answer(plan, "2", G)  # "2." is a step number
    assert not states_answer(plan, "3", G, question="Tom has 5 apples and eats 3.")
    assert states_answer(plan, "3", G, question="Tom has 5 apples and eats 2.")
