"""The paper's sweeps (``paper/<table>.yaml``), the studies beyond it (``study/``) and the comparisons of
methods (``methods/``), found by Hydra through ``pkg://replaceme_exp.multirun_templates``:
``+paper=<name>`` resolves from the installed package from any working directory, and a
``multirun_templates/`` folder in the working directory cannot replace a template."""
