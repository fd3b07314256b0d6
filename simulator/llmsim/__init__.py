"""llmsim: a discrete-event simulator of distributed LLM training on supercomputers.

>>> import llmsim
>>> result = llmsim.simulate(llmsim.load_scenario("frontier"))  # doctest: +SKIP
>>> result.step_time_s, result.mfu, result.days_to_train  # doctest: +SKIP

The names below are imported on first use (PEP 562), so that ``import llmsim`` and the
command line start without loading the specs, the cost models and their libraries.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from llmsim.errors import UserError

if TYPE_CHECKING:
    from llmsim.loader import load_scenario, load_spec
    from llmsim.result import Result
    from llmsim.simulation import simulate

__all__ = ["Result", "UserError", "load_scenario", "load_spec", "search", "simulate", "sweep"]
__version__ = "0.1.0"

_LAZY = {"load_scenario": "llmsim.loader", "load_spec": "llmsim.loader",
         "Result": "llmsim.result", "simulate": "llmsim.simulation",
         "sweep": "llmsim.sweeps"}
"""Public name → the module that defines it."""


def __getattr__(name: str) -> Any:
    if name == "search":  # the layout search: a package that can be called
        return import_module("llmsim.search")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'llmsim' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
