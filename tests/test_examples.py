"""The README's runnable examples of "Your own task" (examples/): a file and a task class, from config."""

from __future__ import annotations

from meta_agent.config import load_config
from meta_agent.tasks import grade_task

FILE = "+custom_tasks.capitals={path:examples/capitals.jsonl,question:prompt,answer:city,grader:exact,test_share:0.2}"
LOADER = "+custom_tasks.minutes={loader:examples.unit_tasks:load}"


def test_the_readme_file_and_loader_tasks_load_with_disjoint_splits_and_their_graders():
    cfg = load_config([FILE, LOADER])
    for name, sizes in (("capitals", (38, 12)), ("minutes", (1067, 290))):
        train, test = cfg.tasks(name, "train", None), cfg.tasks(name, "test", None)
        assert (len(train), len(test)) == sizes
        assert not {t.question for t in train} & {t.question for t in test}
    [belgium] = [t for t in cfg.tasks("capitals", "test", None) if "Belgium" in t.question]
    assert grade_task(" Brussels ", belgium) and not grade_task("Antwerp", belgium)
    first = cfg.tasks("minutes", "test", 1)[0]
    assert first.question == "How many minutes are in 22 hours and 41 minutes?"
    assert grade_task("It is 1361 minutes.", first) and not grade_task("1360", first)
    assert cfg.tasks("minutes", "test", 3) == load_config([LOADER, "seed=0"]).tasks("minutes", "test", 3)
