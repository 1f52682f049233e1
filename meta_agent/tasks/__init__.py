"""Tasks: the questions agents solve, where they come from, and how answers are checked.

from meta_agent.tasks import load_tasks, grade
tasks = load_tasks("gsm8k", "test", limit=10)
grade("\\boxed{18}", tasks[0].answer)   # True
"""

from meta_agent.tasks.arith import make_arith_tasks
from meta_agent.tasks.datasets import KNOWN_TASKS, load_tasks, next_tasks
from meta_agent.tasks.grading import GRADERS, extract_gsm8k_answer, grade, grade_task
from meta_agent.tasks.types import Task

__all__ = [
    "GRADERS",
    "KNOWN_TASKS",
    "Task",
    "extract_gsm8k_answer",
    "grade",
    "grade_task",
    "load_tasks",
    "make_arith_tasks",
    "next_tasks",
]
