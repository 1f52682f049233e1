"""System: close() releases what a run holds (the backend's engine as well as the memory); a memory that is
off loads no embedder."""

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


def test_a_memory_that_is_off_loads_no_embedder(tiny_model_dir, monkeypatch):
    """memory.enabled=false (the default experiment's): no sentence model is loaded for a memory that is
    never searched; on, it is."""
    import meta_agent.system
    from meta_agent.config import load_config
    from meta_agent.system import build_system

    loaded = []

    class Embedder:
        dim = 4  # what the store reads at its creation; nothing is embedded here

        def __init__(self) -> None:
            loaded.append(self)

    monkeypatch.setattr(meta_agent.system, "SentenceEmbedder", Embedder)
    off = build_system(load_config([f"model.path={tiny_model_dir}", "memory.enabled=false"]))
    assert off.memory is None and loaded == []
    on = build_system(load_config([f"model.path={tiny_model_dir}", "memory.path=null"]), off.backbone)
    assert on.memory is not None and len(loaded) == 1
