"""llmsim: a discrete-event simulator of distributed LLM training on supercomputers.

>>> import llmsim
>>> result = llmsim.simulate(llmsim.load_scenario("frontier"))  # doctest: +SKIP
>>> result.step_time_s, result.mfu, result.days_to_train  # doctest: +SKIP
"""

from llmsim.errors import UserError
from llmsim.loader import load_scenario, load_spec
from llmsim.result import Result
from llmsim.simulation import simulate

__all__ = ["Result", "UserError", "load_scenario", "load_spec", "search", "simulate", "sweep"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``llmsim.search`` (the layout search, a callable package) and ``llmsim.sweep`` (a
    grid of simulations, :func:`llmsim.sweeps.sweep`) are imported when first used."""
    import importlib

    if name == "search":
        return importlib.import_module("llmsim.search")
    if name == "sweep":
        function = importlib.import_module("llmsim.sweeps").sweep
        globals()["sweep"] = function
        return function
    raise AttributeError(f"module 'llmsim' has no attribute {name!r}")
