"""llmsim: a discrete-event simulator of distributed LLM training on supercomputers.

>>> import llmsim
>>> result = llmsim.simulate(llmsim.load_scenario("frontier"))  # doctest: +SKIP
>>> result.step_time_s, result.mfu, result.days_to_train  # doctest: +SKIP
"""

from llmsim.errors import UserError
from llmsim.loader import load_scenario, load_spec
from llmsim.result import Result
from llmsim.simulation import simulate

__all__ = ["Result", "UserError", "load_scenario", "load_spec", "search", "simulate"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``llmsim.search`` (the layout search, a callable package) is imported when first
    used."""
    if name == "search":
        import importlib

        return importlib.import_module("llmsim.search")
    raise AttributeError(f"module 'llmsim' has no attribute {name!r}")
