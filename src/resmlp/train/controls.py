"""Run controls that are not part of a recipe: the step limit of a smoke run (`--max-steps N`), and the stop a
signal asks for (resmlp.train.preemption); both end the run at a step boundary with a resumable state.

The limit counts optimizer steps over the whole run (a resumed run's earlier steps included), as Hugging Face's
`max_steps` does: `--max-steps 20` on a run stopped at step 10 trains 10 more. It is not written into
config.json, so `--resume` alone continues the run to its schedule's end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from resmlp.train import preemption
from resmlp.train.state import STATE_FILE

if TYPE_CHECKING:
    from resmlp.train.view import TrainerView


def at_step_limit(trainer: TrainerView) -> bool:
    """Whether the run has taken the optimizer steps --max-steps allows (never without a limit)."""
    limit = getattr(trainer, "max_steps", None)
    return limit is not None and trainer.global_step >= limit


def should_stop(trainer: TrainerView) -> bool:
    """Whether the run stops at this step boundary: the step limit reached, or a signal received (several
    processes: the boundary every rank agrees on, resmlp.train.preemption)."""
    return at_step_limit(trainer) or preemption.agreed(trainer.global_step) is not None


def stop_early(trainer: TrainerView, save_state: Callable[[], None]) -> dict[str, Any]:
    """Write the resumable state where the step limit or a signal stopped the run (`save_state`: the trainer's
    writer, which every rank calls), say so, and return what the commands print from: no scores (the epoch was
    not finished, nothing was evaluated), and `signal`, its name, where a signal stopped it."""
    state = trainer.out / STATE_FILE
    save_state()
    signal = preemption.agreed(trainer.global_step)  # every rank's: the same on each
    cause = f"by {signal}" if signal else f"at the step limit (--max-steps {trainer.max_steps})"
    if trainer.info.is_main:
        print(f"stopped {cause}: {trainer.global_step} optimizer steps, epoch {trainer.epoch + 1} of "
              f"{trainer.cfg.schedule.epochs} at step {trainer.step_in_epoch} of {trainer.steps_per_epoch}; "
              f"resumable state written to {state}", flush=True)
    return dict(stopped_at_step=trainer.global_step, state=str(state), epochs=trainer.epoch,
                **({"signal": signal} if signal else {}))
