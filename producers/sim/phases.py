"""The training loop's own rhythm: checkpoints, evaluation, slow restarts.

Healthy jobs are not a steady stream of identical iterations, and a
detector that pages on each of these is paged by the job itself:

* **checkpoints** stop the training for seconds every so often: every rank
  at once (a sharded save) or rank 0 alone while the others wait for it in
  the next collective (a rank-0 ``torch.save``);
* **evaluation** runs forward passes only, another mix of ops (no backward,
  no gradient reduction);
* **the first iteration after a pause** is slower (allocator and cache
  warm-up, data loader refill).

GC pauses are ``Noise.gc_pauses_per_min``. All off by default; the
:class:`PhaseClock` decides at each iteration boundary, from the ranks'
own clocks, what the next iteration is, so a seed gives one trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mycroft.errors import ConfigError

CHECKPOINT_RANKS = ("all", "rank0")
"""Who stops for a checkpoint: every rank, or rank 0 alone."""


@dataclass(frozen=True)
class Phases:
    """When the training loop pauses or changes its op mix (0: never).

    Attributes:
        checkpoint_every_s: Seconds between checkpoints.
        checkpoint_s: How long one checkpoint stops its ranks.
        checkpoint_ranks: ``all`` or ``rank0`` (:data:`CHECKPOINT_RANKS`).
        eval_every_s: Seconds between evaluation phases.
        eval_iterations: Forward-only iterations of one evaluation phase.
        resume_slowdown: Compute time multiplier of the first iteration
            after a checkpoint or an evaluation phase (1: none).
    """

    checkpoint_every_s: float = 0.0
    checkpoint_s: float = 3.0
    checkpoint_ranks: str = "all"
    eval_every_s: float = 0.0
    eval_iterations: int = 4
    resume_slowdown: float = 1.0

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the option to change."""
        if min(self.checkpoint_every_s, self.eval_every_s) < 0:
            raise ConfigError("--checkpoint-every and --eval-every must be >= 0 s")
        if self.checkpoint_s <= 0 or self.eval_iterations < 1:
            raise ConfigError("--checkpoint-s must be > 0, --eval-iterations >= 1")
        if self.checkpoint_ranks not in CHECKPOINT_RANKS:
            raise ConfigError(
                f"--checkpoint-ranks {self.checkpoint_ranks!r} is not one of "
                f"{', '.join(CHECKPOINT_RANKS)}"
            )
        if not 1 <= self.resume_slowdown <= 10:  # noqa: PLR2004 - sane range
            raise ConfigError("--resume-slowdown must be in [1, 10]")


class Phase(StrEnum):
    """What the next iteration boundary brings."""

    TRAIN = "train"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"


class PhaseClock:
    """Due times of the next checkpoint and evaluation, in job seconds."""

    def __init__(self, phases: Phases) -> None:
        self.phases = phases
        self.next_checkpoint_s = phases.checkpoint_every_s or float("inf")
        self.next_eval_s = phases.eval_every_s or float("inf")
        self.events: list[tuple[str, float]] = []

    def at(self, now_s: float) -> Phase:
        """The phase due at ``now_s`` (the ranks' iteration boundary);
        a checkpoint first when both are due."""
        if now_s >= self.next_checkpoint_s:
            self.next_checkpoint_s += self.phases.checkpoint_every_s
            self.events.append((Phase.CHECKPOINT.value, now_s))
            return Phase.CHECKPOINT
        if now_s >= self.next_eval_s:
            self.next_eval_s += self.phases.eval_every_s
            self.events.append((Phase.EVAL.value, now_s))
            return Phase.EVAL
        return Phase.TRAIN
