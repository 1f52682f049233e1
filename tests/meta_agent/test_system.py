"""System.close() releases what a run holds: the backend's engine as well as the memory."""

from __future__ import annotations

from meta_agent.system import System


class Closable:
    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_close_closes_the_backend_and_the_memory():
    backend, memory = Closable(), Closable()
    System(None, backend, None, [], None, memory, None).close()
    assert (backend.closed, memory.closed) == (1, 1)


def test_close_takes_a_backend_without_close():
    System(None, object(), None, [], None, None, None).close()  # hf: nothing to release
