"""Patch 0019: the prefetch bookkeeping kernel (`note_prefetch` in expert_offload_kernels.py), one program a layer
a staged step: count the prefetch hits and staged picks, judge the guess the step was given, guess the next step.

CPU tests (CI): the torch reference against the contract spelt out here with Python sets and loops, step after
step with the state carried, and the Triton kernel in Triton's interpreter against the reference, every state
tensor bit for bit. GPU tests (marker gpu): the compiled kernel against the reference, eager and in a CUDA graph.
The break-evens are dyadic (0.25, 0.5, 0.75), so the contract's float64 and the kernel's float32 shares agree
exactly over these short runs.
"""

from __future__ import annotations

import random

import pytest
import torch


DECAY = 0.5
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Contract:
    """The bookkeeping of one layer in plain Python: what every implementation must do."""

    def __init__(self, slots: int, cached: dict[int, int], n_experts: int, n_cache: int) -> None:
        self.slots, self.cached, self.n_experts, self.n_cache = slots, cached, n_experts, n_cache
        self.guess: list[int] = []
        self.on = True
        self.used = self.guessed = 0.0
        self.hits = self.staged = self.off = 0

    def step(self, picks: list[int], remapped: list[int] | None, staging_start: int, judge: bool,
             break_even: float, given: list[int] | None = None) -> None:
        if given is None:
            assert remapped is not None
            self.hits += sum(self.n_cache <= r < staging_start for r in remapped)
            self.staged += sum(r >= staging_start for r in remapped)
            if judge:
                self.off += not self.on
                self.used = DECAY * self.used + len(set(self.guess) & set(picks))
                self.guessed = DECAY * self.guessed + len(self.guess)
                self.on = self.used >= break_even * self.guessed
            chosen = {e for e in picks if 0 <= e < self.n_experts and e not in self.cached}
        else:
            chosen = set(given)
        self.guess = sorted(chosen)[:self.slots]

    def expected(self) -> dict[str, list]:
        guess = self.guess + [-1] * (self.slots - len(self.guess))
        predicted = guess if self.on else [-1] * self.slots
        slot_map = [self.cached.get(e, -1) for e in range(self.n_experts)]
        if self.on:
            for i, e in enumerate(self.guess):
                slot_map[e] = self.n_cache + i
        return {"guess": guess, "guess_count": [len(self.guess)], "predicted": predicted,
                "predicted_count": [len(self.guess) if self.on else 0], "slot_map": slot_map,
                "counts": [self.hits, self.staged, self.off], "shares": [self.used, self.guessed], "on": [self.on]}


def new_state(ko, slots: int, slot_of_expert: torch.Tensor) -> tuple[torch.Tensor, ...]:
    device, n_experts = slot_of_expert.device, slot_of_expert.numel()

    def ints(n: int, fill: int) -> torch.Tensor:
        return torch.full((n,), fill, dtype=torch.int32, device=device)
    return (ints(slots, -1), ints(1, 0), ints(slots, -1), ints(1, 0), slot_of_expert.clone(),
            torch.zeros(3, dtype=torch.int64, device=device), torch.zeros(2, dtype=torch.float32, device=device),
            torch.ones(1, dtype=torch.bool, device=device), ints(n_experts, 0))


def case(seed: int, n_experts: int, n_cache: int, slots: int, tokens: int, top_k: int, steps: int):
    """A layer's cache and a run of steps: the picks (repeating part of the step before, as decode routing does, with
    an out-of-range id now and then), the slots they were served from, and a given guess every third step."""
    rng = random.Random(seed)
    hot = rng.sample(range(n_experts), n_cache)
    cached = {e: i for i, e in enumerate(hot)}
    staging_start = n_cache + slots
    run, previous = [], []
    for step in range(steps):
        picks = [rng.choice(previous) if previous and rng.random() < 0.5 else rng.randrange(n_experts)
                 for _ in range(tokens * top_k)]
        if step % 4 == 3:
            picks[0] = -1
        previous = picks
        remapped = [rng.choice([rng.randrange(n_cache), rng.randrange(n_cache, staging_start),
                                staging_start + rng.randrange(4)]) for _ in picks]
        given = sorted(rng.sample(sorted(set(range(n_experts)) - set(hot)), rng.randrange(slots + 1))) \
            if step % 3 == 2 else None
        run.append((picks, remapped, given, tokens, top_k))
    return cached, staging_start, run


CASES = {  # (seed, experts, cache, prefetch slots, tokens, top_k, steps)
    "batch1": (1, 64, 16, 4, 1, 8, 10),
    "batch4_few_slots": (2, 64, 16, 2, 4, 8, 10),  # more uncached picks than slots: the guess keeps the first
    "many_slots": (3, 48, 8, 16, 2, 4, 12),
    "odd_sizes": (4, 37, 5, 3, 3, 5, 9),
}


def run_case(ko, name: str, break_even: float, judge: bool, device: str = "cpu", use_triton: bool | None = None,
             graph: bool = False):
    """Every step's state after `note_prefetch` (a list of dicts of lists), and the contract's."""
    seed, n_experts, n_cache, slots, _, _, steps = CASES[name]
    cached, staging_start, run = case(*CASES[name])
    slot_of_expert = torch.tensor([cached.get(e, -1) for e in range(n_experts)], dtype=torch.int32, device=device)
    state = new_state(ko, slots, slot_of_expert)
    contract = Contract(slots, cached, n_experts, n_cache)
    got, want = [], []
    for picks, remapped, given, tokens, top_k in run:
        ids = torch.tensor(picks, dtype=torch.int32, device=device).view(tokens, top_k)
        slots_used = torch.tensor(remapped, dtype=torch.int32, device=device).view(tokens, top_k)
        listed = None
        if given is not None:
            padded = given + [-1] * (slots - len(given))
            listed = (torch.tensor(padded, dtype=torch.int32, device=device),
                      torch.tensor([len(given)], dtype=torch.int32, device=device))
        ko.note_prefetch(None if listed else ids, None if listed else slots_used, listed, slot_of_expert, state,
                         n_cache, staging_start, judge, break_even, DECAY, use_triton=use_triton)
        contract.step(picks, remapped, staging_start, judge, break_even, given)
        got.append({k: t.cpu().tolist() for k, t in zip(ko.PREFETCH_STATE, state) if k != "scratch"})
        want.append(contract.expected())
    return got, want


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("break_even,judge", [(0.0, False), (0.5, True), (0.25, True), (0.75, True)])
def test_reference_keeps_the_contract(ko, name: str, break_even: float, judge: bool) -> None:
    got, want = run_case(ko, name, break_even, judge)
    for step, (g, w) in enumerate(zip(got, want)):
        assert g == w, (name, step)


def test_the_cases_turn_the_switch_off_and_on_and_overflow_the_slots(ko) -> None:
    """The cases reach what the kernel must get right: the switch off and then on again, and a guess cut to the
    slots (the count a judged guess adds is the guess's length, not the step's uncached picks)."""
    _, want = run_case(ko, "odd_sizes", 0.5, True)
    ons = [w["on"][0] for w in want]
    assert False in ons and True in ons[ons.index(False):]
    cached, _, run = case(*CASES["batch4_few_slots"])
    assert any(len({e for e in picks if e >= 0} - set(cached)) > CASES["batch4_few_slots"][3]
               for picks, *_ in run)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("break_even,judge", [(0.0, False), (0.5, True), (0.3, True)])
def test_triton_interpreted_matches_reference(ko, name: str, break_even: float, judge: bool, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    got, _ = run_case(ko, name, break_even, judge, use_triton=True)
    monkeypatch.delenv("TRITON_INTERPRET")
    want, _ = run_case(ko, name, break_even, judge, use_triton=False)
    assert got == want


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("name", CASES)
def test_gpu_kernel_matches_reference(kn, name: str) -> None:
    for break_even, judge in ((0.0, False), (0.3, True)):
        got, _ = run_case(kn, name, break_even, judge, device="cuda")
        want, _ = run_case(kn, name, break_even, judge, device="cpu")
        assert got == want, (name, break_even)


@pytest.mark.gpu
@cuda
def test_gpu_kernel_replays_in_a_cuda_graph(kn) -> None:
    """Captured once with the step's inputs as static tensors, replayed over the run: the state equals the
    reference's step after step."""
    seed, n_experts, n_cache, slots, tokens, top_k, _ = CASES["batch1"]
    cached, staging_start, run = case(*CASES["batch1"])
    slot_cpu = torch.tensor([cached.get(e, -1) for e in range(n_experts)], dtype=torch.int32)
    slot_gpu = slot_cpu.cuda()
    ref, gpu = new_state(kn, slots, slot_cpu), new_state(kn, slots, slot_gpu)
    ids = torch.full((tokens, top_k), -1, dtype=torch.int32, device="cuda")
    used = torch.full((tokens, top_k), -1, dtype=torch.int32, device="cuda")
    kn.note_prefetch(ids, used, None, slot_gpu, new_state(kn, slots, slot_gpu), n_cache, staging_start, True, 0.3,
                     DECAY)  # warm-up outside the capture (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kn.note_prefetch(ids, used, None, slot_gpu, gpu, n_cache, staging_start, True, 0.3, DECAY)
    for step, (picks, remapped, _, _, _) in enumerate(run):
        p = torch.tensor(picks, dtype=torch.int32).view(tokens, top_k)
        r = torch.tensor(remapped, dtype=torch.int32).view(tokens, top_k)
        ids.copy_(p), used.copy_(r)
        graph.replay()
        kn.note_prefetch(p, r, None, slot_cpu, ref, n_cache, staging_start, True, 0.3, DECAY)
        for key, a, b in zip(kn.PREFETCH_STATE, gpu, ref):
            if key != "scratch":
                assert torch.equal(a.cpu(), b), (step, key)
