"""The registry of pipeline schedules: one :class:`ScheduleInfo` per name.

A schedule is one module of :mod:`llmsim.schedules` with a function ``(stages p,
micro-batches m, chunks v)`` → per stage the ordered :class:`Action` list, decorated
with :func:`register`, which records beside it what the rest of llmsim needs to know:
whether its backward is split (B sent before W), the route of its micro-batches through
the stages (:mod:`llmsim.schedules.route`), its peak in-flight activations (the memory
model's term) and its bubble closed form (the tests check it against the reference
timing). Adding a schedule is one module plus its import in ``__init__``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmsim.errors import UserError
from llmsim.schedules.action import Action
from llmsim.schedules.route import Route, looping
from llmsim.schedules.walk import Rows


class Schedule(list[list[Action]]):
    """Per stage, the ordered actions that stage runs; ``route`` is the micro-batches'
    path through the (stage, chunk) pairs (looping unless the schedule says otherwise)."""

    route: Route | None = None


ScheduleFn = Callable[[int, int, int], list[list[Action]]]
"""``(stages, microbatches, chunks) → per-stage actions``; raises UserError on a bad
combination."""
PairsFn = Callable[[list[Action]], list[tuple[int, int]]]
"""A stage's actions → the (forward, backward) index pairs it runs overlapped."""
PeakFn = Callable[[int, int, int, int], int]
"""``(p, stage i, m, v)`` → forward passes (chunk-micro-batches) held at the peak."""
WalkedFn = Callable[[int, int, int], tuple[list[list[Action]], Rows]]
"""``(stages, microbatches, chunks) → (per-stage actions, their wait graph's rows)``, the
rows made as the order is built (:func:`~llmsim.schedules.orders.greedy_order`)."""
BubbleFn = Callable[[int, int, int, float, float, float], float]
"""``(p, m, v, t_F, t_B, t_W)`` → idle time of a stage (pass times of a whole stage)."""


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One registered schedule: its action order and its closed forms."""

    name: str
    order: ScheduleFn
    """The per-stage action lists."""
    peak_forwards: PeakFn
    """Forward passes whose activations stage i holds at its peak (chunk-micro-batches)."""
    bubble: BubbleFn
    """Idle time of a stage in the reference timing, under the conditions its module
    states (``docs/schedules.md``)."""
    split_backward: bool = False
    """Whether B and W are separate passes, the input gradient sent right after B."""
    route: Callable[[int, int, int], Route] | None = None
    """``(p, m, v)`` → the micro-batches' route; None: looping (c·p + s)."""
    weight_versions: Callable[[int, int, int], int] = lambda p, i, m: 1
    """``(p, stage i, m)`` → versions of the stage's weights it holds (PipeDream's
    stash); one for the others (Chimera's second stage is :attr:`pipelines`')."""
    replayed: bool = True
    """Whether the engine replays it (``parallelism.schedule`` accepts it)."""
    pipelines: int = 1
    """Whole pipelines sharing the stages, each with its own replica of the weights:
    2 for Chimera's down and up pipelines, whose chunk ``c`` of stage ``s`` is chunk
    ``c mod v`` of pipeline ``c // v``; 1 for the others."""
    overlapped_pairs: PairsFn | None = None
    """A stage's actions → the indices (i, j) of a forward and a backward of another
    chunk that the schedule runs as one overlapped pair, each one's all-to-alls beside
    the other's computation (DualPipe's "F&B"; the engine prices them so with
    ``parallelism.moe_a2a_overlap``, :mod:`llmsim.engine.pairs`); None: no pairs."""
    walked: WalkedFn | None = None
    """The same order with its wait graph's rows (:data:`WalkedFn`), for the walks of the
    search (:func:`walked`); None: the rows are found from the order
    (:func:`~llmsim.schedules.walk.wait_graph`)."""

    def __call__(self, stages: int, microbatches: int, chunks: int) -> list[list[Action]]:
        return self.order(stages, microbatches, chunks)

    def route_of(self, stages: int, microbatches: int, chunks: int) -> Route:
        """The route of this schedule's micro-batches."""
        if self.route is None:
            return looping(stages, chunks)
        return self.route(stages, microbatches, chunks)


SCHEDULES: dict[str, ScheduleInfo] = {}
"""Registered schedules by name."""
SPLIT_BACKWARD: set[str] = set()
"""Schedules whose B and W are separate passes: the input gradient is sent to the previous
stage right after B. The others run B and W as one fused backward (PyTorch autograd), so
the gradient leaves the stage only after W."""


def register(name: str, *, peak_forwards: PeakFn, bubble: BubbleFn,
             split_backward: bool = False,
             route: Callable[[int, int, int], Route] | None = None,
             weight_versions: Callable[[int, int, int], int] = lambda p, i, m: 1,
             replayed: bool = True,
             pipelines: int = 1,
             overlapped_pairs: PairsFn | None = None,
             walked: WalkedFn | None = None) -> Callable[[ScheduleFn], ScheduleFn]:
    """Decorator: ``@register("1f1b", peak_forwards=…, bubble=…)`` adds the function below
    it to :data:`SCHEDULES` with its closed forms (the fields of :class:`ScheduleInfo`)."""

    def decorator(fn: ScheduleFn) -> ScheduleFn:
        if name in SCHEDULES:
            raise ValueError(f"schedule {name!r} is registered twice")
        SCHEDULES[name] = ScheduleInfo(name, fn, peak_forwards, bubble, split_backward,
                                       route, weight_versions, replayed, pipelines,
                                       overlapped_pairs, walked)
        if split_backward:
            SPLIT_BACKWARD.add(name)
        return fn

    return decorator


def _checked(name: str, stages: int, microbatches: int, chunks: int) -> ScheduleInfo:
    """The registry entry of ``name``; UserError on an unknown name or a bad count."""
    if name not in SCHEDULES:
        raise UserError(
            f"schedule: unknown name {name!r}; use one of {', '.join(sorted(SCHEDULES))}"
        )
    for field, value in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{field}: {value!r} is not allowed; give a whole number ≥ 1")
    return SCHEDULES[name]


def build(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The per-stage action lists of schedule ``name``; UserError on invalid input."""
    info = _checked(name, stages, microbatches, chunks)
    return _with_route(info, info.order(stages, microbatches, chunks), stages, microbatches,
                       chunks)


def _with_route(info: ScheduleInfo, order: list[list[Action]], stages: int,
                microbatches: int, chunks: int) -> Schedule:
    schedule = Schedule(order)
    if info.route is not None:
        schedule.route = info.route(stages, microbatches, chunks)
    return schedule


def walked(name: str, stages: int, microbatches: int,
           chunks: int = 1) -> tuple[Schedule, Rows | None]:
    """(:func:`build`'s order, its wait graph's rows where the schedule makes them as it
    builds the order (:attr:`ScheduleInfo.walked`), else None); UserError as :func:`build`."""
    info = _checked(name, stages, microbatches, chunks)
    if info.walked is None:
        order, rows = info.order(stages, microbatches, chunks), None
    else:
        order, rows = info.walked(stages, microbatches, chunks)
    return _with_route(info, order, stages, microbatches, chunks), rows


def placement(name: str, stages: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """Virtual stage → (stage, chunk) of a schedule whose chunks are not placed at
    ``c·p + s`` (its route, the same for every micro-batch of a replayed schedule);
    empty for the looping placement."""
    info = SCHEDULES[name]
    if info.route is None:
        return ()
    return tuple(info.route(stages, 1, chunks)(0))


def route_of(schedule: list[list[Action]]) -> Route:
    """A schedule's route: its own (:class:`Schedule`), else looping over its chunks."""
    route = getattr(schedule, "route", None)
    if route is not None:
        return route
    chunks = 1 + max((a.chunk for row in schedule for a in row), default=0)
    return looping(len(schedule), chunks)
