"""Reporting: the results store as a person reads it. The paper's tables and figures from the rows
(:mod:`.paper_tables`, :mod:`.paper_figures`, their settings :mod:`.paper_settings` and the cells'
choice of runs :mod:`.cells`; ``make paper-tables``, :mod:`.render_paper`) and any sweep's report
(``make report``, :mod:`.report`)."""

from replaceme_exp.reporting import paper_figures, paper_tables  # noqa: F401,E402  (register every table and figure)
