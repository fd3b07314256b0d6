"""From step time to the calendar: failures, checkpoints, the spread of a whole run and
its energy (design §13). Functions of a :class:`~llmsim.result.Result` and the specs; the
engine knows nothing of them.

* :mod:`~llmsim.calendar.failures` — a job's interruption rate from its size;
* :mod:`~llmsim.calendar.checkpoint` — checkpoint size and time, Young/Daly interval;
* :mod:`~llmsim.calendar.montecarlo` — expected wall time and a seeded Monte Carlo;
* :mod:`~llmsim.calendar.energy` — energy per step and per run, CO₂ and cost;
* :mod:`~llmsim.calendar.summary` — all of it for one result (:func:`summarize`);
* :mod:`~llmsim.calendar.stragglers` — an analytical straggler estimate (not in the
  engine, and not in the summary).
"""

from llmsim.calendar.summary import CalendarSummary, summarize

__all__ = ["CalendarSummary", "summarize"]
